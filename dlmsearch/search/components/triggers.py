"""Triggers: does a row's state need exploration before the next commit?"""

from __future__ import annotations

from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_choice, number


class Trigger(Protocol):
    explores: bool  # False only for the trigger that never fires: the driver skips lookahead set-up

    def fires(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[R]`` bool."""


@attrs.define
class NeverTrigger:
    """No exploration: the search degenerates into its base commit rule (the baselines)."""

    explores: ClassVar[bool] = False

    def fires(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        return torch.zeros(canvas.rows, dtype=torch.bool)


@attrs.define
class AlwaysTrigger:
    """Explore before every commit while masks remain."""

    explores: ClassVar[bool] = True

    def fires(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        return canvas.masked.any(dim=1)


@attrs.define
class FrontierConfidenceTrigger:
    """ETE's rule: explore when the mean confidence over the frontier is below ``gamma`` and more
    than ``min_masked`` (N_e) positions are still masked.

    ``frontier=midpoint``: masked positions of the current block before its midpoint (falling
    back to the whole current block once that half is decoded). ``frontier=all_masked``: every
    masked position, for tasks without a left-to-right order such as Sudoku.
    """

    gamma: float = number(float, 0.0, 1.0, default=0.8)
    min_masked: int = number(int, 0, default=0)
    frontier: str = attrs.field(default="midpoint", validator=check_choice("midpoint", "all_masked"))
    explores: ClassVar[bool] = True

    def frontier_mask(self, canvas: Canvas, layout: Layout) -> torch.Tensor:
        if self.frontier == "all_masked":
            return canvas.masked
        current = canvas.masked & canvas.in_current_block(layout)
        midpoint = canvas.block_start(layout) + layout.block_length // 2
        columns = torch.arange(canvas.tokens.shape[1])[None, :]
        front = current & (columns < midpoint[:, None])
        return torch.where(front.any(dim=1, keepdim=True), front, current)

    def fires(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        frontier = self.frontier_mask(canvas, layout)
        count = frontier.sum(dim=1)
        mean = torch.where(frontier, evaluation.confidence, 0.0).sum(dim=1) / count.clamp(min=1)
        return (count > 0) & (mean < self.gamma) & (canvas.masked.sum(dim=1) > self.min_masked)


@attrs.define
class LowConfidenceTrigger:
    """Explore only where the model is unsure: the most confident position the base rule could
    commit (masked, in an unlocked block) is below ``threshold``. Paired with a threshold rule at the
    same value, a sample searches exactly where the rule would fall back to its one forced commit."""

    threshold: float = number(float, 0.0, 1.0, default=0.9)
    explores: ClassVar[bool] = True

    def fires(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        eligible = canvas.masked & canvas.unlocked(layout)
        top = torch.where(eligible, evaluation.confidence, -1.0).max(dim=1).values
        return eligible.any(dim=1) & (top < self.threshold)


@attrs.define
class FirstCommitsTrigger:
    """MEDAL's placement: explore only while fewer than ``commits`` positions of the generation have
    been committed (the early commits decide the most), then the base rule alone."""

    commits: int = number(int, 1, default=8)
    explores: ClassVar[bool] = True

    def fires(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        decided = (canvas.commit_call[:, layout.gen_start :] >= 0).sum(dim=1)
        return canvas.masked.any(dim=1) & (decided < self.commits)
