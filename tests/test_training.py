"""Smoke test of the Sudoku training script: a tiny run that learns, checkpoints, and resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "experiments" / "train_sudoku.py"

TINY = [
    "checkpoint_every=15",
    "batch_size=32",
    "base_grids=20",
    "eval_puzzles=5",
    "threads=1",
    "warmup_steps=5",
    "lr=3e-3",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.d_ff=64",
]


def _train(out_dir: Path, steps: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), f"steps={steps}", *TINY, f"out_dir={out_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"training failed (rc {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_train_sudoku_learns_checkpoints_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _train(out, steps=30)

    losses = _records(out / "loss.jsonl")
    assert [r["step"] for r in losses] == list(range(1, 31))
    values = [r["loss"] for r in losses]
    assert all(v > 0 for v in values)
    first, last = sum(values[:5]) / 5, sum(values[-5:]) / 5
    assert last < first, f"loss did not go down: first five {values[:5]}, last five {values[-5:]}"
    # warm-up over 5 steps, then cosine decay towards min_lr
    lrs = [r["lr"] for r in losses]
    assert abs(lrs[4] - 3e-3) < 1e-9
    assert lrs[0] < lrs[4] and lrs[-1] < lrs[5]

    evals = _records(out / "eval.jsonl")
    assert [r["step"] for r in evals] == [15, 30]
    for record in evals:
        measures = record["eval"]
        assert isinstance(measures, dict)
        rates = [measures[key] for key in ("solved", "blank_cell_accuracy") if key in measures]
        assert rates, f"no solve rate in the eval record {record}"
        assert all(0.0 <= rate <= 1.0 for rate in rates)
        if "puzzles" in measures:
            assert measures["puzzles"] == 5  # eval_puzzles
        assert record["train_seconds"] >= 0
    assert (out / "model" / "model.safetensors").is_file()
    assert (out / "checkpoint.pt").is_file()
    assert not (out / "checkpoint.tmp").exists()
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["step"] == 30

    resumed = _train(out, steps=40)
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert "at step 30" in resumed.stdout + resumed.stderr
    losses = _records(out / "loss.jsonl")
    assert [r["step"] for r in losses] == list(range(1, 41))
    assert [r["step"] for r in _records(out / "eval.jsonl")] == [15, 30, 40]
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 40
