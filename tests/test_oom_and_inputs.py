"""Out-of-memory back-off in the engine (split, retry, lower then regrow the row budget, identical
results), and inputs that fail clearly: binary or non-UTF-8 puzzle files, contradicting clues,
an output directory that cannot be written."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MASK_ID, VOCAB, make_requests, text_decoder, tiny_denoiser
from torch import nn

from dlmsearch.core.capabilities import ModuleFeatures
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.run_dir import check_writable
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.tasks.sudoku import SudokuTask
from dlmsearch.tasks.sudoku_files import PuzzleFileError, load_puzzles, tier_path
from dlmsearch.tasks.sudoku_grids import clue_conflict, grid_to_string

torch.set_num_threads(1)


# --------------------------------------------------------------------------- out of memory


class RowLimit:
    """Raises a simulated out-of-memory error for calls of more than ``limit`` rows; records every call."""

    def __init__(self, limit: float, error: type[Exception] = torch.OutOfMemoryError) -> None:
        self.limit, self.error = limit, error
        self.calls: list[tuple[int, bool]] = []  # (rows, failed)
        self.cached_failures = 0  # failed calls against a KV cache

    def check(self, rows: int, cached: bool = False) -> None:
        failed = rows > self.limit
        self.calls.append((rows, failed))
        self.cached_failures += failed and cached
        if failed:
            raise self.error("CUDA out of memory (simulated)")

    @property
    def failures(self) -> int:
        return sum(failed for _, failed in self.calls)


class LimitedDenoiser(nn.Module):
    def __init__(self, inner: nn.Module, limit: RowLimit) -> None:
        super().__init__()
        self.inner, self.limit = inner, limit

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.limit.check(input_ids.shape[0])
        return self.inner(input_ids, attention_mask=attention_mask)


class LimitedNative(nn.Module):
    """The native text model behind a row limit, still able to cache keys and values."""

    features = ModuleFeatures(kv_cache=True, logits_from=True)

    def __init__(self, inner: nn.Module, limit: RowLimit) -> None:
        super().__init__()
        self.inner, self.limit = inner, limit

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, logits_from: int = 0
    ) -> torch.Tensor:
        self.limit.check(input_ids.shape[0])
        return self.inner(input_ids, attention_mask, logits_from)

    def run(self, input_ids: torch.Tensor, attention_mask=None, logits_from: int = 0):
        self.limit.check(input_ids.shape[0])
        return self.inner.run(input_ids, attention_mask, logits_from)

    def run_cached(self, input_ids: torch.Tensor, positions: torch.Tensor, window):
        self.limit.check(input_ids.shape[0], cached=True)
        return self.inner.run_cached(input_ids, positions, window)


def _outcome(results) -> list[tuple]:
    return [(r.tokens.tolist(), r.steps, r.row_forwards, r.token_forwards) for r in results]


REQUESTS = make_requests([3, 5, 1, 4, 2, 6], 16, seed=4)


@pytest.fixture(scope="module")
def denoiser() -> nn.Module:
    """The tiny denoiser behind every row limit here (built once, when a test first asks)."""
    return tiny_denoiser()


def _denoiser_engine(denoiser: nn.Module, limit: RowLimit, **kwargs) -> RolloutEngine:
    return RolloutEngine(
        adapter=ModelAdapter(module=LimitedDenoiser(denoiser, limit), mask_id=MASK_ID, vocab_size=VOCAB), **kwargs
    )


@pytest.fixture(scope="module")
def unconstrained(denoiser: nn.Module) -> list[tuple]:
    engine = _denoiser_engine(denoiser, RowLimit(float("inf")), row_budget=64)
    return _outcome(text_decoder("adalook").decode(engine, REQUESTS, block_length=8))


def test_oom_splits_and_lowers_the_budget_with_identical_results(
    denoiser: nn.Module, unconstrained: list[tuple]
) -> None:
    limit = RowLimit(3)
    engine = _denoiser_engine(denoiser, limit, row_budget=64)
    engine.regrow_after = 10**9  # keep the lowered budget for this test
    assert _outcome(text_decoder("adalook").decode(engine, REQUESTS, block_length=8)) == unconstrained
    assert limit.failures > 0, "the batch never exceeded the limit: the test checks nothing"
    assert engine.current_budget <= 3 and engine.row_budget == 64
    first_run = len(limit.calls)
    assert _outcome(text_decoder("adalook").decode(engine, REQUESTS, block_length=8)) == unconstrained
    assert not any(failed for _, failed in limit.calls[first_run:]), "a later decode still ran into the limit"


def test_oom_budget_regrows_to_the_configured_budget(denoiser: nn.Module, unconstrained: list[tuple]) -> None:
    limit = RowLimit(3)
    engine = _denoiser_engine(denoiser, limit, row_budget=64)
    engine.regrow_after = 4
    assert _outcome(text_decoder("adalook").decode(engine, REQUESTS, block_length=8)) == unconstrained
    assert limit.failures > 1  # the budget grew back, hit the limit again and halved again
    limit.limit = float("inf")  # memory freed: the budget climbs back to row_budget
    assert _outcome(text_decoder("adalook").decode(engine, REQUESTS, block_length=8)) == unconstrained
    assert engine.budget is None and engine.current_budget == 64


@pytest.mark.parametrize(
    "error", [torch.OutOfMemoryError, torch.cuda.OutOfMemoryError, RuntimeError], ids=["torch", "cuda", "runtime"]
)
def test_a_single_row_out_of_memory_fails_naming_the_sample(denoiser: nn.Module, error: type[Exception]) -> None:
    engine = _denoiser_engine(denoiser, RowLimit(0, error), row_budget=64)
    with pytest.raises(
        torch.OutOfMemoryError,
        match=r"single row of sample uid\(s\) \[0\] \(split from a forward of 3 row\(s\); row_budget=64\)",
    ):
        text_decoder("llada").decode(engine, make_requests([2, 2, 2], 16), block_length=8)


def test_other_runtime_errors_are_not_retried() -> None:
    class Broken(nn.Module):
        calls = 0

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
            Broken.calls += 1
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    engine = RolloutEngine(adapter=ModelAdapter(module=Broken(), mask_id=MASK_ID, vocab_size=VOCAB))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        text_decoder("llada").decode(engine, make_requests([2, 2, 2], 16), block_length=8)
    assert Broken.calls == 1 and engine.budget is None


@pytest.mark.parametrize("family, cache", [("llada", "none"), ("llada", "dual"), ("dream", "dual")])
def test_oom_back_off_with_the_native_model_and_its_cache(family: str, cache: str) -> None:
    from family_models import BLOCK, GEN, requests_for, tiny_family_model

    model = tiny_family_model(family)
    requests = requests_for([3, 9, 6, 1, 5], seed=1)

    def decode(limit: RowLimit) -> tuple[list[tuple], RolloutEngine]:
        adapter = ModelAdapter(
            module=LimitedNative(model, limit), mask_id=63, vocab_size=64, shift_logits=family == "dream"
        )
        engine = RolloutEngine(adapter=adapter, row_budget=64, cache=cache)
        engine.regrow_after = 3  # the budget keeps growing back into the limit: cached forwards get split too
        return _outcome(text_decoder("adalook", gen_length=GEN).decode(engine, requests, BLOCK)), engine

    expected, _ = decode(RowLimit(float("inf")))
    limit = RowLimit(2)
    got, engine = decode(limit)
    assert got == expected
    assert limit.failures > 1 and engine.current_budget < 64
    if cache == "dual":
        assert limit.cached_failures > 0, "no forward against the cache was split"


# --------------------------------------------------------------------------- puzzle files

EMPTY = np.zeros(81, dtype=np.int8)
VALID = grid_to_string(EMPTY)


def _clues(*cells: tuple[int, int]) -> np.ndarray:
    grid = EMPTY.copy()
    for cell, digit in cells:
        grid[cell] = digit
    return grid


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "binary content"),
        (b"puzzle,solution\n" + VALID.encode() + b"\n\xe9t\xe9\n", "not UTF-8 text (byte 0xe9"),
        (("puzzle\n" + VALID + "\n").encode("utf-16"), "UTF-16"),
    ],
    ids=["binary", "latin-1", "utf-16"],
)
def test_unreadable_puzzle_file_names_the_file(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "puzzles.csv"
    path.write_bytes(content)
    with pytest.raises(PuzzleFileError) as info:
        load_puzzles(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not a puzzle file") and words in message and "\n" not in message
    with pytest.raises(ValueError, match="not a puzzle file"):
        SudokuTask(path=str(path)).items()


def test_utf8_with_byte_order_mark_loads(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbf" + VALID.encode() + b"\n")
    assert [p.id for p in load_puzzles(path)] == ["excel:1"]


@pytest.mark.parametrize(
    "grid, words",
    [
        (_clues((0, 5), (8, 5)), "digit 5 twice in row 1 (r1c1 and r1c9)"),
        (_clues((0, 7), (72, 7)), "digit 7 twice in column 1 (r1c1 and r9c1)"),
        (_clues((30, 2), (50, 2)), "digit 2 twice in box 5 (r4c4 and r6c6)"),
    ],
    ids=["row", "column", "box"],
)
def test_contradicting_clues_fail_with_file_and_line(tmp_path: Path, grid: np.ndarray, words: str) -> None:
    assert clue_conflict(grid) == words
    path = tmp_path / "mine.txt"
    path.write_text(f"{VALID}\n\n{grid_to_string(grid)}\n{VALID}\n")
    with pytest.raises(PuzzleFileError) as info:
        load_puzzles(path)
    assert str(info.value) == f"{path}:3: the puzzle's clues contradict each other: {words}"


def test_shipped_tiers_have_consistent_clues() -> None:
    for tier in ("easy", "hard"):
        assert all(clue_conflict(p.puzzle) is None for p in load_puzzles(tier_path(tier)))


def test_a_line_the_csv_reader_rejects_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    path.write_text(f"{VALID}\n{'1' * 200_000}\n")
    with pytest.raises(PuzzleFileError, match=rf"^{path}:2: field larger than field limit"):
        load_puzzles(path)


# --------------------------------------------------------------------------- output directory


def test_check_writable_creates_the_directory_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    check_writable(out)
    assert out.is_dir() and list(out.iterdir()) == []
    check_writable(out)  # existing and writable


def test_check_writable_fails_on_a_file_in_the_way(tmp_path: Path) -> None:
    blocker = tmp_path / "results"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match=rf"^out_dir={blocker} cannot be written: it is a file$"):
        check_writable(blocker)
    with pytest.raises(ValueError, match=rf"^out_dir={blocker}/run cannot be written: {blocker} is a file$"):
        check_writable(blocker / "run")


def test_check_writable_fails_without_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(kwargs.get("dir")))

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", denied)  # root ignores chmod, so simulate it
    with pytest.raises(ValueError, match=rf"^out_dir={tmp_path}/out cannot be written: Permission denied$") as info:
        check_writable(tmp_path / "out")
    assert isinstance(info.value.__cause__, PermissionError)


@pytest.mark.skipif(
    not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0, reason="root can write anywhere"
)
def test_check_writable_fails_on_a_read_only_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(ValueError, match="cannot be written: Permission denied"):
            check_writable(locked / "out")
    finally:
        locked.chmod(0o700)
