"""An encoder-decoder model's slot stores and calls: what the encoder-prefix cache keeps and does.

Some models (DiffusionGemma) run one set of weights twice: an *encoder*, causal over everything
finished before the canvas (the prompt, finished canvases), writing the model's own prefix cache,
and a *decoder*, bidirectional over the canvas, reading that prefix and a *self-conditioning*
input (the previous step's processed logits on this canvas). Here live, family-neutral:

* :class:`EncoderPrefixes`: per slot, the model's prefix cache and the column where it ends;
* :class:`SelfConditioning`: per slot, the canvas's last processed logits, draft and repeats
  (a lookahead branch keeps its own after its first evaluation);
* :func:`encode_pending`: one encoder call per slot whose prefix stops short of its canvas, counted
  as a model call of its own before the decoder's (as the block cache's separate write);
* :func:`prefix_read`: what a decoder call reads (the prefixes, the self-conditioning input),
  refusing a row past its slot's canvas;
* :func:`remember`: the pending write of a decoder call's processed logits and drafts.

The model's side (transformers' caches, the calls themselves) is the adapter's (DiffusionGemma's,
in ``models/``), reached through :class:`Encoder` and :meth:`~dlmsearch.models.adapter.ModelAdapter.cached_logits`.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import torch

from dlmsearch.core.attention import positions
from dlmsearch.models.kv_storage import EncodedPrefixes, PrefixRead
from dlmsearch.search.records.randomness import is_root
from dlmsearch.search.records.usage import CallCost


class Encoder(Protocol):
    """A model with an encoder call that extends a slot's prefix (``dtype``: what self-conditioning is kept in)."""

    dtype: str

    def encode(
        self, prefixes: EncodedPrefixes, slot: int, tokens: torch.Tensor, positions: torch.Tensor, end: int
    ) -> None: ...


@attrs.define(eq=False)
class EncoderPrefixes:
    """Per slot: the model's cache of everything encoded so far (prompt and finished canvases) and
    the canvas column where that prefix ends (-1: nothing encoded yet)."""

    caches: list[Any] = attrs.field(factory=list)
    end: torch.Tensor = attrs.field(factory=lambda: torch.zeros(0, dtype=torch.long))

    def reset(self, slots: int) -> None:
        self.caches = [None] * slots
        self.end = torch.full((slots,), -1, dtype=torch.long)

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes slot ``source[i]``'s prefix; a prefix taken twice is copied (its layers
        are replaced, never written in place, by later encoder calls, so a shallow copy suffices)."""
        taken: set[int] = set()
        caches = []
        for s in source.tolist():
            cache = self.caches[s]
            if cache is not None and s in taken:
                cache = copy.copy(cache)
                cache.layers = [copy.copy(layer) for layer in cache.layers]
            taken.add(s)
            caches.append(cache)
        self.caches, self.end = caches, self.end[source]

    def admit(self, slots: int) -> None:
        self.caches = self.caches + [None] * slots
        self.end = torch.cat([self.end, torch.full((slots,), -1, dtype=torch.long)])

    def widen(self, columns: int) -> None:
        """Every canvas gained ``columns`` of left padding: the stored prefixes end that much later."""
        self.end = torch.where(self.end >= 0, self.end + columns, self.end)

    def split(self, slots: torch.Tensor) -> EncoderPrefixes:
        """These slots' prefixes, deep-copied: an encoder call extends a cache object in place."""
        part = attrs.evolve(self)
        part.reorder(slots)
        part.caches = [copy.deepcopy(cache) for cache in part.caches]
        return part


@attrs.frozen
class _BranchMemory:
    """A lookahead branch's own self-conditioning memory (what :class:`SelfConditioning` keeps per slot)."""

    start: int
    logits: torch.Tensor  # [L, V]
    draft: torch.Tensor  # [L]
    repeats: int


@attrs.define(eq=False)
class SelfConditioning:
    """Per slot, of the canvas it is denoising (its first column ``start``, -1: none): the last
    step's processed logits (the next step's self-conditioning input, in the model's dtype), the
    last draft (argmax) and how many steps in a row the draft has repeated (the stopping rule's
    stability). A slot that moves to a new canvas starts afresh, as the reference resets both.

    A lookahead branch (a row whose ``row_key`` is not its slot's root) reads its slot's memory
    until it has its own: after its first evaluation its memory is kept apart (``branches``, by
    slot and row key), so a branch rolled deeper continues the reference loop from its own step;
    the adopted branch's memory becomes its slot's (:meth:`adopt`), and the rest are dropped."""

    start: torch.Tensor = attrs.field(factory=lambda: torch.zeros(0, dtype=torch.long))
    logits: torch.Tensor | None = None  # [slots, L, V]
    draft: torch.Tensor | None = None  # [slots, L]
    repeats: torch.Tensor = attrs.field(factory=lambda: torch.zeros(0, dtype=torch.long))
    branches: dict[tuple[int, int], _BranchMemory] = attrs.field(factory=dict)

    def reset(self, slots: int) -> None:
        self.start = torch.full((slots,), -1, dtype=torch.long)
        self.logits = self.draft = None
        self.repeats = torch.zeros(slots, dtype=torch.long)
        self.branches = {}

    def reorder(self, source: torch.Tensor) -> None:
        self.start, self.repeats, self.branches = self.start[source], self.repeats[source], {}
        if self.logits is not None:
            self.logits, self.draft = self.logits[source.to(self.logits.device)], self.draft[source]

    def admit(self, slots: int) -> None:
        self.start = torch.cat([self.start, torch.full((slots,), -1, dtype=torch.long)])
        self.repeats = torch.cat([self.repeats, torch.zeros(slots, dtype=torch.long)])
        self.branches = {}
        if self.logits is not None:
            self.logits = torch.cat([self.logits, self.logits.new_zeros(slots, *self.logits.shape[1:])])
            self.draft = torch.cat([self.draft, self.draft.new_full((slots, self.draft.shape[1]), -1)])

    def widen(self, columns: int) -> None:
        self.start = torch.where(self.start >= 0, self.start + columns, self.start)

    def split(self, slots: torch.Tensor) -> SelfConditioning:
        part = attrs.evolve(self)
        part.reorder(slots)
        return part

    def _read(
        self, slot: torch.Tensor, row_key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """Each row's memory: ``start``, logits, draft and repeats (a branch's own where it has one)."""
        start, repeats = self.start[slot].clone(), self.repeats[slot].clone()
        logits = None if self.logits is None else self.logits[slot.to(self.logits.device)]
        draft = None if self.draft is None else self.draft[slot].clone()
        for row, key in enumerate(zip(slot.tolist(), row_key.tolist()) if self.branches else ()):
            entry = self.branches.get(key)
            if entry is not None:
                start[row], repeats[row] = entry.start, entry.repeats
                logits[row], draft[row] = entry.logits.to(logits.device), entry.draft
        return start, logits, draft, repeats

    def conditioning(
        self, slot: torch.Tensor, start: torch.Tensor, row_key: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The rows' self-conditioning logits (zeros where a row has none) and ``[rows]`` which rows have them."""
        stored, logits, _, _ = self._read(slot, row_key)
        has = (stored == start) & (stored >= 0)
        return (logits if logits is not None and bool(has.any()) else None), has

    def repeated(
        self, slot: torch.Tensor, start: torch.Tensor, row_key: torch.Tensor, draft: torch.Tensor
    ) -> torch.Tensor:
        """``[rows]`` steps in a row the row's draft of this canvas has equalled ``draft`` (without storing it)."""
        stored, _, last, repeats = self._read(slot, row_key)
        if last is None:
            return torch.zeros(len(slot), dtype=torch.long)
        equal = (stored == start) & (last == draft).all(dim=1)
        return torch.where(equal, repeats + 1, 0)

    def remember(
        self,
        slot: torch.Tensor,
        start: torch.Tensor,
        row_key: torch.Tensor,
        root: torch.Tensor,
        logits: torch.Tensor,
        draft: torch.Tensor,
        repeats: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Keep the rows' processed logits and drafts for their next step (a slot's own row in the
        slot's memory, a branch in its own); ``[rows]`` how many steps in a row each draft has now
        repeated (0 at a canvas's first step).

        Args:
            slot: ``[rows]`` each row's slot.
            start: ``[rows]`` the first column of each row's canvas.
            row_key: ``[rows]`` each row's key (its slot's root, or a branch).
            root: ``[rows]`` rows that are their slot's own canvas.
            logits: ``[rows, L, V]`` the step's processed logits (in the dtype to keep).
            draft: ``[rows, L]`` the step's drafts.
            repeats: ``[rows]`` :meth:`repeated` of these rows, where the caller counted it before
                the write (None: counted here).
        """
        repeats = self.repeated(slot, start, row_key, draft) if repeats is None else repeats
        if self.logits is None:
            self.logits = logits.new_zeros(len(self.start), *logits.shape[1:])
            self.draft = torch.full((len(self.start), draft.shape[1]), -1, dtype=torch.long)
        at = root.nonzero().squeeze(1)
        self._store(slot[at], start[at], logits[at.to(logits.device)], draft[at], repeats[at])
        for row in (~root).nonzero().squeeze(1).tolist():
            key = (int(slot[row]), int(row_key[row]))
            self.branches[key] = _BranchMemory(
                int(start[row]), logits[row].clone(), draft[row].clone(), int(repeats[row])
            )
        return repeats

    def _store(
        self, slot: torch.Tensor, start: torch.Tensor, logits: torch.Tensor, draft: torch.Tensor, repeats: torch.Tensor
    ) -> None:
        self.logits[slot.to(self.logits.device)] = logits.to(self.logits.device)
        self.draft[slot], self.start[slot], self.repeats[slot] = draft, start, repeats

    def adopt(self, slot: torch.Tensor, row_key: torch.Tensor) -> None:
        """Each slot takes the memory of the branch it adopted (where that branch has its own), and
        every branch's memory is dropped: the lookahead is over."""
        for s, key in zip(slot.tolist(), row_key.tolist()):
            entry = self.branches.get((s, key))
            if entry is not None:
                at = torch.tensor([s])
                self._store(
                    at,
                    torch.tensor([entry.start]),
                    entry.logits[None],
                    entry.draft[None],
                    torch.tensor([entry.repeats]),
                )
        self.branches = {}


def encode_pending(
    encoder: Encoder,
    tokens: torch.Tensor,
    attention: torch.Tensor,
    start: torch.Tensor,
    slot: torch.Tensor,
    root: torch.Tensor,
    prefixes: EncoderPrefixes,
) -> tuple[torch.Tensor, CallCost] | None:
    """One encoder call per root row whose slot has not encoded everything before its canvas
    (``start``): the rows that took one (``[n]``) and what it cost them; None where none did.

    Args:
        encoder: the model.
        tokens: ``[R, T]`` the rows' canvases.
        attention: ``[R, T]`` their real columns.
        start: ``[R]`` the first column of each row's canvas.
        slot: ``[R]`` each row's slot.
        root: ``[R]`` rows that are their slot's own canvas (a branch never encodes).
        prefixes: the slots' encoded prefixes.
    """
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
        encoder.encode(prefixes, int(slot[r]), tokens[r, low:high], where[r, low:high], high)
        cost[i] = high - low
    return at, CallCost(rows=torch.ones_like(cost), tokens=cost, calls=torch.ones_like(cost))


def prefix_read(
    prefixes: EncoderPrefixes,
    conditioning: SelfConditioning,
    slot: torch.Tensor,
    start: torch.Tensor,
    row_key: torch.Tensor,
) -> PrefixRead:
    """What a decoder call of these rows reads: their slots' encoded prefixes and their self-conditioning.

    Args:
        prefixes: the slots' encoded prefixes.
        conditioning: the slots' self-conditioning memory.
        slot: ``[R]`` each row's slot.
        start: ``[R]`` the first column of each row's canvas.
        row_key: ``[R]`` each row's key (a lookahead branch reads its own memory where it has one).

    Raises:
        RuntimeError: a row's slot has encoded a prefix that does not end where the row's canvas
            starts (a row past its slot's canvas: its logits would read a stale prefix).
    """
    end = prefixes.end[slot]
    stale = ((end >= 0) & (end != start)).nonzero().squeeze(1).tolist()  # -1: none yet (the adapter refuses it)
    if stale:
        r = stale[0]
        raise RuntimeError(
            f"a decoder call would denoise the canvas at column {int(start[r])} of slot {int(slot[r])} "
            f"(row key {int(row_key[r])}) against an encoded prefix that ends at column {int(end[r])}: only a slot's "
            "own row encodes a finished canvas, so no row may denoise past its slot's canvas"
        )
    return PrefixRead(prefixes, slot, conditioning.conditioning(slot, start, row_key))


def remember(
    conditioning: SelfConditioning,
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
        conditioning: the slots' self-conditioning memory.
        slot: ``[R]`` each row's slot.
        start: ``[R]`` the first column of each row's canvas.
        row_key: ``[R]`` each row's key (its slot's root, or a branch).
        processed: ``[R, L, V]`` the step's processed logits.
        draft: ``[R, L]`` the step's drafts.
        dtype: the model's dtype (the self-conditioning input is kept in it, as the reference keeps it).
    """
    repeats = conditioning.repeated(slot, start, row_key, draft)
    kept = processed.to(dtype)
    return repeats, functools.partial(
        conditioning.remember, slot, start, row_key, is_root(row_key), kept, draft, repeats
    )
