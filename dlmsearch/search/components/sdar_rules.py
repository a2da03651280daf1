"""SDAR's commit rules for block-diffusion models (``block_diffusion_generate`` of Gen-Verse/dLLM-RL and
JetAstra/SDAR's ``generate.py``): a fixed count of steps per block, and the entropy-bounded rule."""

from __future__ import annotations

import math
from typing import ClassVar

import attrs
import torch

from dlmsearch.search.components.commit import MaskFilling, top_k_mask
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_choice, number

SDAR_REMASKING = ("low_confidence_dynamic", "low_confidence_static", "sequential")


def even_split(block_length: int, steps: int, step: torch.Tensor) -> torch.Tensor:
    """``k_t`` of SDAR's ``get_num_transfer_tokens``: ``block_length`` split evenly over ``steps``,
    the first ``block_length mod steps`` steps one more; 0 past the last step."""
    base, extra = divmod(block_length, steps)
    return torch.where(step < steps, base + (step < extra).long(), 0)


@attrs.define
class BlockDiffusionSchedule(MaskFilling):
    """SDAR's rules (``block_diffusion_generate`` of Gen-Verse/dLLM-RL ``10b4fd1``, Apache-2.0;
    JetAstra/SDAR's ``generate.py``): ``steps`` denoising steps per block, step ``t`` committing
    about ``k_t`` (:func:`even_split` of the block length, whatever the block's prompt tokens):

    * ``low_confidence_dynamic`` (SDAR's default; threshold ``τ`` 0.9 in SDAR's README, 0.85 in
      the script): every masked position of the block with ``c > τ`` if there are at least ``k_t``
      of them, else the ``k_t`` most confident;
    * ``low_confidence_static``: the ``k_t`` most confident masked positions;
    * ``sequential``: the ``k_t`` leftmost masked positions.

    The block moves on once it has no mask. Departures, both where the reference loop's
    ``topk`` over a block with fewer masks than ``k_t`` takes given positions (the prompt's tokens
    in its partial last block) and writes its draws over them: here only masked positions are
    ever committed; ties go to the lower column (``torch.topk``'s order is unspecified).
    """

    steps: int = number(int, 1, default=4)
    remasking: str = attrs.field(default="low_confidence_dynamic", validator=check_choice(*SDAR_REMASKING))
    threshold: float = number(float, 0.0, 1.0, default=0.9)
    row_options: ClassVar[tuple[str, ...]] = ("threshold",)

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        eligible = canvas.masked & canvas.in_current_block(layout)
        k = even_split(layout.block_length, self.steps, canvas.block_round)
        if self.remasking == "sequential":
            leftmost = -torch.arange(eligible.shape[1], dtype=evaluation.confidence.dtype).expand_as(eligible)
            return top_k_mask(leftmost, eligible, k)
        top = top_k_mask(evaluation.confidence, eligible, k)
        if self.remasking == "low_confidence_static":
            return top
        high = eligible & (evaluation.confidence > self.threshold)
        return torch.where((high.sum(dim=1) >= k)[:, None], high, top)


@attrs.define
class EntropyBoundedRule(MaskFilling):
    """SDAR's ``entropy_bounded`` as its docs state it (JetAstra/SDAR ``generate.py``, MIT): order the
    block's masked positions by the entropy of their proposal distribution, ascending, and commit
    those whose running sum of entropies stays below ``gamma`` (``eb_threshold``, 0.35), at least one.

    Departs from the code on purpose: there the "entropy" is summed over the drawn tokens'
    probabilities of the whole block (``x0_p`` is ``[batch, block]``), so every position of a
    batch-1 block gets the same value and ``torch.sort``'s unspecified order decides; no token
    parity with it is expected. Unlike :class:`EntropyBudget` (EB-Sampler:
    ``sum H - max H <= gamma``), the bound is on the plain sum.
    """

    gamma: float = number(float, 0.0, default=0.35)
    statistics: ClassVar[frozenset[str]] = frozenset({"entropy"})

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        assert evaluation.entropy is not None
        eligible = canvas.masked & canvas.in_current_block(layout)
        order = torch.sort(torch.where(eligible, evaluation.entropy, math.inf), dim=1, stable=True).indices
        running = torch.where(eligible, evaluation.entropy, 0.0).gather(1, order).cumsum(dim=1)
        count = ((running < self.gamma) & eligible.gather(1, order)).sum(dim=1)
        count = torch.minimum(count.clamp(min=1), eligible.sum(dim=1))
        return top_k_mask(-evaluation.entropy, eligible, count)
