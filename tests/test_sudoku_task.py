"""Sudoku grids, puzzle carving, puzzle files, the shipped tiers, and the Sudoku task."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlmsearch.tasks.sudoku import SUDOKU_MASK_ID, SudokuTask, grids_to_tokens, tokens_to_grids
from dlmsearch.tasks.sudoku_files import PuzzleFileError, load_puzzles, tier_path, write_puzzles
from dlmsearch.tasks.sudoku_grids import (
    CELLS,
    carve_puzzle,
    count_solutions,
    format_board,
    grid_to_string,
    is_solved,
    is_valid_solution,
    random_solved_grid,
    transform_grids,
)

torch.set_num_threads(1)

# A well-known valid solved grid and a puzzle of it (unique solution).
SOLUTION = np.array(
    [int(c) for c in "534678912672195348198342567859761423426853791713924856961537284287419635345286179"], dtype=np.int8
)
PUZZLE = np.array(
    [int(c) for c in "530070000600195000098000060800060003400803001700020006060000280000419005000080079"], dtype=np.int8
)


def _line(grid: np.ndarray, blank: str = "0") -> str:
    return "".join(str(int(v)) if v else blank for v in grid)


# --------------------------------------------------------------------------- grids


def test_reference_grid_is_valid_and_puzzle_unique() -> None:
    assert is_valid_solution(SOLUTION)
    count, found = count_solutions(PUZZLE, limit=2)
    assert count == 1
    np.testing.assert_array_equal(found, SOLUTION)


def test_random_solved_grids_are_valid_and_vary() -> None:
    rng = np.random.default_rng(1)
    grids = [random_solved_grid(rng) for _ in range(5)]
    for grid in grids:
        assert grid.shape == (CELLS,)
        assert is_valid_solution(grid)
    assert len({g.tobytes() for g in grids}) == 5


def test_transform_grids_keeps_validity_and_changes_grids() -> None:
    rng = np.random.default_rng(2)
    base = np.stack([random_solved_grid(rng) for _ in range(3)])
    grids = transform_grids(base[rng.integers(0, 3, 300)], rng)
    assert grids.shape == (300, CELLS)
    assert grids.dtype == np.int8
    assert all(is_valid_solution(g) for g in grids)
    distinct = {g.tobytes() for g in grids}
    assert len(distinct) > 290  # the transformation group is huge; collisions are vanishingly rare
    assert not distinct & {g.tobytes() for g in base}


def test_transform_grids_keeps_blanks_blank() -> None:
    rng = np.random.default_rng(3)
    puzzles = np.stack([PUZZLE] * 50)
    out = transform_grids(puzzles, rng)
    assert ((out == 0).sum(axis=1) == (PUZZLE == 0).sum()).all()
    # each transformed puzzle still has exactly one solution
    for p in out[:5]:
        assert count_solutions(p, limit=2)[0] == 1


def test_is_valid_solution_rejects_broken_grids() -> None:
    broken = SOLUTION.copy()
    broken[0], broken[1] = broken[1], broken[0]  # row still fine, columns broken
    assert not is_valid_solution(broken)
    with_blank = SOLUTION.copy()
    with_blank[40] = 0
    assert not is_valid_solution(with_blank)
    too_big = SOLUTION.copy()
    too_big[40] = 10
    assert not is_valid_solution(too_big)


def test_count_solutions_contradiction_and_many() -> None:
    grid = np.zeros(CELLS, dtype=np.int8)
    grid[0] = 5
    grid[7] = 5  # same row
    assert count_solutions(grid, limit=2) == (0, None)
    column = np.zeros(CELLS, dtype=np.int8)
    column[4] = 3
    column[4 + 9 * 6] = 3  # same column
    assert count_solutions(column, limit=2)[0] == 0
    box = np.zeros(CELLS, dtype=np.int8)
    box[0] = 2
    box[10] = 2  # same box
    assert count_solutions(box, limit=2)[0] == 0

    almost_empty = np.zeros(CELLS, dtype=np.int8)
    almost_empty[0] = 1
    almost_empty[80] = 9
    count, found = count_solutions(almost_empty, limit=2)
    assert count >= 2
    assert is_solved(found, almost_empty)
    assert count_solutions(almost_empty, limit=5)[0] == 5


def test_count_solutions_of_a_full_grid() -> None:
    count, found = count_solutions(SOLUTION, limit=2)
    assert count == 1
    np.testing.assert_array_equal(found, SOLUTION)


# --------------------------------------------------------------------------- carving


def test_carve_easy_puzzles_are_unique_and_in_range() -> None:
    rng = np.random.default_rng(4)
    for _ in range(8):
        solution = random_solved_grid(rng)
        puzzle = carve_puzzle(solution, rng, min_clues=30, max_clues=36)
        clues = puzzle != 0
        assert 30 <= clues.sum() <= 36
        assert (puzzle[clues] == solution[clues]).all()
        count, found = count_solutions(puzzle, limit=2)
        assert count == 1
        np.testing.assert_array_equal(found, solution)
        assert is_solved(solution, puzzle)
        # the solution is not modified in place
        assert is_valid_solution(solution)


def test_carve_minimal_puzzle_has_no_removable_clue() -> None:
    rng = np.random.default_rng(5)
    for _ in range(2):
        solution = random_solved_grid(rng)
        puzzle = carve_puzzle(solution, rng, min_clues=0)
        assert count_solutions(puzzle, limit=2)[0] == 1
        assert 17 <= (puzzle != 0).sum() <= 35
        for cell in np.flatnonzero(puzzle):
            fewer = puzzle.copy()
            fewer[cell] = 0
            assert count_solutions(fewer, limit=2)[0] == 2, f"clue at {cell} could be removed"


# --------------------------------------------------------------------------- is_solved


def test_is_solved() -> None:
    assert is_solved(SOLUTION, PUZZLE)
    # a different valid grid that contradicts a clue (digits 1 and 2 swapped everywhere)
    relabelled = SOLUTION.copy()
    relabelled[SOLUTION == 1] = 2
    relabelled[SOLUTION == 2] = 1
    assert is_valid_solution(relabelled)
    clue_digits = set(PUZZLE[PUZZLE != 0].tolist())
    assert {1, 2} & clue_digits
    assert not is_solved(relabelled, PUZZLE)
    # changing one clue cell breaks the clue (and validity)
    changed = SOLUTION.copy()
    clue = int(np.flatnonzero(PUZZLE)[0])
    changed[clue] = changed[clue] % 9 + 1
    assert not is_solved(changed, PUZZLE)
    # swap two blank cells of one row: clues kept but the columns break
    row0_blanks = [i for i in range(9) if PUZZLE[i] == 0]
    a, b = row0_blanks[0], row0_blanks[1]
    swapped = SOLUTION.copy()
    swapped[a], swapped[b] = swapped[b], swapped[a]
    assert (swapped[PUZZLE != 0] == PUZZLE[PUZZLE != 0]).all()
    assert not is_solved(swapped, PUZZLE)
    # a blank left in the completion
    with_zero = SOLUTION.copy()
    with_zero[a] = 0
    assert not is_solved(with_zero, PUZZLE)
    # an empty puzzle accepts any valid grid
    assert is_solved(SOLUTION, np.zeros(CELLS, dtype=np.int8))


def test_grid_to_string_and_format_board() -> None:
    assert grid_to_string(PUZZLE) == _line(PUZZLE)
    board = format_board(PUZZLE).splitlines()
    assert len(board) == 11
    assert board[0] == "5 3 . | . 7 . | . . ."
    assert board[3] == "------+-------+------"


# --------------------------------------------------------------------------- files


def test_load_line_format_with_zero_and_dot_blanks(tmp_path) -> None:
    path = tmp_path / "mine.txt"
    path.write_text(_line(PUZZLE) + "\n\n" + _line(PUZZLE, ".") + "\n   \n" + _line(SOLUTION) + "\n")
    puzzles = load_puzzles(path)
    assert [p.id for p in puzzles] == ["mine:1", "mine:3", "mine:5"]
    np.testing.assert_array_equal(puzzles[0].puzzle, PUZZLE)
    np.testing.assert_array_equal(puzzles[1].puzzle, PUZZLE)
    np.testing.assert_array_equal(puzzles[2].puzzle, SOLUTION)
    assert all(p.solution is None for p in puzzles)
    assert puzzles[0].puzzle.dtype == np.int8


@pytest.mark.parametrize("header", [True, False])
def test_load_csv(tmp_path, header: bool) -> None:
    path = tmp_path / "pairs.csv"
    lines = (["puzzle,solution"] if header else []) + [
        f"{_line(PUZZLE, '.')},{_line(SOLUTION)}",
        "",
        f"{_line(PUZZLE)},{_line(SOLUTION)}",
    ]
    path.write_text("\n".join(lines) + "\n")
    puzzles = load_puzzles(str(path))
    assert len(puzzles) == 2
    for p in puzzles:
        np.testing.assert_array_equal(p.puzzle, PUZZLE)
        np.testing.assert_array_equal(p.solution, SOLUTION)
    first = 2 if header else 1
    assert [p.id for p in puzzles] == [f"pairs:{first}", f"pairs:{first + 2}"]


def test_write_then_load_round_trip(tmp_path) -> None:
    rng = np.random.default_rng(6)
    pairs = []
    for _ in range(3):
        s = random_solved_grid(rng)
        pairs.append((carve_puzzle(s, rng, 30, 36), s))
    path = tmp_path / "round.csv"
    write_puzzles(path, pairs)
    loaded = load_puzzles(path)
    assert len(loaded) == 3
    for (p, s), got in zip(pairs, loaded):
        np.testing.assert_array_equal(got.puzzle, p)
        np.testing.assert_array_equal(got.solution, s)


def _bad_file(tmp_path, bad: str) -> str:
    """Two good lines, then ``bad`` on line 3."""
    path = tmp_path / "bad.csv"
    path.write_text(f"{_line(PUZZLE)},{_line(SOLUTION)}\n{_line(PUZZLE)}\n{bad}\n{_line(PUZZLE)}\n")
    return str(path)


_contradicting = SOLUTION.copy()
_contradicting[0], _contradicting[1] = _contradicting[1], _contradicting[0]  # cell 0 and 1 are clues 5, 3
_with_blank = SOLUTION.copy()
_with_blank[2] = 0


@pytest.mark.parametrize(
    "bad, words",
    [
        (_line(PUZZLE)[:80], "81 characters"),
        (_line(PUZZLE) + "1", "81 characters"),
        (_line(PUZZLE)[:40] + "x" + _line(PUZZLE)[41:], "81 characters"),
        (_line(PUZZLE)[:40] + "-" + _line(PUZZLE)[41:], "81 characters"),
        (f"{_line(PUZZLE)},{_line(SOLUTION)},{_line(SOLUTION)}", "3 fields"),
        (f"{_line(PUZZLE)},{_line(SOLUTION)[:80]}", "solution must be"),
        (f"{_line(PUZZLE)},{_line(_with_blank)}", "blank"),
        (f"{_line(PUZZLE)},{_line(_with_blank, '.')}", "blank"),
        (f"{_line(PUZZLE)},{_line(_contradicting)}", "contradicts"),
    ],
)
def test_bad_line_names_line_number(tmp_path, bad: str, words: str) -> None:
    path = _bad_file(tmp_path, bad)
    with pytest.raises(PuzzleFileError) as info:
        load_puzzles(path)
    message = str(info.value)
    assert ":3:" in message
    assert path in message
    assert words in message


def test_bad_first_line_after_blank_lines_names_line_number(tmp_path) -> None:
    path = tmp_path / "late.txt"
    path.write_text("\n\n\n\n" + _line(PUZZLE)[:70] + "\n")
    with pytest.raises(PuzzleFileError, match=":5:"):
        load_puzzles(path)


def test_empty_and_missing_files(tmp_path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(PuzzleFileError, match="no puzzles"):
        load_puzzles(empty)
    blank_lines = tmp_path / "blank.txt"
    blank_lines.write_text("\n  \n\n")
    with pytest.raises(PuzzleFileError, match="no puzzles"):
        load_puzzles(blank_lines)
    header_only = tmp_path / "header.csv"
    header_only.write_text("puzzle,solution\n")
    with pytest.raises(PuzzleFileError, match="no puzzles"):
        load_puzzles(header_only)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_puzzles(tmp_path / "nowhere.txt")
    with pytest.raises(FileNotFoundError):
        load_puzzles(tmp_path)  # a directory is not a puzzle file
    # PuzzleFileError is a ValueError, so callers can catch either
    assert issubclass(PuzzleFileError, ValueError)


# --------------------------------------------------------------------------- shipped tiers


@pytest.fixture(scope="module")
def tiers() -> dict[str, list]:
    return {tier: load_puzzles(tier_path(tier)) for tier in ("easy", "hard")}


def test_tier_path() -> None:
    for tier in ("easy", "hard"):
        assert tier_path(tier).is_file()
        assert tier_path(tier).name == f"sudoku_{tier}.csv"
    with pytest.raises(ValueError, match="nope"):
        tier_path("nope")


@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_shipped_tier_puzzles_are_well_formed(tiers, tier: str) -> None:
    puzzles = tiers[tier]
    assert len(puzzles) >= 200
    clues = np.array([(p.puzzle != 0).sum() for p in puzzles])
    if tier == "easy":
        assert clues.min() >= 30 and clues.max() <= 36
    else:
        assert clues.min() >= 20 and clues.max() <= 28
        assert clues.mean() < 26
    for p in puzzles:
        assert p.solution is not None
        assert is_valid_solution(p.solution)
        assert is_solved(p.solution, p.puzzle)
    assert len({p.puzzle.tobytes() for p in puzzles}) == len(puzzles)
    assert len({p.id for p in puzzles}) == len(puzzles)


@pytest.mark.parametrize("tier", ["easy", "hard"])
def test_shipped_tier_sample_has_unique_solutions(tiers, tier: str) -> None:
    puzzles = tiers[tier]
    sample = puzzles[:: max(1, len(puzzles) // 20)][:20]
    assert len(sample) == 20
    for p in sample:
        count, found = count_solutions(p.puzzle, limit=2)
        assert count == 1, p.id
        np.testing.assert_array_equal(found, p.solution)


def test_tiers_share_no_solution(tiers) -> None:
    easy = {p.solution.tobytes() for p in tiers["easy"]}
    hard = {p.solution.tobytes() for p in tiers["hard"]}
    assert not easy & hard


# --------------------------------------------------------------------------- the task


def test_tokens_round_trip() -> None:
    grids = np.stack([PUZZLE, SOLUTION])
    tokens = grids_to_tokens(grids)
    assert tokens.dtype == torch.long
    assert tokens.shape == (2, CELLS)
    assert torch.equal(tokens[0] == SUDOKU_MASK_ID, torch.as_tensor(PUZZLE == 0))
    assert not (tokens[1] == SUDOKU_MASK_ID).any()
    assert int(tokens.max()) <= SUDOKU_MASK_ID and int(tokens.min()) >= 0
    assert int(tokens[1].max()) == 8 and int(tokens[1].min()) == 0
    np.testing.assert_array_equal(tokens_to_grids(tokens), grids)


def test_task_items_and_limit() -> None:
    task = SudokuTask(tier="easy", limit=7)
    items = task.items()
    assert len(items) == 7
    assert task.source == "easy tier"
    all_items = SudokuTask(tier="hard").items()
    assert len(all_items) == len(load_puzzles(tier_path("hard")))
    for item in items:
        puzzle = item.reference.puzzle
        assert item.prompt.numel() == 0
        assert item.generation.shape == (CELLS,)
        assert torch.equal(item.generation == SUDOKU_MASK_ID, torch.as_tensor(puzzle == 0))
        np.testing.assert_array_equal(tokens_to_grids(item.generation), puzzle)
    assert [i.id for i in items] == [i.id for i in SudokuTask(tier="easy").items()[:7]]


def test_task_judge_output_render() -> None:
    task = SudokuTask(tier="hard", limit=3)
    for item in task.items():
        truth = grids_to_tokens(item.reference.solution[None])[0]
        assert task.judge(item, truth) is True
        output = task.output(item, truth)
        assert output == grid_to_string(item.reference.solution)
        rendered = task.render(item, output)
        assert "(solved)" in rendered and "NOT solved" not in rendered
        assert item.id in rendered

        # corrupt one blank cell: still keeps clues but breaks validity
        blank = int(np.flatnonzero(item.reference.puzzle == 0)[0])
        corrupted = truth.clone()
        corrupted[blank] = (corrupted[blank] + 1) % 9
        assert task.judge(item, corrupted) is False
        assert "NOT solved" in task.render(item, task.output(item, corrupted))

        # the initial canvas (masks left) is not a solution
        assert task.judge(item, item.generation) is False
        assert "NOT solved" in task.render(item, task.output(item, item.generation))


def test_task_reads_user_file(tmp_path) -> None:
    path = tmp_path / "user.txt"
    path.write_text(_line(PUZZLE, ".") + "\n" + _line(PUZZLE) + "\n")
    task = SudokuTask(path=str(path))
    assert task.source == str(path)
    items = task.items()
    assert len(items) == 2
    assert items[0].id == "user:1"
    assert items[0].reference.solution is None
    truth = grids_to_tokens(SOLUTION[None])[0]
    assert task.judge(items[0], truth) is True
    assert "(solved)" in task.render(items[0], task.output(items[0], truth))
    assert len(SudokuTask(path=str(path), limit=1).items()) == 1


def test_task_rejects_bad_settings(tmp_path) -> None:
    with pytest.raises(ValueError, match="tier"):
        SudokuTask(tier="medium")
    with pytest.raises(ValueError, match="limit"):
        SudokuTask(limit=0)
    with pytest.raises(ValueError, match="limit"):
        SudokuTask(limit=-3)
    with pytest.raises(TypeError, match="limit"):
        SudokuTask(limit="5")
    with pytest.raises(ValueError, match="gen_length"):
        SudokuTask(gen_length=64)
    with pytest.raises(FileNotFoundError):
        SudokuTask(path=str(tmp_path / "missing.txt")).items()
