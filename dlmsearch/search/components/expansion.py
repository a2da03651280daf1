"""Expansion policies: after scoring the hypotheses at some depth, roll them one step deeper?"""

from __future__ import annotations

import math
from typing import Protocol

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_choice, check_type, number


class ExpansionPolicy(Protocol):
    max_depth: int
    accumulate: bool  # branch score = sum over depths (True) or the last depth's (False)

    def for_roots(self, root: Canvas, evaluation: Evaluation, layout: Layout) -> ExpansionPolicy:
        """The policy for one lookahead from these roots (the rows of ``root``): a policy that
        decides from the root evaluation binds it here; one that decides from scores returns itself."""

    def should_continue(self, scores: torch.Tensor, live: torch.Tensor, depth: int) -> torch.Tensor:
        """``[S]`` bool for scores ``[S, K]`` of the live branches at ``depth`` (< max_depth)."""


class DecidesFromScores:
    """For policies that need nothing from the root: ``for_roots`` is the policy itself."""

    def for_roots(self, root: Canvas, evaluation: Evaluation, layout: Layout) -> DecidesFromScores:
        return self


@attrs.define
class FixedDepth(DecidesFromScores):
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
class VarianceGate(DecidesFromScores):
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


@attrs.define
class ConfidenceDepth:
    """The practitioner guide's heuristic: each exploring sample's rollout depth from the root's
    top confidence ``c`` (the most confident masked position the base rule could commit, i.e. in
    the unlocked blocks): ``c > high`` rolls 1 step, ``c > mid`` rolls ``mid_depth`` steps (at
    most ``max_depth``), anything else ``max_depth`` (the guide: 0.9, 0.7, 3 and 5).

    The depth is decided once per lookahead from the root evaluation, which ``should_continue``
    does not see. ``for_roots(root, evaluation, layout)`` returns a copy bound to those samples, whose
    ``should_continue`` rolls each sample to its own depth; the driver calls every policy's
    ``for_roots`` at the start of every lookahead. An unbound copy cannot decide and says so instead of guessing.
    """

    high: float = number(float, 0.0, 1.0, default=0.9)
    mid: float = number(float, 0.0, 1.0, default=0.7)
    mid_depth: int = number(int, 1, default=3)
    max_depth: int = number(int, 1, default=5)
    accumulate: bool = attrs.field(default=False, validator=check_type(bool))
    # [S] each sample's depth, set by for_roots()
    depths: torch.Tensor | None = attrs.field(default=None, kw_only=True, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.mid > self.high:
            raise ValueError(f"mid must not exceed high, got mid={self.mid} > high={self.high}")

    @staticmethod
    def top_confidence(root: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[S]`` the highest confidence over each row's masked positions in unlocked blocks (-inf if none)."""
        eligible = root.masked & root.unlocked(layout)
        return torch.where(eligible, evaluation.confidence, -math.inf).max(dim=1).values

    def depth_for(self, top: torch.Tensor) -> torch.Tensor:
        """``[S]`` long rollout depth for top confidences ``[S]``."""
        middle = torch.full_like(top, min(self.mid_depth, self.max_depth), dtype=torch.long)
        deepest = torch.full_like(top, self.max_depth, dtype=torch.long)
        return torch.where(top > self.high, 1, torch.where(top > self.mid, middle, deepest))

    def for_roots(self, root: Canvas, evaluation: Evaluation, layout: Layout) -> ConfidenceDepth:
        """A copy bound to the lookahead's samples (the rows of ``root``)."""
        return attrs.evolve(self, depths=self.depth_for(self.top_confidence(root, evaluation, layout)))

    def should_continue(self, scores: torch.Tensor, live: torch.Tensor, depth: int) -> torch.Tensor:
        if self.depths is None:
            raise RuntimeError(
                "ConfidenceDepth decides each sample's depth from the root evaluation: call its for_roots() at the start of a lookahead"
            )
        if self.depths.shape[0] != scores.shape[0]:
            raise RuntimeError(
                f"ConfidenceDepth was bound to {self.depths.shape[0]} samples but asked about {scores.shape[0]}"
            )
        return depth < self.depths
