"""A uniform-noise model's call (DiffusionGemma): what the engine does for it beyond the others.

A canvas position is *given* (the prompt, a finished canvas), *kept* (this step's decision, which
the next step re-decides) or *open* (noised: it holds a random id that the next step may
replace). The decode state marks open positions with the mask id (one past the vocabulary, see
:mod:`dlmsearch.models.diffusion_gemma`); here they get their random ids, keyed like every other
draw, so a row's canvas never depends on its batch:

* the id after model call ``c`` at position ``p`` is ``min(floor(u * V), V - 1)`` with
  ``u = hashed_uniform([seed, uid, c, row_key, p, RENOISE])`` (float64 arithmetic): a canvas's
  first step reads the ids drawn after its encoder call, every later step the ids drawn after the
  previous decoder call (the reference's initialisation and re-noising, one stream for both);
* the finished canvases (and the prompt) are encoded once, one encoder call per slot and canvas,
  counted as a model call of its own before the decoder's (as the block cache's separate write);
* the decoder reads the slot's encoded prefix and its self-conditioning input (the previous
  step's processed logits on this canvas); a slot's own row stores the new ones and its draft
  (:class:`~dlmsearch.models.diffusion_gemma.CanvasMemory`), a lookahead branch never does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from dlmsearch.core.attention import positions
from dlmsearch.models.diffusion_gemma import DiffusionGemmaAdapter
from dlmsearch.search.engine.slot_memory import SlotMemory
from dlmsearch.search.records.randomness import Stream, hashed_uniform, is_root
from dlmsearch.search.records.usage import CallCost


def noised(
    tokens: torch.Tensor, attention: torch.Tensor, keys: list[torch.Tensor], mask_id: int, vocab_size: int
) -> torch.Tensor:
    """``tokens`` with every open position (``mask_id``) holding its keyed uniform id.

    Args:
        tokens: ``[R, T]`` the rows' canvases.
        attention: ``[R, T]`` their real columns.
        keys: ``[seed, uid, call, row_key]`` broadcastable to ``[R, 1]``: ``call`` the model call
            *after which* the ids were drawn (the previous call of the row's sample).
        mask_id: the open-position marker.
        vocab_size: the ids drawn from.
    """
    open_ = (tokens == mask_id) & attention
    if not bool(open_.any()):
        return tokens
    uniform = hashed_uniform([*keys, positions(attention), torch.tensor(int(Stream.RENOISE))]).double()
    ids = torch.floor(uniform * vocab_size).long().clamp(max=vocab_size - 1)
    return torch.where(open_, ids, tokens)


def encode_pending(
    adapter: DiffusionGemmaAdapter,
    tokens: torch.Tensor,
    attention: torch.Tensor,
    start: torch.Tensor,
    slot: torch.Tensor,
    root: torch.Tensor,
    memory: SlotMemory,
) -> tuple[torch.Tensor, CallCost] | None:
    """One encoder call per root row whose slot has not encoded everything before its canvas
    (``start``): the rows that took one (``[n]``) and what it cost them; None where none did.

    Args:
        adapter: the model.
        tokens: ``[R, T]`` the rows' canvases.
        attention: ``[R, T]`` their real columns.
        start: ``[R]`` the first column of each row's canvas.
        slot: ``[R]`` each row's slot.
        root: ``[R]`` rows that are their slot's own canvas (a branch never encodes).
        memory: the slots' stores (``memory.prefixes``).
    """
    prefixes = memory.prefixes
    first = attention.long().argmax(dim=1)
    done = torch.where(prefixes.end[slot] >= 0, prefixes.end[slot], first)
    pending = root & (done < start)
    if not bool(pending.any()):
        return None
    at = pending.nonzero().squeeze(1)
    where = positions(attention)
    cost = torch.zeros(len(at), dtype=torch.long)
    for i, r in enumerate(at.tolist()):
        low, high = int(done[r]), int(start[r])
        adapter.encode(prefixes, int(slot[r]), tokens[r, low:high], where[r, low:high], high)
        cost[i] = high - low
    return at, CallCost(rows=torch.ones_like(cost), tokens=cost, calls=torch.ones_like(cost))


def denoise(
    adapter: DiffusionGemmaAdapter,
    tokens: torch.Tensor,
    attention: torch.Tensor,
    start: torch.Tensor,
    slot: torch.Tensor,
    row_key: torch.Tensor,
    memory: SlotMemory,
) -> torch.Tensor:
    """The decoder's float32 logits ``[R, L, V]`` of each row's canvas (columns ``start[r]`` on).

    Args:
        adapter: the model.
        tokens: ``[R, T]`` the rows' canvases, open positions already noised.
        attention: ``[R, T]`` their real columns.
        start: ``[R]`` the first column of each row's canvas.
        slot: ``[R]`` each row's slot.
        row_key: ``[R]`` each row's key (a lookahead branch reads its own memory where it has one).
        memory: the slots' stores (``memory.prefixes``, ``memory.canvas``).

    Raises:
        RuntimeError: a row's slot has encoded a prefix that does not end where the row's canvas
            starts (a row past its slot's canvas: its logits would read a stale prefix).
    """
    end = memory.prefixes.end[slot]
    stale = ((end >= 0) & (end != start)).nonzero().squeeze(1).tolist()  # -1: none yet (the adapter refuses it)
    if stale:
        r = stale[0]
        raise RuntimeError(
            f"a uniform-noise decoder call would denoise the canvas at column {int(start[r])} of slot {int(slot[r])} "
            f"(row key {int(row_key[r])}) against an encoded prefix that ends at column {int(end[r])}: only a slot's "
            "own row encodes a finished canvas, so no row may denoise past its slot's canvas"
        )
    columns = start[:, None] + torch.arange(adapter.canvas_length)[None, :]
    canvas = tokens.gather(1, columns)
    at = positions(attention).gather(1, columns)
    return adapter.denoise(canvas, at, memory.prefixes, slot, memory.canvas.conditioning(slot, start, row_key))


def remember(
    memory: SlotMemory,
    slot: torch.Tensor,
    start: torch.Tensor,
    row_key: torch.Tensor,
    processed: torch.Tensor,
    draft: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, Callable[[], None]]:
    """``[R]`` steps in a row each row's draft has repeated, and the write by which every row keeps
    its processed logits (the next step's self-conditioning, in the model's ``dtype``) and draft: a
    slot's own row in the slot's memory, a lookahead branch in its own. The caller applies it only
    once the whole forward succeeded: one retried after running out of memory must read the memory
    as it was (else it conditions on this step's logits and counts this draft twice).

    Args:
        memory: the slots' stores (``memory.canvas``).
        slot: ``[R]`` each row's slot.
        start: ``[R]`` the first column of each row's canvas.
        row_key: ``[R]`` each row's key (its slot's root, or a branch).
        processed: ``[R, L, V]`` the step's processed logits.
        draft: ``[R, L]`` the step's drafts.
        dtype: the model's dtype (the self-conditioning input is kept in it, as the reference keeps it).
    """
    repeats = memory.canvas.repeated(slot, start, row_key, draft)
    kept = processed.to(dtype)
    return repeats, functools.partial(
        memory.canvas.remember, slot, start, row_key, is_root(row_key), kept, draft, repeats
    )


__all__ = ["denoise", "encode_pending", "noised", "remember"]
