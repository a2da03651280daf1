"""Held-out measurements taken at each training checkpoint."""

from __future__ import annotations

import torch

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.denoiser import BidirectionalDenoiser
from dlmsearch.search.driver import DecodeRequest
from dlmsearch.search.engine import RolloutEngine
from dlmsearch.tasks.sudoku import SUDOKU_MASK_ID, SUDOKU_VOCAB, SudokuTask, puzzle_item
from dlmsearch.tasks.sudoku_files import SudokuPuzzle


@torch.no_grad()
def checkpoint_solve_rate(model: BidirectionalDenoiser, puzzles: list[SudokuPuzzle], decoder: str) -> dict[str, float]:
    """Solve rate and mean steps of a decoder preset on held-out puzzles, with the model in memory."""
    cfg = compose([f"+decoder={decoder}"])
    search = build(cfg, "decoder")
    engine = RolloutEngine(adapter=ModelAdapter(module=model, mask_id=SUDOKU_MASK_ID, vocab_size=SUDOKU_VOCAB))
    task = SudokuTask()
    items = [puzzle_item(p) for p in puzzles]
    results = search.decode(engine, [DecodeRequest(uid=u, prompt=i.prompt, generation=i.generation) for u, i in enumerate(items)], task.block_length)
    solved = [task.judge(item, result.tokens) for item, result in zip(items, results)]
    return {
        "decoder": decoder,
        "puzzles": len(items),
        "solved": round(sum(solved) / len(solved), 4),
        "mean_steps": round(sum(r.steps for r in results) / len(results), 2),
    }
