"""Write the project's held-out Countdown tiers into the package (fixed seeds; run once, committed).

    python experiments/make_countdown_tiers.py

Each tier has distinct number triples, none shared with another tier or with d1's split, and
the training script excludes every triple of every shipped tier.
"""

from __future__ import annotations

from dlmsearch.tasks.countdown import TIERS, load_countdown, shipped_countdown_path
from dlmsearch.tasks.countdown_problems import draw_tier, triples_in, write_tier

# tier -> (seed, count, low, high)
RECIPES = {"validation": (100, 128, 1, 20), "small": (101, 256, 1, 20), "medium": (102, 256, 1, 50), "large": (103, 256, 1, 100)}


def main() -> None:
    taken = triples_in([p for _, p in load_countdown(shipped_countdown_path("d1"))])
    for tier, (seed, count, low, high) in RECIPES.items():
        problems = draw_tier(seed, count, low, high, excluded=taken)
        taken |= triples_in(problems)
        write_tier(shipped_countdown_path(tier), problems)
        print(f"{tier}: {len(problems)} problems, numbers {low}-{high} -> {TIERS[tier][0]}")


if __name__ == "__main__":
    main()
