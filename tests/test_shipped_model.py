"""The shipped Sudoku checkpoint: loads, is small, solves easy puzzles; the default run works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlmsearch.config import build, compose
from dlmsearch.models.loading import load_denoiser, shipped_sudoku_model_path
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.tasks.sudoku import SudokuTask

MODEL_DIR = shipped_sudoku_model_path()


def test_checkpoint_is_small_and_documented() -> None:
    weights = MODEL_DIR / "model.safetensors"
    assert weights.stat().st_size < 10 * 2**20
    card = (MODEL_DIR / "README.md").read_text()
    assert "| easy | adalook |" in card and "| hard | llada |" in card
    training = json.loads((MODEL_DIR / "training.json").read_text())
    assert training["steps"] > 0 and training["train_seconds"] > 0


def test_checkpoint_loads_with_the_expected_architecture() -> None:
    adapter = load_denoiser(None, mask_id=9, vocab_size=10)
    params = sum(p.numel() for p in adapter.module.parameters())
    assert 1.4e6 < params < 1.8e6
    assert adapter.max_length == 81


@pytest.mark.slow
def test_confidence_order_solves_easy_puzzles() -> None:
    adapter = load_denoiser(None, mask_id=9, vocab_size=10)
    task = SudokuTask(tier="easy", limit=12)
    items = task.items()
    decoder = build(compose(["+decoder=llada"]), "decoder")
    results = decoder.decode(
        RolloutEngine(adapter=adapter),
        [DecodeRequest(uid=i, prompt=x.prompt, generation=x.generation) for i, x in enumerate(items)],
        81,
    )
    solved = sum(task.judge(item, result.tokens) for item, result in zip(items, results))
    assert solved >= 9, f"only {solved}/12 easy puzzles solved in confidence order"
    assert all(r.steps == int((x.generation == 9).sum()) for r, x in zip(results, items))  # one cell per step


@pytest.mark.slow
def test_default_command_decodes_and_prints_a_board(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dlmsearch", "+decoder=adalook", "task.limit=6", f"out_dir={tmp_path}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "adalook on sudoku: 6 items, solved/correct" in done.stdout
    assert "------+-------+------" in done.stdout
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 6
