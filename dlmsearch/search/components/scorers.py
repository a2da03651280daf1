"""Scorers: how good is a hypothesis state, judged from its rollout's evaluation."""

from __future__ import annotations

from typing import Protocol

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_type, number


class Scorer(Protocol):
    def score(
        self, canvas: Canvas, evaluation: Evaluation, layout: Layout, committed_log_confidence: torch.Tensor
    ) -> torch.Tensor:
        """``[R]`` scores of states ``canvas`` evaluated as ``evaluation``.

        ``committed_log_confidence`` is the mean log-confidence of the tokens committed in the
        transition that produced the state (for ETE's first hypothesis step: ``log c_t^j``).
        """


@attrs.define
class UnlockGainScorer:
    """ETE's ``s(j) = alpha * log c_t^j + log sum_{i in S(j)} c^i * 1[c^i >= C]``.

    S(j) is the still-masked positions of unlocked blocks. When no position reaches C the sum
    is empty; it is floored at ``empty_floor`` so that such hypotheses rank below every
    hypothesis that unlocks something, and among themselves by their own confidence.
    """

    threshold: float = number(float, 0.0, 1.0, default=0.9)
    alpha: float = attrs.field(default=1.0, validator=check_type(float))
    empty_floor: float = number(float, 1e-30, 1.0, default=1e-6)

    def score(
        self, canvas: Canvas, evaluation: Evaluation, layout: Layout, committed_log_confidence: torch.Tensor
    ) -> torch.Tensor:
        pool = canvas.masked & canvas.unlocked(layout) & (evaluation.confidence >= self.threshold)
        mass = torch.where(pool, evaluation.confidence, 0.0).sum(dim=1)
        return self.alpha * committed_log_confidence + torch.log(mass.clamp(min=self.empty_floor))


@attrs.define
class MeanLogConfidenceScorer:
    """Mean log-confidence over the masked positions of unlocked blocks (0 when none remain)."""

    alpha: float = attrs.field(default=0.0, validator=check_type(float))

    def score(
        self, canvas: Canvas, evaluation: Evaluation, layout: Layout, committed_log_confidence: torch.Tensor
    ) -> torch.Tensor:
        pool = canvas.masked & canvas.unlocked(layout)
        logs = torch.where(pool, torch.log(evaluation.confidence.clamp(min=1e-30)), 0.0).sum(dim=1)
        return self.alpha * committed_log_confidence + logs / pool.sum(dim=1).clamp(min=1)
