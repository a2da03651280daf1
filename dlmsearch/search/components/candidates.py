"""Candidate generators: which masked positions to try committing as lookahead hypotheses."""

from __future__ import annotations

import math
from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_choice, check_type, number


class CandidateGenerator(Protocol):
    k: int
    statistics: ClassVar[frozenset[str]]  # what the engine must compute for it beyond token and confidence
    commits: int | None  # a tree's moves: None, one commit each ([R, k]); K, up to K commits each ([R, k, K])

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [R, k]`` and ``valid [R, k]`` (False where a row has fewer than k eligible)."""

    def moves(
        self, canvas: Canvas, evaluation: Evaluation, layout: Layout
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A tree search's actions: each move's positions, tokens and the model's probabilities of them,
        and which moves exist (shapes by ``commits``)."""


class PositionMoves:
    """What a generator that proposes positions alone gives a tree search: each position a move that
    commits the evaluation's token there."""

    commits: ClassVar[int | None] = None

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def moves(
        self, canvas: Canvas, evaluation: Evaluation, layout: Layout
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[R, k]`` each proposed position, the evaluation's token and confidence there, and which exist."""
        position, valid = self.propose(canvas, evaluation, layout)
        return position, evaluation.token.gather(1, position), evaluation.confidence.gather(1, position), valid


def top_k_positions(scores: torch.Tensor, eligible: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Best ``k`` eligible columns per row, best first."""
    ranked = torch.where(eligible, scores, -math.inf)
    k = min(k, ranked.shape[1])
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices[:, :k]
    return order, eligible.gather(1, order)


def _eligible(canvas: Canvas, layout: Layout) -> torch.Tensor:
    return canvas.masked & canvas.unlocked(layout)


@attrs.define
class InfoBandCandidates(PositionMoves):
    """ETE: top-k masked positions (unlocked blocks) by ``-|c - c_info| + beta * (i - block start)``."""

    statistics: ClassVar[frozenset[str]] = frozenset()
    k: int = number(int, 1, default=4)
    c_info: float = number(float, 0.0, 1.0, default=0.2)
    beta: float = attrs.field(default=0.0, validator=check_type(float))

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        relative = torch.arange(canvas.tokens.shape[1])[None, :] - canvas.block_start(layout)[:, None]
        scores = -(evaluation.confidence - self.c_info).abs() + self.beta * relative
        return top_k_positions(scores, _eligible(canvas, layout), self.k)


@attrs.define
class TopConfidenceCandidates(PositionMoves):
    """The k most confident masked positions."""

    statistics: ClassVar[frozenset[str]] = frozenset()
    k: int = number(int, 1, default=4)

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        return top_k_positions(evaluation.confidence, _eligible(canvas, layout), self.k)


@attrs.define
class RandomCandidates(PositionMoves):
    """k masked positions at random (seeded by the engine's counter-based draw)."""

    statistics: ClassVar[frozenset[str]] = frozenset({"uniform"})
    k: int = number(int, 1, default=4)

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        return top_k_positions(evaluation.uniform, _eligible(canvas, layout), self.k)


@attrs.define
class PositionTokenCandidates:
    """Order-Token Search's joint moves (arXiv 2601.20339): for each of ``positions`` masked positions
    (the least certain, or the most), its two most likely tokens, one action each (``k = 2 * positions``).
    A tree search reads :meth:`moves`; as a lookahead's generator it proposes the positions (each twice)."""

    statistics: ClassVar[frozenset[str]] = frozenset({"runner_up", "runner_up_confidence"})
    commits: ClassVar[int | None] = None
    positions: int = number(int, 1, default=2)
    pick: str = attrs.field(default="least_confident", validator=check_choice("least_confident", "most_confident"))

    @property
    def k(self) -> int:
        return 2 * self.positions

    def _positions(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        scores = evaluation.confidence if self.pick == "most_confident" else -evaluation.confidence
        return top_k_positions(scores, _eligible(canvas, layout), self.positions)

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        positions, valid = self._positions(canvas, evaluation, layout)
        return positions.repeat_interleave(2, dim=1), valid.repeat_interleave(2, dim=1)

    def moves(
        self, canvas: Canvas, evaluation: Evaluation, layout: Layout
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[R, k]`` each move's position, token and the model's probability of it, and which exist."""
        assert evaluation.runner_up is not None and evaluation.runner_up_confidence is not None
        positions, valid = self._positions(canvas, evaluation, layout)
        tokens = torch.stack(
            [evaluation.token.gather(1, positions), evaluation.runner_up.gather(1, positions).long()], -1
        )
        probability = torch.stack(
            [evaluation.confidence.gather(1, positions), evaluation.runner_up_confidence.gather(1, positions)], -1
        )
        return (
            positions.repeat_interleave(2, dim=1),
            tokens.flatten(1),
            probability.flatten(1),
            valid.repeat_interleave(2, dim=1),
        )
