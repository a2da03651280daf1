"""Stopping at the end of the answer (dInfer; Learn2PD's end-of-text prediction).

A canvas is finished once an end token is committed and every generation position before it
is committed too: the positions after it that are still masked are filled with the end-of-text
token (the first stop id), as the tail of an answer the model ends would be, and cost no more
model calls. Filled positions are not commits: their ``commit_call`` stays -1, so counters and
tokens-per-step stay honest. On a block-diffusion canvas the answer has ended once the block that
holds the end token has no mask left (SDAR's ``stopping_criteria_idx``: no further block is
decoded); the prompt's tokens at the front of its generation region never count.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Layout


@attrs.frozen
class AnswerEnd:
    """Where a row's answer ends, and the fill after it: the stop rule's settings held once, so that
    the test for an ended answer and the fill read the same ones.

    Attributes:
        stop_ids: the ids that end an answer (the first fills).
        output_start: ``[R]`` generation columns before it hold the prompt's tokens (not searched).
        whole_block: the answer ends with the block that holds its end.
        decided_whole: the rule decides blocks whole (its ``decides_whole_block``): a held block has
            not ended, and a finished block's drafted ids after the end are filled too.
    """

    stop_ids: torch.Tensor
    output_start: torch.Tensor | None = None
    whole_block: bool = False
    decided_whole: bool = False

    def first_stop(self, canvas: Canvas, layout: Layout) -> torch.Tensor:
        """``[R]`` the generation column of each row's first committed (or given) stop token
        (``gen_length`` where there is none); columns before ``output_start`` are not searched."""
        column = torch.arange(layout.gen_length)[None, :]
        tokens, masked = canvas.tokens[:, layout.gen_start :], canvas.masked[:, layout.gen_start :]
        stop = torch.isin(tokens, self.stop_ids) & ~masked
        if self.output_start is not None:
            stop &= column >= self.output_start[:, None]
        return torch.where(stop, column, layout.gen_length).min(dim=1).values

    def ended(self, canvas: Canvas, layout: Layout, with_tail: bool = True) -> torch.Tensor:
        """``[R]`` rows whose generation holds a committed (or given) stop token with nothing masked
        before it (``whole_block``: nor in its block) and (``with_tail``) a masked tail left to fill."""
        masked = canvas.masked[:, layout.gen_start :]
        column = torch.arange(layout.gen_length)[None, :]
        first = self.first_stop(canvas, layout)
        stop = first < layout.gen_length
        if self.whole_block:
            first = (first // layout.block_length + 1) * layout.block_length
        open_before = (masked & (column < first[:, None])).any(dim=1)
        return stop & ~open_before & (masked.any(dim=1) | (not with_tail))

    def fill(self, canvas: Canvas, layout: Layout) -> Canvas:
        """Rows whose answer has ended, with their masked tail filled with ``stop_ids[0]`` (not
        counted as commits)."""
        ended = self.ended(canvas, layout, with_tail=not self.decided_whole)
        if self.decided_whole:  # a held block is not final, however much of it is kept
            ended &= ~canvas.held
        if not bool(ended.any()):
            return canvas
        fill = canvas.masked & ended[:, None]
        if self.decided_whole:  # the drafted ids after the end are padding too (as DiffusionGemma's reference)
            after = torch.zeros_like(fill)
            column = torch.arange(layout.gen_length)[None, :]
            after[:, layout.gen_start :] = column > self.first_stop(canvas, layout)[:, None]
            fill = fill | (after & ended[:, None])
        return attrs.evolve(
            canvas,
            tokens=torch.where(fill, self.stop_ids[0], canvas.tokens),
            masked=canvas.masked & ~fill,
            commit_call=torch.where(fill, -1, canvas.commit_call),
        )
