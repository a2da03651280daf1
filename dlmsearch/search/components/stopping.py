"""Stopping at the end of the answer (dInfer; Learn2PD's end-of-text prediction).

A canvas is finished once an end token is committed and every generation position before it
is committed too: the positions after it that are still masked are filled with the end-of-text
token (the first stop id), as the tail of an answer the model ends would be, and cost no more
model calls. Filled positions are not commits: their ``commit_call`` stays -1, so counters and
tokens-per-step stay honest.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Layout


def answer_ended(canvas: Canvas, layout: Layout, stop_ids: torch.Tensor) -> torch.Tensor:
    """``[R]`` rows whose generation holds a committed (or given) stop token with nothing masked before it."""
    gen = slice(layout.gen_start, layout.width)
    tokens, masked = canvas.tokens[:, gen], canvas.masked[:, gen]
    stop = torch.isin(tokens, stop_ids) & ~masked
    first = torch.where(stop, torch.arange(layout.gen_length)[None, :], layout.gen_length).min(dim=1).values
    open_before = (masked & (torch.arange(layout.gen_length)[None, :] < first[:, None])).any(dim=1)
    return stop.any(dim=1) & ~open_before & masked.any(dim=1)


def fill_after_end(canvas: Canvas, layout: Layout, stop_ids: torch.Tensor) -> Canvas:
    """Rows whose answer has ended, with their masked tail filled with ``stop_ids[0]`` (not counted as commits)."""
    ended = answer_ended(canvas, layout, stop_ids)
    if not bool(ended.any()):
        return canvas
    fill = canvas.masked & ended[:, None]
    return attrs.evolve(canvas, tokens=torch.where(fill, stop_ids[0], canvas.tokens), masked=canvas.masked & ~fill)
