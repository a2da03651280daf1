"""The step of a model without a mask token: DiffusionGemma's denoising of a block of uniform noise.

Each step decides the current block whole (what it does not keep is drawn afresh at the model's
boundary) and holds the block until a step finishes it with its draft; a lookahead branch keeps its
candidate beside the step's keep-set and stops at the block it finishes.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from dlmsearch.core.temperature import COMMIT_RULE, TemperatureOwner
from dlmsearch.search.components.bound import with_layout
from dlmsearch.search.components.commit import StepAt
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_type, number


@attrs.define
class UniformNoiseSteps:
    """DiffusionGemma's denoising step (transformers ``generation_diffusion_gemma.py``, Apache-2.0:
    ``EntropyBoundSampler.accept_canvas``, ``LinearTemperatureScheduleLogitsProcessor``,
    ``StableAndConfidentStoppingCriteria``; the loop step by step: docs/diffusion_gemma.md).

    Every step decides the whole block afresh (the current block; :meth:`Canvas.decide_block`). Step
    ``n`` counts down from ``max_steps`` (``N``) at the block's first step; the engine samples
    every position at ``t = t_min + (t_max - t_min) * n / N`` (:meth:`temperature`, float32 as the
    reference computes it). **Keep-set (EB-Sampler over all positions):** sort the positions by
    the entropy ``H`` of their tempered distribution, ascending (ties: lower column first, a stable
    sort; the reference's ``torch.sort`` leaves them unspecified), and keep sorted position ``i``
    iff ``sum_{j<i} H_j <= entropy_bound``, so the lowest-entropy position is always kept. Kept
    positions take their new sample; every other one is re-noised, kept earlier or not.
    **Block end:** the block is finished with its draft (``argmax`` of the step's logits,
    not the sample) when it is stable (the draft repeated ``stability_threshold`` steps in a row,
    never at its first step) and confident (the mean entropy over the block below
    ``confidence_threshold``), or after ``N`` steps; ``stopping=false``: always ``N`` steps.
    """

    entropy_bound: float = number(float, 0.0, default=0.1, open_low=True)
    max_steps: int = number(int, 1, default=48)
    t_min: float = number(float, 0.0, default=0.4, open_low=True)
    t_max: float = number(float, 0.0, default=0.8, open_low=True)
    stopping: bool = attrs.field(default=True, validator=check_type(bool))
    stability_threshold: int = number(int, 0, default=1)
    confidence_threshold: float = number(float, 0.0, default=0.005)
    block_budget: int | None = attrs.field(init=False, default=None)
    statistics: ClassVar[frozenset[str]] = frozenset({"tempered_entropy", "draft", "draft_confidence", "repeats"})
    row_options: ClassVar[tuple[str, ...]] = ()
    holds_block: ClassVar[bool] = False
    whole_prefix: ClassVar[bool] = False
    decides_whole_block: ClassVar[bool] = True

    def __attrs_post_init__(self) -> None:
        if self.t_max <= self.t_min:
            raise ValueError(
                f"decoder.commit.t_max={self.t_max} must be above t_min={self.t_min}: the temperature falls from "
                "t_max (a block's first step) to t_min (its last)"
            )

    def bind(self, layout: Layout) -> UniformNoiseSteps:
        """At most ``max_steps`` rounds per block (the plan's bound on a decode's rounds)."""
        return with_layout(self, block_budget=self.max_steps)

    def temperature(self, canvas: Canvas) -> torch.Tensor:
        """``[R]`` each row's temperature at its step ``n = N - rounds spent on the block``."""
        step = (self.max_steps - canvas.block_round).to(torch.int32)
        return self.t_min + (self.t_max - self.t_min) * (step / self.max_steps)

    @property
    def temperature_owner(self) -> TemperatureOwner:
        """The rule decides every row's temperature (:meth:`temperature`): the plan refuses one set elsewhere."""
        return TemperatureOwner(
            COMMIT_RULE,
            f"commit rule UniformNoiseSteps (schedule {self.t_max}→{self.t_min} over each canvas's steps)",
            f"{self.t_max}→{self.t_min}",
            "set decoder.commit.t_max and decoder.commit.t_min instead (the first and last step's)",
        )

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[R, T]`` the keep-set: the EB-Sampler's prefix of the current block by ascending entropy
        (``cumsum(H)_i - H_i <= bound``, the reference's float32 arithmetic)."""
        assert evaluation.tempered_entropy is not None
        columns = _block_columns(canvas, layout)
        ordered, order = torch.sort(evaluation.tempered_entropy.gather(1, columns), dim=1, stable=True)
        keep_sorted = ordered.cumsum(dim=1) - ordered <= self.entropy_bound
        keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
        return torch.zeros_like(canvas.masked).scatter(1, columns, keep)

    def finishes(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[R]`` rows whose block ends this step: stable and confident, or its last step."""
        last = canvas.block_round + 1 >= self.max_steps
        if not self.stopping:
            return last
        assert evaluation.tempered_entropy is not None and evaluation.repeats is not None
        columns = _block_columns(canvas, layout)
        mean = evaluation.tempered_entropy.gather(1, columns).mean(dim=1)
        stable = evaluation.repeats.gather(1, columns[:, :1]).squeeze(1) >= self.stability_threshold
        return last | (stable & (mean < self.confidence_threshold))

    def prepare(self, canvas: Canvas) -> Canvas:
        """Every row starts on its first block, held until a step finishes it."""
        zeros = torch.zeros(canvas.rows, dtype=torch.long)
        return attrs.evolve(canvas, block=zeros, block_round=zeros, held=torch.ones_like(canvas.held))

    def step(self, canvas: Canvas, evaluation: Evaluation, at: StepAt) -> tuple[Canvas, torch.Tensor]:
        """Keep the keep-set and re-noise the rest of the block (or finish it with its draft); a lookahead
        branch stops at the block it finishes. The keep-set is what the step decided."""
        return self._decide(canvas, evaluation, at, None)

    def open_branch(self, canvas: Canvas, evaluation: Evaluation, at: StepAt, candidate: torch.Tensor) -> Canvas:
        """The step with the ``candidate`` kept beside the keep-set."""
        return self._decide(canvas, evaluation, at, candidate)[0]

    def forced(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """Rows whose next step finishes their block: every branch would be the same block (the draft)."""
        return self.finishes(canvas, evaluation, layout)

    def settled(self, canvas: Canvas, layout: Layout) -> torch.Tensor:
        """A branch that finished its block (only its slot's root encodes a block and moves on)."""
        return canvas.block_finished(layout)

    def move_on(self, canvas: Canvas, layout: Layout) -> tuple[Canvas, torch.Tensor]:
        """Adopted branches that finished their block move to the next, as a root's step moves it."""
        return canvas.advance_blocks(layout, self), canvas.block_finished(layout)

    def _decide(
        self, canvas: Canvas, evaluation: Evaluation, at: StepAt, also_keep: torch.Tensor | None
    ) -> tuple[Canvas, torch.Tensor]:
        """One step's update, and ``[R, T]`` the keep-set: the keep-set takes its samples and the rest is
        re-noised, or a finished block takes its draft whole, recorded with the draft's probability; the
        row moves to the next block unless the step is a lookahead branch's (only a root encodes a block).
        ``also_keep``: ``[R, T]`` positions kept beside the keep-set (a branch's candidate)."""
        assert evaluation.draft is not None and evaluation.draft_confidence is not None
        layout = at.layout
        done = self.finishes(canvas, evaluation, layout)
        block = canvas.in_current_block(layout) & canvas.attention
        selected = self.select(canvas, evaluation, layout)
        chosen = selected if also_keep is None else selected | (also_keep & block)
        keep = torch.where(done[:, None], block, chosen)
        token = torch.where(done[:, None], evaluation.draft.long(), evaluation.token)
        confidence = torch.where(done[:, None], evaluation.draft_confidence, evaluation.confidence)
        advance = at.advance and at.depth == 0
        decided = canvas.decide_block(
            keep, done, token, confidence, at.call, layout, self, at.mask_id, at.depth, at.branch, advance
        )
        return decided, selected


def _block_columns(canvas: Canvas, layout: Layout) -> torch.Tensor:
    """``[R, block_length]`` the columns of each row's current block."""
    return canvas.block_start(layout)[:, None] + torch.arange(layout.block_length)[None, :]
