"""A change of canvas lengths (:class:`Resize`), and the canvases after it.

A variable-length decode (DAEDAL, rho-EOS) keeps every row's generation in the same canvas
columns: a row's own length is where its present columns end (:attr:`Canvas.extent`), the
columns after it are absent (no token, no attention), exactly as a block-aligned canvas's right
padding. A length policy changes a row in three ways, all one column map here: it appends
columns at the tail (masks, or DAEDAL's given end-of-sequence tokens), trims the tail, or
replaces one masked position by several masks (an insertion: the columns after it shift right,
the tail past the ceiling falls off). Every per-position record of the row moves with its
column, so a commit's record stays with its token.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Layout

LENGTH_FREE, LENGTH_SIZING, LENGTH_SETTLED = 0, 1, 2  # ``Canvas.length_phase``

# What a padding column holds beside the token (``rows.pad_columns``'s fill; the token is the caller's):
# no attention, no mask, nothing committed: a left-padded prompt's columns and a shorter row's tail alike.
ABSENT_COLUMNS = {"commit_call": -1, "commit_depth": -1, "commit_branch": -1}

# What a new column holds: an open position, nothing (absent), or a given end-of-sequence token.
NEW_MASK, NEW_ABSENT, NEW_EOS = -1, -2, -3


@attrs.frozen
class Resize:
    """Per row (``[n]`` each, generation columns counted from the generation's first column): the
    new length; where one masked position becomes ``insert`` masks (-1: nowhere); what the
    appended tail holds (:data:`NEW_MASK` or :data:`NEW_EOS`); and the row's new length phase."""

    length: torch.Tensor  # [n] long
    insert_at: torch.Tensor  # [n] long, -1: no insertion
    insert: torch.Tensor  # [n] long: masks that replace the position at ``insert_at``
    tail: torch.Tensor  # [n] long: NEW_MASK or NEW_EOS
    phase: torch.Tensor  # [n] long: the rows' ``length_phase`` afterwards

    def sources(self, old_length: torch.Tensor, width: int) -> torch.Tensor:
        """``[n, width]`` where each new generation column comes from: an old generation column (>= 0),
        or what a new one holds (:data:`NEW_MASK`, :data:`NEW_ABSENT`, :data:`NEW_EOS`)."""
        column = torch.arange(width)[None, :]
        at, grow = self.insert_at[:, None], (self.insert - 1).clamp(min=0)[:, None]
        inserted = at >= 0
        source = torch.where(inserted & (column > at), column - grow, column)
        source = torch.where(inserted & (column >= at) & (column < at + grow + 1), NEW_MASK, source)
        shifted = old_length[:, None] + torch.where(inserted, grow, 0)  # the old columns' new end
        source = torch.where(column >= shifted, self.tail[:, None], source)
        return torch.where(column >= self.length[:, None], NEW_ABSENT, source)


def resized(canvas: Canvas, resize: Resize, layout: Layout, mask_id: int, eos_id: int) -> Canvas:
    """``canvas`` (``n`` rows) with every row's generation columns remapped by ``resize`` into the
    generation region of ``layout`` (at least each row's new length); the prompt columns are kept. A
    row's block is then the first that holds a mask (the one it was in, unless growth gave a row that
    had nothing left new masks after it); a row that had nothing left and grows starts its next block
    at its old end (:attr:`Canvas.block_shift`: rho-EOS's window restarts there).

    Args:
        canvas: the rows before the change.
        resize: the change, per row.
        layout: the layout afterwards (the generation's first column, its columns, the block length).
        mask_id: what an open position holds.
        eos_id: the given token :data:`NEW_EOS` columns hold (and absent columns, unread: a verifier
            reading the whole region finds the answer ended there).
    """
    gen_start, width = layout.gen_start, layout.gen_length
    old_length = canvas.extent - gen_start
    source = resize.sources(old_length, width)
    take = source.clamp(min=0, max=canvas.tokens.shape[1] - gen_start - 1)
    new_mask, absent, eos = source == NEW_MASK, source == NEW_ABSENT, source == NEW_EOS

    def moved(tensor: torch.Tensor, mask: float, nothing: float, given: float) -> torch.Tensor:
        generation = tensor[:, gen_start:].gather(1, take)
        filled = torch.where(new_mask, mask, torch.where(absent, nothing, torch.where(eos, given, generation)))
        return torch.cat([tensor[:, :gen_start], filled.to(tensor.dtype)], dim=1)

    regrid = ~canvas.masked.any(dim=1) & (resize.length > old_length)
    shift = torch.where(regrid, (-old_length) % layout.block_length, canvas.block_shift)
    after = attrs.evolve(
        canvas,
        tokens=moved(canvas.tokens, mask_id, eos_id, eos_id),  # absent: EOS, what the authors pad with (never attended)
        attention=moved(canvas.attention, True, False, True),
        masked=moved(canvas.masked, True, False, False),
        commit_call=moved(canvas.commit_call, -1, -1, -1),
        commit_confidence=moved(canvas.commit_confidence, 0.0, 0.0, 0.0),
        commit_depth=moved(canvas.commit_depth, -1, -1, -1),
        commit_branch=moved(canvas.commit_branch, -1, -1, -1),
        revisions=moved(canvas.revisions, 0, 0, 0),
        length_phase=resize.phase,
        block_shift=shift,
    )
    first_open = torch.where(after.masked, after.blocks(layout), layout.num_blocks + 1).min(dim=1).values
    block = torch.where(after.masked.any(dim=1), first_open, canvas.block)
    moved_on = block != canvas.block
    return attrs.evolve(
        after,
        block=block,
        block_round=torch.where(moved_on, 0, canvas.block_round),
        post_steps=torch.where(moved_on, 0, canvas.post_steps),
    )
