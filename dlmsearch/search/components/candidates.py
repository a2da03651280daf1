"""Candidate generators: which masked positions to try committing as lookahead hypotheses."""

from __future__ import annotations

import math
from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_type, number


class CandidateGenerator(Protocol):
    k: int
    statistics: ClassVar[frozenset[str]]  # what the engine must compute for it beyond token and confidence

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [R, k]`` and ``valid [R, k]`` (False where a row has fewer than k eligible)."""


def top_k_positions(scores: torch.Tensor, eligible: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best ``k`` eligible columns per row, best first."""
    ranked = torch.where(eligible, scores, -math.inf)
    k = min(k, ranked.shape[1])
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices[:, :k]
    return order, eligible.gather(1, order)


def _eligible(canvas: Canvas, layout: Layout) -> torch.Tensor:
    return canvas.masked & canvas.unlocked(layout)


@attrs.define
class InfoBandCandidates:
    """ETE: top-k masked positions (unlocked blocks) by ``-|c - c_info| + beta * (i - block start)``."""

    statistics: ClassVar[frozenset[str]] = frozenset()
    k: int = number(int, 1, default=4)
    c_info: float = number(float, 0.0, 1.0, default=0.2)
    beta: float = attrs.field(default=0.0, validator=check_type(float))

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        relative = torch.arange(canvas.tokens.shape[1])[None, :] - layout.block_start(canvas.block)[:, None]
        scores = -(evaluation.confidence - self.c_info).abs() + self.beta * relative
        return top_k_positions(scores, _eligible(canvas, layout), self.k)


@attrs.define
class TopConfidenceCandidates:
    """The k most confident masked positions."""

    statistics: ClassVar[frozenset[str]] = frozenset()
    k: int = number(int, 1, default=4)

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        return top_k_positions(evaluation.confidence, _eligible(canvas, layout), self.k)


@attrs.define
class RandomCandidates:
    """k masked positions at random (seeded by the engine's counter-based draw)."""

    statistics: ClassVar[frozenset[str]] = frozenset({"uniform"})
    k: int = number(int, 1, default=4)

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        return top_k_positions(evaluation.uniform, _eligible(canvas, layout), self.k)
