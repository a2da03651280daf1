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


def answer_ended(
    canvas: Canvas,
    layout: Layout,
    stop_ids: torch.Tensor,
    output_start: torch.Tensor | None = None,
    whole_block: bool = False,
) -> torch.Tensor:
    """``[R]`` rows whose generation holds a committed (or given) stop token with nothing masked
    before it (``whole_block``: nor in its block). Columns before ``output_start [R]`` (generation
    columns that hold the prompt's tokens) are not searched."""
    gen = slice(layout.gen_start, layout.width)
    column = torch.arange(layout.gen_length)[None, :]
    tokens, masked = canvas.tokens[:, gen], canvas.masked[:, gen]
    stop = torch.isin(tokens, stop_ids) & ~masked
    if output_start is not None:
        stop &= column >= output_start[:, None]
    first = torch.where(stop, column, layout.gen_length).min(dim=1).values
    if whole_block:
        first = (first // layout.block_length + 1) * layout.block_length
    open_before = (masked & (column < first[:, None])).any(dim=1)
    return stop.any(dim=1) & ~open_before & masked.any(dim=1)


def fill_after_end(
    canvas: Canvas,
    layout: Layout,
    stop_ids: torch.Tensor,
    output_start: torch.Tensor | None = None,
    whole_block: bool = False,
) -> Canvas:
    """Rows whose answer has ended, with their masked tail filled with ``stop_ids[0]`` (not counted as commits)."""
    ended = answer_ended(canvas, layout, stop_ids, output_start, whole_block)
    if not bool(ended.any()):
        return canvas
    fill = canvas.masked & ended[:, None]
    return attrs.evolve(canvas, tokens=torch.where(fill, stop_ids[0], canvas.tokens), masked=canvas.masked & ~fill)
