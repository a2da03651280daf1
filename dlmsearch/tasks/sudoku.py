"""The Sudoku task: puzzles as canvases, the solved-grid check, and board rendering.

Cells are tokens ``digit - 1`` (0..8); the mask token is 9. Clues sit in the canvas as
committed tokens, blanks as masks, and there is no prompt: the whole 81-cell grid is one
block, and the frontier is every masked cell (Sudoku has no left-to-right order).
"""

from __future__ import annotations

import numpy as np
import torch

SUDOKU_VOCAB = 10
SUDOKU_MASK_ID = 9


def grids_to_tokens(grids: np.ndarray) -> torch.Tensor:
    """Grids ``[n, 81]`` (0 = blank) to token ids with blanks as the mask token."""
    grids = torch.as_tensor(np.asarray(grids, dtype=np.int64))
    return torch.where(grids == 0, SUDOKU_MASK_ID, grids - 1)


def tokens_to_grids(tokens: torch.Tensor) -> np.ndarray:
    """Token ids back to digits; masked cells become 0."""
    tokens = tokens.detach().cpu().long()
    return torch.where(tokens == SUDOKU_MASK_ID, 0, tokens + 1).numpy().astype(np.int8)
