"""Write the project's held-out Countdown tiers (fixed seeds; run once, committed in the package).

    python experiments/make_countdown_tiers.py                     # into runs/countdown_tiers/ (to compare)
    python experiments/make_countdown_tiers.py --write-committed   # rewrite the shipped tiers in dlmsearch/data/

Each tier has distinct number sets (triples; four numbers in the ``*4`` tiers), none shared with
another tier or with d1's split, and the training scripts exclude every set of every shipped tier.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from outputs import RUNS, add_flag, resolve

from dlmsearch.tasks.countdown import TIERS, load_countdown, shipped_countdown_path
from dlmsearch.tasks.countdown_problems import draw_tier, triples_in, write_tier

# tier -> (seed, count, low, high, numbers per problem)
RECIPES = {
    "validation": (100, 128, 1, 20, 3),
    "small": (101, 256, 1, 20, 3),
    "medium": (102, 256, 1, 50, 3),
    "large": (103, 256, 1, 100, 3),
    "validation4": (110, 128, 1, 20, 4),  # four numbers, answers of three steps: where decoding order matters
    "small4": (111, 256, 1, 20, 4),
    "medium4": (112, 256, 1, 50, 4),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the folder to write the tiers' files into (default runs/countdown_tiers/)",
    )
    add_flag(parser, "tiers shipped in dlmsearch/data/countdown/")
    args = parser.parse_args(argv)
    out = resolve(parser, args, args.out, shipped_countdown_path("small").parent, RUNS / "countdown_tiers")
    args.out = out
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    taken = triples_in([p for _, p in load_countdown(shipped_countdown_path("d1"))])
    for tier, (seed, count, low, high, numbers) in RECIPES.items():
        problems = draw_tier(seed, count, low, high, excluded=taken, numbers=numbers)
        taken |= triples_in(problems)
        write_tier(out / TIERS[tier][0], problems)
        print(f"{tier}: {len(problems)} problems of {numbers} numbers {low}-{high} -> {out / TIERS[tier][0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
