"""Checkpoints and resuming (:class:`dlmsearch.training.Checkpointer`, which both training scripts
use), and the Sudoku training script: a tiny run that learns and checkpoints, and a run killed
midway that, started again, resumes into exactly the run it would have been."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dlmsearch.training import CHECKPOINT, Checkpointer

torch.set_num_threads(1)

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "experiments" / "train_sudoku.py"

STEPS, EVERY, WARMUP, LR = 40, 20, 5, 1e-2
TINY = [
    f"checkpoint_every={EVERY}",
    "batch_size=32",
    "base_grids=20",
    "eval_puzzles=5",
    "threads=1",
    f"warmup_steps={WARMUP}",
    f"lr={LR}",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.d_ff=64",
]


class Interrupted(Exception):
    """Stands in for the process being killed."""


@pytest.fixture(autouse=True)
def _keep_torch_rng():
    """These tests seed and resume torch's global generator: the tests after them see it as it was."""
    with torch.random.fork_rng():
        yield


# ---------------------------------------------------------------------------------------------
# The Checkpointer on a toy problem
# ---------------------------------------------------------------------------------------------


def _toy(out_dir: Path, seed: int = 0) -> Checkpointer:
    """A fresh "process": a linear model, AdamW, a torch generator and a numpy generator."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    return Checkpointer(out_dir, model, optimizer, torch.Generator().manual_seed(seed), np.random.default_rng(seed))


def _toy_steps(run: Checkpointer, count: int) -> list[float]:
    """``count`` training steps drawing from all three random sources, as the scripts do:
    data from the numpy generator, noise from the torch generator and from torch's global one."""
    losses = []
    for _ in range(count):
        x = torch.from_numpy(run.rng.standard_normal((8, 4))).float()
        y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(8, 1, generator=run.generator) + 0.1 * torch.randn(8, 1)
        loss = torch.nn.functional.mse_loss(run.model(x), y)
        run.optimizer.zero_grad()
        loss.backward()
        run.optimizer.step()
        losses.append(loss.item())
    return losses


def _same_weights(a: torch.nn.Module | dict, b: torch.nn.Module | dict) -> bool:
    a, b = (m.state_dict() if isinstance(m, torch.nn.Module) else m for m in (a, b))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_run_takes_the_steps_of_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = _toy(tmp_path / "whole")
    expected = _toy_steps(whole, 30)
    cut = _toy(tmp_path / "cut")
    head = _toy_steps(cut, 12)
    cut.save(12, train_seconds=1.5)
    _toy_steps(cut, 3)  # steps after the checkpoint, lost when the process is killed
    again = _toy(tmp_path / "cut", seed=1)  # a new process: other weights and random states until it resumes
    state = again.resume()
    assert state is not None and state["step"] == 12 and state["train_seconds"] == 1.5
    tail = _toy_steps(again, 18)
    assert head + tail == expected, "the resumed run drew other data, noise or updates than the uninterrupted one"
    assert _same_weights(again.model, whole.model)
    assert sum(expected[-5:]) < 0.1 * sum(expected[:5]), "the toy problem did not train: the comparison proves little"


def test_saves_are_atomic_and_a_half_written_file_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _toy(tmp_path)
    assert run.latest() is None and run.resume() is None
    partial = tmp_path / f"{CHECKPOINT}.tmp"
    partial.write_bytes(b"a save killed mid-write")
    assert run.latest() is None and run.resume() is None, "a partial write was taken for a checkpoint"
    run.save(3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT]
    saved = {k: v.clone() for k, v in run.model.state_dict().items()}
    _toy_steps(run, 2)

    def killed(state: dict, handle) -> None:
        handle.write(b"half a checkpoint")
        raise Interrupted

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(Interrupted):
        run.save(5)
    monkeypatch.undo()
    again = _toy(tmp_path, seed=1)
    assert again.latest() == tmp_path / CHECKPOINT
    state = again.resume()
    assert state is not None and state["step"] == 3, "the checkpoint before the killed save is the one resumed"
    assert _same_weights(again.model, saved)


def test_resume_drops_the_log_records_past_the_checkpoint(tmp_path: Path) -> None:
    for name in ("loss.jsonl", "eval.jsonl"):
        records = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 9))
        (tmp_path / name).write_text(records + '{"step": 9, "lo')  # the kill cut the last line short
    run = _toy(tmp_path)
    run.save(5)
    _toy(tmp_path, seed=1).resume()
    for name in ("loss.jsonl", "eval.jsonl"):
        assert [r["step"] for r in _records(tmp_path / name)] == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT, "eval.jsonl", "loss.jsonl"]


# ---------------------------------------------------------------------------------------------
# The Sudoku training script
# ---------------------------------------------------------------------------------------------


def _train(out_dir: Path, steps: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), f"steps={steps}", *TINY, f"out_dir={out_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, (
        f"training failed (rc {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _in_process(out_dir: Path, steps: int) -> None:
    """The script's ``main`` on the config its command line would compose, in this process.

    The script leaves the weights' initialisation to torch's global generator (its ``seed``
    draws the data and the masks), which in a test process is wherever earlier tests left it:
    it is seeded here, so every in-process run starts from the same weights, and put back after.
    """
    import train_sudoku
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "experiments" / "conf" / "train"), version_base=None):
        cfg = compose("sudoku", overrides=[f"steps={steps}", *TINY, f"out_dir={out_dir}"])
    with torch.random.fork_rng():
        torch.manual_seed(0)
        train_sudoku.main(cfg)


def test_train_sudoku_learns_checkpoints_and_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    whole = tmp_path / "whole"
    started = time.monotonic()
    _in_process(whole, STEPS)
    wall = time.monotonic() - started

    losses = _records(whole / "loss.jsonl")
    assert [r["step"] for r in losses] == list(range(1, STEPS + 1))
    values = [r["loss"] for r in losses]
    # Every masked cell holds one of nine digits: a model that has learnt only that (and never
    # to predict the mask) scores ln 9 nats, and a random one starts above it. A tiny model
    # gets there within these steps (measured: from 0.16-0.19 nats above to 0.001-0.002 above);
    # learning the rules, below ln 9, takes far longer than a test.
    floor = math.log(9)
    first, last = sum(values[:5]) / 5 - floor, sum(values[-5:]) / 5 - floor
    assert first > 0.05, f"the first steps already score ln 9: {values[:5]}"
    assert last < first / 20 and last < 0.01, (
        f"the loss did not fall to ln 9: first five {values[:5]}, last five {values[-5:]}"
    )
    # warm-up to lr over WARMUP steps, then cosine decay towards min_lr (5e-5)
    lrs = [r["lr"] for r in losses]
    assert lrs[:WARMUP] == pytest.approx([LR * (i + 1) / WARMUP for i in range(WARMUP)], rel=1e-9)
    assert all(a >= b for a, b in zip(lrs[WARMUP - 1 :], lrs[WARMUP:])) and lrs[-1] < 0.01 * LR

    evals = _records(whole / "eval.jsonl")
    assert [r["step"] for r in evals] == [EVERY, STEPS]
    for record in evals:
        measures = record["eval"]
        assert measures["puzzles"] == 5 and 0.0 <= measures["solved"] <= 1.0 and measures["mean_steps"] >= 1
    seconds = [r["train_seconds"] for r in evals]
    assert 0 < seconds[0] < seconds[1] < wall, f"training seconds {seconds} in a run of {wall:.1f} s"
    state = torch.load(whole / CHECKPOINT, weights_only=False)
    assert state["step"] == STEPS and sorted(p.name for p in whole.glob("checkpoint*")) == [CHECKPOINT]
    from dlmsearch.models.denoiser import BidirectionalDenoiser

    assert _same_weights(BidirectionalDenoiser.load(whole / "model"), state["model"]), (
        "the saved model is not the checkpoint's"
    )

    # The same run, killed after step 25 (five steps past the step-20 checkpoint), then started
    # again from the command line: a new process, which resumes from the checkpoint.
    cut = tmp_path / "cut"
    import dlmsearch.training as training_loop  # the loop every training script runs

    schedule = training_loop.learning_rate

    def killed_after_25(step: int, *args: float) -> float:
        if step == 25:
            raise Interrupted
        return schedule(step, *args)

    with monkeypatch.context() as patched:
        patched.setattr(training_loop, "learning_rate", killed_after_25)
        with pytest.raises(Interrupted):
            _in_process(cut, STEPS)
    assert [r["step"] for r in _records(cut / "loss.jsonl")] == list(range(1, 26))
    assert torch.load(cut / CHECKPOINT, weights_only=False)["step"] == EVERY
    again = _train(cut, steps=STEPS)
    assert f"resumed from {cut / CHECKPOINT} at step {EVERY}" in again.stdout + again.stderr
    # Steps 21-25 are dropped and taken again; every step's loss and learning rate, the
    # checkpoints' measurements and the final weights are the uninterrupted run's.
    assert _records(cut / "loss.jsonl") == losses
    assert [(r["step"], r["eval"]) for r in _records(cut / "eval.jsonl")] == [(r["step"], r["eval"]) for r in evals]
    resumed = torch.load(cut / CHECKPOINT, weights_only=False)
    assert resumed["step"] == STEPS and _same_weights(resumed["model"], state["model"])
