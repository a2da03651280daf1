"""What the training scripts share: checkpoints and resuming, the learning-rate schedule, and the
held-out measurements taken at each checkpoint with the model still in memory."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from tqdm import tqdm

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.denoiser import BidirectionalDenoiser
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.tasks.base import Task, TaskItem
from dlmsearch.tasks.sudoku import SUDOKU_MASK_ID, SUDOKU_VOCAB, SudokuTask, puzzle_item
from dlmsearch.tasks.sudoku_files import SudokuPuzzle


@torch.no_grad()
def checkpoint_accuracy(
    adapter: ModelAdapter, task: Task, items: list[TaskItem], decoder: str, overrides: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Share of ``items`` a decoder preset gets right (the task's judge) and its mean steps.

    The decoder is composed from ``conf/`` as the CLI composes it (``overrides`` choose the
    task's decoding group, e.g. ``task=countdown``), so the number logged during training is
    the number a later ``python -m dlmsearch`` run reproduces.
    """
    cfg = compose([f"+decoder={decoder}", *overrides])
    search = build(cfg, "decoder")
    engine = RolloutEngine(adapter=adapter)
    requests = [DecodeRequest(uid=u, prompt=i.prompt, generation=i.generation) for u, i in enumerate(items)]
    results = search.decode(engine, requests, task.block_length)
    correct = [bool(task.judge(item, result.tokens)) for item, result in zip(items, results)]
    return {
        "decoder": decoder,
        "items": len(items),
        "accuracy": round(sum(correct) / len(correct), 4),
        "mean_steps": round(sum(r.steps for r in results) / len(results), 2),
    }


def checkpoint_solve_rate(model: BidirectionalDenoiser, puzzles: list[SudokuPuzzle], decoder: str) -> dict[str, Any]:
    """Solve rate and mean steps of a decoder preset on held-out Sudoku puzzles."""
    adapter = ModelAdapter(module=model, mask_id=SUDOKU_MASK_ID, vocab_size=SUDOKU_VOCAB)
    found = checkpoint_accuracy(adapter, SudokuTask(), [puzzle_item(p) for p in puzzles], decoder)
    return {
        "decoder": decoder,
        "puzzles": found["items"],
        "solved": found["accuracy"],
        "mean_steps": found["mean_steps"],
    }


def progress(step: int, steps: int, train_seconds: float, budget_minutes: float | None) -> float:
    """Fraction of training done: by steps, or by CPU time when ``budget_minutes`` is set,
    whichever is further, so the learning rate decays fully on a machine of any speed."""
    by_time = train_seconds / (60 * budget_minutes) if budget_minutes else 0.0
    return min(1.0, max(step / steps, by_time))


def learning_rate(step: int, done: float, lr: float, min_lr: float, warmup_steps: int) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay from ``lr`` to ``min_lr`` as ``done`` goes to 1."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * done))


def trim_log(path: Path, step: int) -> None:
    """Drop records past the checkpoint being resumed, so no step is logged twice (and a last
    line cut short by the kill); the log is replaced atomically, as checkpoints are."""
    if path.exists():
        kept = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record["step"] <= step:
                kept.append(line)
        partial = path.with_name(path.name + ".tmp")
        partial.write_text("".join(line + "\n" for line in kept))
        os.replace(partial, path)


CHECKPOINT = "checkpoint.pt"
"""The one checkpoint file of a training run's ``out_dir`` (each save replaces it)."""


@attrs.define(eq=False)
class Checkpointer:
    """Saving and resuming a training run in ``out_dir``: the weights, the optimiser's state, the
    step, and every random state the run draws from (``generator`` for the masks, ``rng`` for
    the data, and torch's global generator), so that a resumed run takes the very steps an
    uninterrupted one would have taken.

    A save is written to ``checkpoint.pt.tmp`` in the same directory, flushed to disk, then
    renamed over ``checkpoint.pt`` (``os.replace``: atomic), so a run killed mid-save leaves the
    previous checkpoint whole, and a stray ``.tmp`` is never read. Extra entries (the training
    seconds so far) are stored beside the state and returned by :meth:`resume`.
    """

    out_dir: Path = attrs.field(converter=Path)
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    rng: np.random.Generator

    @property
    def path(self) -> Path:
        return self.out_dir / CHECKPOINT

    def latest(self) -> Path | None:
        """The checkpoint to resume from (the last one saved), or None for a fresh run."""
        return self.path if self.path.is_file() else None

    def save(self, step: int, **extra: Any) -> Path:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": step,
            "generator": self.generator.get_state(),
            "numpy_rng": self.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            **extra,
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".tmp")
        with partial.open("wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, self.path)
        return self.path

    def start_from(self, directory: str | Path | None, weights: Callable[[Path], dict[str, torch.Tensor]]) -> None:
        """Continue a trained model: a fresh run (no checkpoint in ``out_dir``) loads ``weights(directory)``
        into the model, strictly (every name and shape must match); a resumed run keeps its
        checkpoint's weights, and ``directory=None`` starts from the script's own initialisation."""
        if directory is None or self.latest() is not None:
            return
        path = Path(directory)
        if not path.is_dir():
            raise FileNotFoundError(f"init_from={directory}: no such model directory")
        self.model.load_state_dict(weights(path))
        print(f"starting from the weights of {path}")

    def resume(self, logs: tuple[str, ...] = ("loss.jsonl", "eval.jsonl")) -> dict[str, Any] | None:
        """Load the latest checkpoint into the model, optimiser and random generators, and drop
        the records of ``logs`` (files in ``out_dir``) past its step, which the resumed run
        writes again. Returns the checkpoint (``step`` and the extra entries), or None if
        there is none."""
        path = self.latest()
        if path is None:
            return None
        state = torch.load(path, weights_only=False, map_location="cpu")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.rng.bit_generator.state = state["numpy_rng"]
        if "torch_rng" in state:  # checkpoints written before it was saved
            torch.set_rng_state(state["torch_rng"])
        for name in logs:
            trim_log(self.out_dir / name, state["step"])
        return state


@attrs.define(eq=False)
class TrainingLoop:
    """The loop every training script runs: resume from ``out_dir``'s checkpoint; each step the
    schedule's learning rate (:func:`learning_rate` over :func:`progress`), the script's batch loss,
    gradients clipped at 1, one line in ``loss.jsonl``; a checkpoint every ``checkpoint_every``
    steps, at the end of the step or time budget and when ``max_minutes`` stops the process early,
    with what the script saves and measures there (``on_checkpoint``; its time is not training
    time) appended to ``eval.jsonl``. ``cfg`` holds ``steps``, ``budget_minutes``, ``max_minutes``,
    ``lr``, ``min_lr``, ``warmup_steps`` and ``checkpoint_every``."""

    cfg: Any
    checkpoints: Checkpointer

    def run(
        self,
        batch_loss: Callable[[float], tuple[torch.Tensor, dict[str, float]]],
        on_checkpoint: Callable[[int, float, float], dict[str, Any]],
    ) -> int:
        """Train until the budget is spent (or ``max_minutes``); returns the last step.
        ``batch_loss(done)`` draws a batch and returns its loss and what to log beside it;
        ``on_checkpoint(step, train_seconds, done)`` returns the checkpoint's record."""
        cfg, out = self.cfg, self.checkpoints.out_dir
        model, optimizer = self.checkpoints.model, self.checkpoints.optimizer
        step, before = 0, 0.0
        resumed = self.checkpoints.resume()
        if resumed is not None:
            step, before = resumed["step"], resumed["train_seconds"]
            print(f"resumed from {self.checkpoints.path} at step {step}")
        started = time.monotonic()
        evaluating = 0.0

        def seconds() -> float:
            return before + time.monotonic() - started - evaluating

        def save(step: int) -> None:
            nonlocal evaluating
            spent = seconds()
            self.checkpoints.save(step, train_seconds=spent)
            tick = time.monotonic()
            record = on_checkpoint(step, spent, progress(step, cfg.steps, spent, cfg.budget_minutes))
            model.train()
            evaluating += time.monotonic() - tick
            with (out / "eval.jsonl").open("a") as handle:
                handle.write(json.dumps({"step": step, "train_seconds": round(spent, 1), **record}) + "\n")

        model.train()
        bar = tqdm(total=cfg.steps, initial=step, desc="train", dynamic_ncols=True)
        with (out / "loss.jsonl").open("a") as log:
            while True:
                done = progress(step, cfg.steps, seconds(), cfg.budget_minutes)
                if done >= 1.0:
                    break
                loss, extras = self._step(step, done, batch_loss)
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.4f}", **{k: f"{v:.4f}" for k, v in extras.items()})
                log.write(_loss_line(step, loss, extras, optimizer.param_groups[0]["lr"]))
                log.flush()
                finished = progress(step, cfg.steps, seconds(), cfg.budget_minutes) >= 1.0
                out_of_time = cfg.max_minutes is not None and time.monotonic() - started > 60 * cfg.max_minutes
                if step % cfg.checkpoint_every == 0 or finished or out_of_time:
                    save(step)
                if out_of_time:
                    break
        bar.close()
        return step

    def _step(
        self, step: int, done: float, batch_loss: Callable[[float], tuple[torch.Tensor, dict[str, float]]]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One optimiser step at the schedule's learning rate, gradients clipped at 1; the batch's loss and extras."""
        cfg, model, optimizer = self.cfg, self.checkpoints.model, self.checkpoints.optimizer
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, done, cfg.lr, cfg.min_lr, cfg.warmup_steps)
        loss, extras = batch_loss(done)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss, extras


def _loss_line(step: int, loss: torch.Tensor, extras: dict[str, float], lr: float) -> str:
    """One ``loss.jsonl`` line, with no clock: a resumed run's log equals the uninterrupted one's (time is at checkpoints)."""
    return (
        json.dumps(
            {
                "step": step,
                "loss": round(loss.item(), 5),
                **{k: round(v, 5) for k, v in extras.items()},
                "lr": lr,
            }
        )
        + "\n"
    )
