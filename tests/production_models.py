"""Models that misbehave on purpose, loadable from Hydra (``model._target_=production_models.X``)."""

from __future__ import annotations

import torch
from torch import nn

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.loading import load_denoiser


class FailsAbove(nn.Module):
    """Raises when a forward has more than ``rows`` rows (lookahead batches), else defers."""

    def __init__(self, inner: nn.Module, rows: int) -> None:
        super().__init__()
        self.inner, self.rows = inner, rows

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids.shape[0] > self.rows:
            raise RuntimeError(f"refusing {input_ids.shape[0]} rows (simulated fault)")
        return self.inner(input_ids, attention_mask)


class PoisonsClue(nn.Module):
    """NaN logits for any row whose first cell holds the given token (one bad puzzle)."""

    def __init__(self, inner: nn.Module, token: int) -> None:
        super().__init__()
        self.inner, self.token = inner, token

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.inner(input_ids, attention_mask)
        return torch.where((input_ids[:, :1] == self.token)[..., None], torch.nan, logits)


def faulty_sudoku(
    kind: str,
    value: int,
    path: str | None = None,
    mask_id: int = 9,
    vocab_size: int = 10,
    device: str = "cpu",
    dtype: str = "float32",
) -> ModelAdapter:
    """The shipped Sudoku model wrapped in ``FailsAbove`` (kind=rows) or ``PoisonsClue`` (kind=clue)."""
    adapter = load_denoiser(path, mask_id, vocab_size, device, dtype)
    adapter.module = FailsAbove(adapter.module, value) if kind == "rows" else PoisonsClue(adapter.module, value)
    return adapter
