"""Reading and writing Sudoku puzzle files, and the held-out tiers shipped with the package.

Two common formats are read: one 81-character line per puzzle (``0`` or ``.`` for blanks), and
CSV ``puzzle,solution`` (a header line is allowed). A bad line fails with its line number.
"""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path

import attrs
import numpy as np

from dlmsearch.tasks.sudoku_grids import CELLS

TIERS = ("easy", "hard")


@attrs.frozen
class SudokuPuzzle:
    """One puzzle (``0`` = blank) and, where the file gives it, its solution."""

    id: str
    puzzle: np.ndarray = attrs.field(eq=False)
    solution: np.ndarray | None = attrs.field(default=None, eq=False)


class PuzzleFileError(ValueError):
    """A puzzle file that cannot be read; the message names the file and line."""


def _parse_grid(text: str, path: Path, line_number: int, what: str) -> np.ndarray:
    text = text.strip().replace(".", "0")
    if len(text) != CELLS or not (text.isascii() and text.isdigit()):
        raise PuzzleFileError(
            f"{path}:{line_number}: {what} must be {CELLS} characters of 0-9 or '.', got {text[:90]!r} ({len(text)} characters)"
        )
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int8) - ord("0")


def load_puzzles(path: str | Path) -> list[SudokuPuzzle]:
    """Read puzzles from a line file or a ``puzzle,solution`` CSV file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"puzzle file not found: {path}")
    puzzles: list[SudokuPuzzle] = []
    seen_content = False
    with path.open(newline="") as handle:
        for line_number, row in enumerate(csv.reader(handle), start=1):
            fields = [field.strip() for field in row]
            if not fields or not any(fields):
                continue
            first_content, seen_content = not seen_content, True
            if first_content and not any(c.isdigit() or c == "." for c in fields[0]):
                continue  # header line such as "puzzle,solution"
            if len(fields) > 2:
                raise PuzzleFileError(f"{path}:{line_number}: expected 'puzzle' or 'puzzle,solution', got {len(fields)} fields")
            puzzle = _parse_grid(fields[0], path, line_number, "puzzle")
            solution = _parse_grid(fields[1], path, line_number, "solution") if len(fields) == 2 else None
            if solution is not None and (solution == 0).any():
                raise PuzzleFileError(f"{path}:{line_number}: solution has blank cells")
            if solution is not None and ((puzzle != 0) & (puzzle != solution)).any():
                raise PuzzleFileError(f"{path}:{line_number}: solution contradicts a clue of the puzzle")
            puzzles.append(SudokuPuzzle(id=f"{path.stem}:{line_number}", puzzle=puzzle, solution=solution))
    if not puzzles:
        raise PuzzleFileError(f"{path}: no puzzles in file")
    return puzzles


def write_puzzles(path: str | Path, puzzles: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Write ``puzzle,solution`` CSV with a header."""
    from dlmsearch.tasks.sudoku_grids import grid_to_string

    lines = ["puzzle,solution"] + [f"{grid_to_string(p)},{grid_to_string(s)}" for p, s in puzzles]
    Path(path).write_text("\n".join(lines) + "\n")


def tier_path(tier: str) -> Path:
    """Path of a shipped held-out tier (``easy`` or ``hard``)."""
    if tier not in TIERS:
        raise ValueError(f"unknown Sudoku tier {tier!r}; available: {', '.join(TIERS)}")
    return Path(str(resources.files("dlmsearch") / "data" / f"sudoku_{tier}.csv"))
