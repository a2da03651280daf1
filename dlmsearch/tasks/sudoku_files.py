"""Reading and writing Sudoku puzzle files, and the held-out tiers shipped with the package.

Two common formats are read: one 81-character line per puzzle (``0`` or ``.`` for blanks), and
CSV ``puzzle,solution`` (a header line is allowed), as UTF-8 text. A bad line (malformed, or
clues that contradict each other) fails with its line number; a binary or non-UTF-8 file fails
naming the file.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np

from dlmsearch.shipped import package_data
from dlmsearch.tasks.sudoku_grids import CELLS, clue_conflict

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


def _decode(data: bytes, path: Path) -> str:
    """The file's text; a binary, UTF-16 or otherwise non-UTF-8 file fails naming the file."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise PuzzleFileError(f"{path}: not a puzzle file: it is UTF-16 text; save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise PuzzleFileError(
            f"{path}: not a puzzle file: binary content (NUL byte at offset {nul}); expected UTF-8 text"
        )
    try:
        return data.decode("utf-8-sig")  # a byte-order mark, as spreadsheet programs write, is dropped
    except UnicodeDecodeError as error:
        raise PuzzleFileError(
            f"{path}: not a puzzle file: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start})"
        ) from None


def _records(text: str, path: Path) -> Iterator[tuple[int, list[str]]]:
    """CSV records with their line numbers; a line the CSV reader rejects fails with its number."""
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise PuzzleFileError(f"{path}:{reader.line_num}: {error}") from None
        yield reader.line_num, row


def load_puzzles(path: str | Path) -> list[SudokuPuzzle]:
    """Read puzzles from a line file or a ``puzzle,solution`` CSV file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"puzzle file not found: {path}")
    text = _decode(path.read_bytes(), path)
    puzzles: list[SudokuPuzzle] = []
    seen_content = False
    for line_number, row in _records(text, path):
        fields = [field.strip() for field in row]
        if not fields or not any(fields):
            continue
        first_content, seen_content = not seen_content, True
        if first_content and not any(c.isdigit() or c == "." for c in fields[0]):
            continue  # header line such as "puzzle,solution"
        if len(fields) > 2:
            raise PuzzleFileError(
                f"{path}:{line_number}: expected 'puzzle' or 'puzzle,solution', got {len(fields)} fields"
            )
        puzzle = _parse_grid(fields[0], path, line_number, "puzzle")
        conflict = clue_conflict(puzzle)
        if conflict:
            raise PuzzleFileError(f"{path}:{line_number}: the puzzle's clues contradict each other: {conflict}")
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
    return package_data(f"sudoku_{tier}.csv")
