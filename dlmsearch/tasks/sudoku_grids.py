"""Sudoku grids and puzzles: a bitmask solver, fast solved-grid sampling, unique-puzzle carving.

Grids are numpy ``int8`` arrays of 81 cells in row-major order, digits 1..9 and 0 for blank.
Solved grids for training are produced in bulk by validity-preserving transformations of a
few solver-made grids, which is orders of magnitude faster than solving from scratch.
"""

from __future__ import annotations

import numpy as np

CELLS = 81
ALL_DIGITS = 0x3FE  # bits 1..9 set

_ROW = np.arange(CELLS) // 9
_COL = np.arange(CELLS) % 9
_BOX = (_ROW // 3) * 3 + _COL // 3
_PEERS: list[tuple[int, ...]] = [
    tuple(j for j in range(CELLS) if j != i and (_ROW[j] == _ROW[i] or _COL[j] == _COL[i] or _BOX[j] == _BOX[i]))
    for i in range(CELLS)
]


def clue_conflict(grid: np.ndarray) -> str | None:
    """The first two equal digits sharing a row, column or box (1-based, e.g. ``digit 5 twice in
    row 1 (r1c1 and r1c4)``), or None when the clues are consistent. Blanks (0) are ignored."""
    grid = np.asarray(grid).reshape(CELLS)
    filled = grid != 0
    for name, unit in (("row", _ROW), ("column", _COL), ("box", _BOX)):
        counts = np.bincount(unit[filled] * 10 + grid[filled], minlength=90)
        if counts.max(initial=0) <= 1:
            continue
        u, digit = divmod(int(np.argmax(counts > 1)), 10)
        first, second = np.flatnonzero((unit == u) & (grid == digit))[:2]
        where = " and ".join(f"r{i // 9 + 1}c{i % 9 + 1}" for i in (first, second))
        return f"digit {digit} twice in {name} {u + 1} ({where})"
    return None


def _unit_masks(cells: list[int]) -> tuple[list[int], list[int], list[int]] | None:
    """Each row's, column's and box's placed digits as bitmasks, or None when two clues clash (no solution)."""
    rows = [0] * 9
    cols = [0] * 9
    boxes = [0] * 9
    for i, v in enumerate(cells):
        if v:
            bit = 1 << v
            r, c, b = _ROW[i], _COL[i], _BOX[i]
            if (rows[r] | cols[c] | boxes[b]) & bit:
                return None
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    return rows, cols, boxes


def _most_constrained(
    cells: list[int], empty: list[int], rows: list[int], cols: list[int], boxes: list[int]
) -> tuple[int, int, int]:
    """The blank cell with the fewest candidates (branching there keeps the search small), its candidate
    bitmask and their count; cell -1 when no cell is blank."""
    best, best_options, best_n = -1, 0, 10
    for i in empty:
        if cells[i]:
            continue
        options = ALL_DIGITS & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
        n = (options).bit_count()
        if n < best_n:
            best, best_options, best_n = i, options, n
            if n <= 1:
                break
    return best, best_options, best_n


def count_solutions(
    grid: np.ndarray, limit: int = 2, rng: np.random.Generator | None = None
) -> tuple[int, np.ndarray | None]:
    """Count solutions up to ``limit`` (depth-first, fewest-candidates cell first).

    Returns the count and the first solution found. With ``rng`` the digit order is shuffled,
    which turns the solver into a sampler of random solved grids.
    """
    cells = [int(v) for v in grid]
    masks = _unit_masks(cells)
    if masks is None:
        return 0, None
    rows, cols, boxes = masks
    empty = [i for i, v in enumerate(cells) if v == 0]
    found: list[np.ndarray] = []
    count = 0

    def search() -> None:
        nonlocal count
        best, best_options, best_n = _most_constrained(cells, empty, rows, cols, boxes)
        if best < 0:
            count += 1
            if not found:
                found.append(np.array(cells, dtype=np.int8))
            return
        if best_n == 0:
            return
        digits = [d for d in range(1, 10) if best_options >> d & 1]
        if rng is not None:
            rng.shuffle(digits)
        r, c, b = _ROW[best], _COL[best], _BOX[best]
        for d in digits:
            bit = 1 << d
            cells[best] = d
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            search()
            rows[r] &= ~bit
            cols[c] &= ~bit
            boxes[b] &= ~bit
            cells[best] = 0
            if count >= limit:
                return

    search()
    return count, (found[0] if found else None)


def random_solved_grid(rng: np.random.Generator) -> np.ndarray:
    """One solved grid from the randomised solver on an empty board."""
    _, solution = count_solutions(np.zeros(CELLS, dtype=np.int8), limit=1, rng=rng)
    assert solution is not None
    return solution


def _band_permutation(rng: np.random.Generator, size: int) -> np.ndarray:
    """Permutation of 9 lines that keeps bands: shuffle bands, then lines inside each band."""
    perms = np.empty((size, 9), dtype=np.int64)
    for k in range(size):
        bands = rng.permutation(3)
        perms[k] = np.concatenate([band * 3 + rng.permutation(3) for band in bands])
    return perms


def transform_grids(grids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Apply a random validity-preserving transformation to each grid of ``grids [n, 81]``.

    Relabels digits, permutes rows within bands, bands, columns within stacks, stacks, and
    transposes with probability 1/2. Every output is a valid solved grid if the input was.
    """
    n = grids.shape[0]
    boards = grids.reshape(n, 9, 9)
    transpose = rng.random(n) < 0.5
    boards = np.where(transpose[:, None, None], boards.transpose(0, 2, 1), boards)
    row_perm = _band_permutation(rng, n)
    col_perm = _band_permutation(rng, n)
    index = np.arange(n)[:, None, None]
    boards = boards[index, row_perm[:, :, None], col_perm[:, None, :]]
    relabel = np.concatenate([np.zeros((n, 1), dtype=np.int64), 1 + np.argsort(rng.random((n, 9)), axis=1)], axis=1)
    boards = np.take_along_axis(relabel, boards.reshape(n, CELLS).astype(np.int64), axis=1)
    return boards.astype(np.int8)


def is_valid_solution(grid: np.ndarray) -> bool:
    """True when every row, column and box holds each digit 1..9 exactly once."""
    board = np.asarray(grid).reshape(9, 9)
    if board.min() < 1 or board.max() > 9:
        return False
    boxes = board.reshape(3, 3, 3, 3).transpose(0, 2, 1, 3).reshape(9, 9)
    target = np.arange(1, 10)
    return all((np.sort(lines, axis=1) == target).all() for lines in (board, board.T, boxes))


def is_solved(completion: np.ndarray, puzzle: np.ndarray) -> bool:
    """A completion counts when it is a valid grid that keeps every clue of the puzzle."""
    completion = np.asarray(completion)
    puzzle = np.asarray(puzzle)
    clues = puzzle != 0
    return bool(is_valid_solution(completion) and (completion[clues] == puzzle[clues]).all())


def carve_puzzle(solution: np.ndarray, rng: np.random.Generator, min_clues: int, max_clues: int = CELLS) -> np.ndarray:
    """Remove cells in random order while the solution stays unique.

    Stops at a random clue count in ``[min_clues, max_clues]``; with ``min_clues=0`` it carves
    until no further cell can be removed (a minimal puzzle, typically 22-27 clues).
    """
    target = int(rng.integers(min_clues, max_clues + 1)) if min_clues > 0 else 0
    puzzle = solution.copy()
    clues = CELLS
    for cell in rng.permutation(CELLS):
        if clues <= target:
            break
        saved = puzzle[cell]
        puzzle[cell] = 0
        if count_solutions(puzzle, limit=2)[0] != 1:
            puzzle[cell] = saved
        else:
            clues -= 1
    return puzzle


def grid_to_string(grid: np.ndarray) -> str:
    """81-character line, ``0`` for blank."""
    return "".join(str(int(v)) for v in grid)


def format_board(grid: np.ndarray) -> str:
    """A 9x9 board with box separators, ``.`` for blanks."""
    lines = []
    board = np.asarray(grid).reshape(9, 9)
    for r in range(9):
        if r and r % 3 == 0:
            lines.append("------+-------+------")
        cells = [str(int(v)) if v else "." for v in board[r]]
        lines.append(" | ".join(" ".join(cells[s : s + 3]) for s in (0, 3, 6)))
    return "\n".join(lines)
