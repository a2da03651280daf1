"""Write the held-out Sudoku tiers shipped in ``dlmsearch/data/``.

The tiers come from solver-made grids of their own seed, never from the training grids, and
the training sampler additionally drops any grid that appears here. Run:

    python experiments/make_sudoku_tiers.py --count 256                     # into runs/sudoku_tiers/ (to compare)
    python experiments/make_sudoku_tiers.py --count 256 --write-committed   # rewrite the shipped tiers in dlmsearch/data/
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from outputs import RUNS, add_flag, resolve
from tqdm import tqdm

from dlmsearch.tasks.sudoku_files import tier_path, write_puzzles
from dlmsearch.tasks.sudoku_grids import carve_puzzle, random_solved_grid, transform_grids

TIER_CLUES = {"easy": (30, 36), "hard": (0, 0)}  # (0, 0): carve to a minimal puzzle


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=256)
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument(
        "--out", type=Path, default=None, help="the folder to write the tiers' files into (default runs/sudoku_tiers/)"
    )
    add_flag(parser, "tiers shipped in dlmsearch/data/")
    args = parser.parse_args(argv)
    out = resolve(parser, args, args.out, tier_path("easy").parent, RUNS / "sudoku_tiers")
    args.out = out
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for offset, (tier, (low, high)) in enumerate(TIER_CLUES.items()):
        rng = np.random.default_rng(args.seed + offset)
        solutions = transform_grids(np.stack([random_solved_grid(rng) for _ in range(args.count)]), rng)
        puzzles = [(carve_puzzle(s, rng, low, high), s) for s in tqdm(solutions, desc=tier)]
        write_puzzles(out / tier_path(tier).name, puzzles)
        clues = [int((p > 0).sum()) for p, _ in puzzles]
        print(
            f"{tier}: {len(puzzles)} puzzles, clues {min(clues)}-{max(clues)} (mean {np.mean(clues):.1f}) -> {out / tier_path(tier).name}"
        )


if __name__ == "__main__":
    main()
