"""Expansion policies: after scoring the hypotheses at some depth, roll them one step deeper?"""

from __future__ import annotations

from typing import Protocol

import attrs
import torch

from dlmsearch.validation import check_choice, check_type, number


class ExpansionPolicy(Protocol):
    max_depth: int
    accumulate: bool  # branch score = sum over depths (True) or the last depth's (False)

    def should_continue(self, scores: torch.Tensor, live: torch.Tensor, depth: int) -> torch.Tensor:
        """``[S]`` bool for scores ``[S, K]`` of the live branches at ``depth`` (< max_depth)."""


@attrs.define
class FixedDepth:
    """Always roll out to ``depth`` (``depth=1`` is ETE's one-step lookahead)."""

    depth: int = number(int, 1, default=1)
    accumulate: bool = attrs.field(default=False, validator=check_type(bool))

    @property
    def max_depth(self) -> int:
        return self.depth

    def should_continue(self, scores: torch.Tensor, live: torch.Tensor, depth: int) -> torch.Tensor:
        return torch.full((scores.shape[0],), depth < self.depth)


def live_variance(scores: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Population variance of each row's live scores (0 with fewer than two live)."""
    count = live.sum(dim=1).clamp(min=1)
    values = torch.where(live, scores, 0.0)
    mean = values.sum(dim=1) / count
    variance = torch.where(live, (scores - mean[:, None]) ** 2, 0.0).sum(dim=1) / count
    return torch.where(live.sum(dim=1) > 1, variance, 0.0)


@attrs.define
class VarianceGate:
    """AdaLook's gate: roll deeper only while the variance of the branch scores is above
    ``threshold`` (``continue_if=below`` flips the direction), up to ``max_depth``."""

    threshold: float = attrs.field(default=0.5, validator=check_type(float))
    max_depth: int = number(int, 1, default=3)
    continue_if: str = attrs.field(default="above", validator=check_choice("above", "below"))
    accumulate: bool = attrs.field(default=False, validator=check_type(bool))

    def should_continue(self, scores: torch.Tensor, live: torch.Tensor, depth: int) -> torch.Tensor:
        variance = live_variance(scores, live)
        if self.continue_if == "above":
            return variance > self.threshold
        return variance < self.threshold
