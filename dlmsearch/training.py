"""Held-out measurements taken at each training checkpoint, with the model still in memory."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.denoiser import BidirectionalDenoiser
from dlmsearch.search.driver import DecodeRequest
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
    return {"decoder": decoder, "puzzles": found["items"], "solved": found["accuracy"], "mean_steps": found["mean_steps"]}


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
    """Drop records past the checkpoint being resumed, so no step is logged twice."""
    if path.exists():
        lines = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in lines))
