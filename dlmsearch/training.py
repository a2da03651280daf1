"""Held-out measurements taken at each training checkpoint."""

from __future__ import annotations

import numpy as np
import torch

from dlmsearch.models.denoiser import BidirectionalDenoiser
from dlmsearch.tasks.sudoku import SUDOKU_MASK_ID, grids_to_tokens
from dlmsearch.tasks.sudoku_files import SudokuPuzzle


@torch.no_grad()
def checkpoint_solve_rate(model: BidirectionalDenoiser, puzzles: list[SudokuPuzzle], decoder: str) -> dict[str, float]:
    """One-shot cell accuracy on the blanks of held-out puzzles (a quick denoising measure)."""
    tokens = grids_to_tokens(np.stack([p.puzzle for p in puzzles]))
    target = grids_to_tokens(np.stack([p.solution for p in puzzles]))
    blanks = tokens == SUDOKU_MASK_ID
    predicted = model(tokens).argmax(-1)
    return {"blank_cell_accuracy": round(float((predicted[blanks] == target[blanks]).float().mean()), 4)}
