"""Macro moves: a tree search's actions as whole steps of a rule (UnMaskFork, arXiv 2602.04344).

UnMaskFork searches over moves "apply preset X at temperature T for a while" instead of one
commit at a time, so that a tree of few levels reaches far. Here a move is one step of a rule
read off the node's own evaluation: the ``k`` masked positions its ``ordering`` ranks first (the
commit rules' orderings: LLaDA's confidence, Dream's margin and entropy), or those at confidence
``threshold`` or above (Fast-dLLM's rule, at least one, at most ``k``), each with the node's token.
A move therefore costs what a single commit costs: the one forward that evaluates its child, and
the budget stays in row-forwards.

A move at ``temperature`` > 0 draws each token from the position's two most likely (the
evaluation keeps no more: the engine's ``runner_up``), with probabilities ``p ** (1 / T)``
renormalised: top-2 sampling at ``T``. At ``alg_temp`` > 0 it draws its positions too, with
probabilities ``softmax(score / alg_temp)`` without replacement (Dream's ``alg_temp``, Gumbel-top-k).
The draws are the node's seeded uniforms (keyed by the sample, its call, the node and the position:
batch-invariant), rehashed with the move's index so that two sampled moves draw apart.

Moves that make the same commits as an earlier move are dropped (no two children of one node are
the same canvas); a node whose moves all coincide has one action, which the tree does not search.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import attrs
import torch

from dlmsearch.search.components.commit import ordering_scores, sampled_order, statistics_for
from dlmsearch.search.records.randomness import hashed_uniform
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.search.records.tree import UNSET
from dlmsearch.validation import check_choice, number

TOKEN_DRAW, POSITION_DRAW = 1, 2  # the streams a move's draws are rehashed with


@attrs.frozen
class MacroMove:
    """One move (module doc): ``k`` commits by ``ordering`` (or those at ``threshold``, at most ``k``),
    tokens at ``temperature`` (0: the evaluation's), positions at ``alg_temp`` (0: the ordering's)."""

    ordering: str = attrs.field(default="confidence", validator=check_choice("confidence", "margin", "neg_entropy"))
    k: int = number(int, 1, default=2)
    threshold: float | None = number(float, 0.0, 1.0, optional=True, default=None)
    temperature: float = number(float, 0.0, default=0.0)
    alg_temp: float = number(float, 0.0, default=0.0)

    @property
    def statistics(self) -> frozenset[str]:
        """What the engine computes for it: the ordering's statistic, and the draws and the runner-up where it samples."""
        sampled = {"uniform"} if self.temperature > 0 or self.alg_temp > 0 else set()
        runner = {"runner_up", "runner_up_confidence"} if self.temperature > 0 else set()
        return statistics_for(self.ordering) | sampled | runner

    def commits(
        self, canvas: Canvas, evaluation: Evaluation, eligible: torch.Tensor, index: int, width: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[R, width]`` the positions (UNSET past the move's commits), tokens and their probabilities,
        in position order; ``index``: the move's place among the generator's (keys its draws)."""
        scores = ordering_scores(evaluation, self.ordering)
        if self.alg_temp > 0:
            scores = sampled_order(scores, eligible, _rehashed(evaluation, index, POSITION_DRAW), self.alg_temp)
        count = torch.full((canvas.rows,), self.k, dtype=torch.long)
        if self.threshold is not None:
            count = (eligible & (evaluation.confidence >= self.threshold)).sum(dim=1).clamp(min=1, max=self.k)
        count = torch.minimum(count, eligible.sum(dim=1))
        ranked = torch.where(eligible, scores, -math.inf)
        order = torch.sort(ranked, dim=1, descending=True, stable=True).indices[:, :width]
        made = torch.arange(order.shape[1])[None, :] < count[:, None]
        position = torch.sort(torch.where(made, order, canvas.tokens.shape[1]), dim=1).values  # position order
        made = position < canvas.tokens.shape[1]
        at = position.clamp(max=canvas.tokens.shape[1] - 1)
        token, probability = evaluation.token.gather(1, at), evaluation.confidence.gather(1, at)
        if self.temperature > 0:
            token, probability = self._sampled(canvas, evaluation, at, token, probability, index)
        pad = width - position.shape[1]  # fewer columns than commits: pad
        position, token, probability = (
            torch.nn.functional.pad(torch.where(made, v, fill), (0, pad), value=fill)
            for v, fill in ((position, UNSET), (token, 0), (probability, 0.0))
        )
        return position, token, probability

    def _sampled(
        self,
        canvas: Canvas,
        evaluation: Evaluation,
        at: torch.Tensor,
        token: torch.Tensor,
        probability: torch.Tensor,
        index: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each commit's token drawn between the two most likely at ``temperature`` (never the mask id).

        Args:
            canvas: the nodes' canvases (their masked positions hold the mask id).
            evaluation: the nodes' evaluations (with the runner-up and the draws).
            at: ``[R, K]`` the commits' positions.
            token: ``[R, K]`` the most likely tokens there.
            probability: ``[R, K]`` their probabilities.
            index: the move's place among the generator's.
        """
        assert evaluation.runner_up is not None and evaluation.runner_up_confidence is not None
        runner = evaluation.runner_up.gather(1, at).long()
        runner_p = evaluation.runner_up_confidence.gather(1, at)
        first, second = (p.clamp(min=1e-30).log() / self.temperature for p in (probability, runner_p))
        takes = _rehashed(evaluation, index, TOKEN_DRAW).gather(1, at) < torch.sigmoid(second - first)
        takes &= runner != canvas.tokens.gather(1, at)  # a masked position holds the mask id
        return torch.where(takes, runner, token), torch.where(takes, runner_p, probability)


def _rehashed(evaluation: Evaluation, index: int, stream: int) -> torch.Tensor:
    """``[R, T]`` uniforms of move ``index``'s ``stream``: the evaluation's seeded ones, hashed again."""
    assert evaluation.uniform is not None
    bits = torch.floor(evaluation.uniform.double() * 2.0**24).long()  # a float32 uniform's 24 bits
    return hashed_uniform([bits, torch.tensor(index), torch.tensor(stream)])


def _as_moves(moves: Iterable[MacroMove | Mapping]) -> tuple[MacroMove, ...]:
    """The moves from their YAML (mappings) or as records."""
    return tuple(m if isinstance(m, MacroMove) else MacroMove(**dict(m)) for m in moves)


def _not_empty(instance: object, attribute: attrs.Attribute, value: tuple) -> None:
    if not value:
        raise ValueError("decoder.candidates.macros needs at least one move")


@attrs.define
class MacroMoves:
    """UnMaskFork's moves for a tree search (module doc): one action per move of ``macros``, each up to
    its ``k`` commits; as a lookahead's generator it proposes each move's first position."""

    macros: tuple[MacroMove, ...] = attrs.field(converter=_as_moves, validator=_not_empty)

    @property
    def k(self) -> int:
        """Actions per node: one per move."""
        return len(self.macros)

    @property
    def commits(self) -> int:
        """``K``: the most commits one move makes (the tree's last axis)."""
        return max(m.k for m in self.macros)

    @property
    def statistics(self) -> frozenset[str]:
        return frozenset().union(*(m.statistics for m in self.macros))

    def propose(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        position, _, _, valid = self.moves(canvas, evaluation, layout)
        return position[:, :, 0].clamp(min=0), valid

    def moves(
        self, canvas: Canvas, evaluation: Evaluation, layout: Layout
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[R, A, K]`` each move's positions (UNSET past its commits), tokens and their probabilities,
        and ``[R, A]`` which moves exist (some commit made, and not the same commits as an earlier move)."""
        eligible = canvas.masked & canvas.unlocked(layout)
        made = [m.commits(canvas, evaluation, eligible, i, self.commits) for i, m in enumerate(self.macros)]
        position, token, probability = (torch.stack(parts, dim=1) for parts in zip(*made))
        valid = (position >= 0).any(dim=2)
        same = ((position[:, :, None] == position[:, None]) & (token[:, :, None] == token[:, None])).all(dim=3)
        earlier = torch.ones(self.k, self.k, dtype=torch.bool).tril(diagonal=-1)  # [b, a]: a before b
        repeated = (same & valid[:, None, :] & earlier[None]).any(dim=2)
        return position, token, probability, valid & ~repeated
