"""Per-slot key/value storage and the attention that reads it in place.

Which columns a row forwards against the cache and when a slot refreshes is a cache policy's
decision (``dlmsearch.search.engine.cache_policy``); this module only keeps the keys and values.
A slot's cache holds, for every layer, the keys and values of its whole canvas as they were at
the last refresh, with the window of columns it was refreshed for. While a row of that slot (its
root or any lookahead branch) decodes the same window, only the columns its policy names are
forwarded, against the cached keys and values of all other columns.

Nothing is copied per call. All cached rows of a call run as one forward whatever their windows
(each row has its own columns). Each layer writes the rows' fresh keys and values into the cache
tensors themselves, and one attention call reads every slot's cache in place:

* the first row of a slot writes its window's keys over the slot's stale ones (as Fast-dLLM's
  ``replace_position`` does), so the plain decode attends exactly as a fresh concatenation would;
* further rows of the slot (lookahead branches) and columns that are not canvas columns (WINO's
  shadow, padding of a shorter window) write into a *tail* of scratch columns after the canvas,
  one lane of ``length`` columns per row of the slot; the stale window is hidden from them and
  their own lane is visible, so each row sees its own window and its slot's cache.

The attention batch is the range of slots the call touches; each slot's queries are stacked
along the query axis by lane, so the cache is read, never gathered.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import torch
import torch.nn.functional as F

from dlmsearch.models.token_ops import attend

KeyValues = tuple[torch.Tensor, torch.Tensor]


def lanes_of(slot: torch.Tensor) -> torch.Tensor:
    """Each row's rank among the rows of its slot, in row order (0 for a slot's first row)."""
    order = torch.sort(slot, stable=True).indices
    ordered = slot[order]
    rank = torch.arange(len(slot)) - torch.searchsorted(ordered, ordered)
    return torch.empty_like(rank).scatter_(0, order, rank)


@attrs.frozen
class CachedWindow:
    """How one forward's rows read and write their slots' caches (built by :meth:`KVCache.window`).

    ``layers`` are views of the cache tensors for the slot range the call touches, ``slot`` and
    ``lane`` each row's place in them, ``destination`` ``[rows, length]`` the key column where
    each query's fresh key and value go, ``mask`` ``[slots, 1, lanes * length, keys]`` what each
    stacked query may attend to; all on the cache's device, moved there once per forward."""

    layers: list[KeyValues]
    slot: torch.Tensor
    lane: torch.Tensor
    lanes: int
    destination: torch.Tensor
    mask: torch.Tensor

    def _stacked(self, buffer: torch.Tensor) -> torch.Tensor:
        """``[slots, heads, lanes, length, head_dim]`` view of a stacked query tensor."""
        slots, heads, _, dim = buffer.shape
        return buffer.view(slots, heads, self.lanes, -1, dim)

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put this call's fresh ``[rows, kv_heads, length, head_dim]`` keys and values in place."""
        cached_keys, cached_values = self.layers[layer]
        slot = self.slot[:, None]
        cached_keys[slot, :, self.destination] = keys.transpose(1, 2)
        cached_values[slot, :, self.destination] = values.transpose(1, 2)

    def attend(self, layer: int, queries: torch.Tensor, grouped: bool) -> torch.Tensor:
        """Attention of the rows' ``[rows, heads, length, head_dim]`` queries over their slots' caches."""
        keys, values = self.layers[layer]
        _rows, heads, length, dim = queries.shape
        stacked = queries.new_zeros(keys.shape[0], heads, self.lanes * length, dim)
        self._stacked(stacked)[self.slot, :, self.lane] = queries
        attended = attend(stacked, keys, values, self.mask, grouped)
        return self._stacked(attended)[self.slot, :, self.lane]


@attrs.frozen
class CachedRows:
    """Rows that run against their slots' stored keys and values: the storage, each row's slot,
    which rows may write into it in place (an exact store's refreshing rows; None: none), and
    the first column whose logits are read (an exact store's window; None: the forwarded columns)."""

    storage: KVStorage
    slot: torch.Tensor  # [rows]
    in_place: torch.Tensor | None = None  # [rows] bool
    logits_from: torch.Tensor | None = None  # [rows]


class EncodedPrefixes(Protocol):
    """Per slot, an encoder's cache of everything before the canvas a decoder reads (the engine's
    slot store of it: :class:`~dlmsearch.search.engine.encoder_prefix.EncoderPrefixes`)."""

    caches: list[Any]  # [slots] the model's own prefix cache object (None: nothing encoded yet)
    end: torch.Tensor  # [slots] the canvas column where each prefix ends (-1: none)


@attrs.frozen
class PrefixRead:
    """Rows whose decoder reads their slots' encoded prefixes: the prefixes, each row's slot, and
    its self-conditioning input (the logits, or None where no row has any; ``[rows]`` which rows have them)."""

    prefixes: EncodedPrefixes
    slot: torch.Tensor  # [rows]
    conditioning: tuple[torch.Tensor | None, torch.Tensor]


@attrs.define(eq=False)
class KVStorage:
    """Keys and values ``[slots, kv_heads, width + tail, head_dim]`` per layer, and the columns
    each slot was last refreshed for (``window_of``; ``-1``: never)."""

    layers: list[KeyValues] = attrs.field(factory=list)
    window_of: torch.Tensor = attrs.field(factory=lambda: torch.zeros(0, 2, dtype=torch.long))
    width: int = 0  # canvas columns; the tail of scratch columns follows them

    def reset(self, slots: int) -> None:
        """Forget everything: a new batch of ``slots``."""
        self.layers, self.width = [], 0
        self.window_of = torch.full((slots, 2), -1, dtype=torch.long)

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes slot ``source[i]``'s keys, values and window (also: evicting, with fewer slots)."""
        self.window_of = self.window_of[source]
        if self.layers:
            index = source.to(self.layers[0][0].device)
            self.layers = [(keys[index], values[index]) for keys, values in self.layers]

    def admit(self, slots: int) -> None:
        """Append ``slots`` empty slots (new samples joining a decode)."""
        self.window_of = torch.cat([self.window_of, torch.full((slots, 2), -1, dtype=torch.long)])
        if self.layers:
            self.layers = [
                tuple(torch.cat([t, t.new_zeros(slots, *t.shape[1:])]) for t in pair) for pair in self.layers
            ]

    def widen(self, columns: int) -> None:
        """``columns`` more columns of left padding in every canvas (a longer prompt joined the decode)."""
        if columns == 0:
            return
        self.window_of = torch.where(self.window_of >= 0, self.window_of + columns, self.window_of)
        if self.layers:
            self.width += columns
            self.layers = [tuple(F.pad(t, (0, 0, columns, 0)) for t in pair) for pair in self.layers]

    def split(self, slots: torch.Tensor) -> KVStorage:
        """A copy holding only these slots' entries (indexed: new tensors, nothing shared that a write changes)."""
        part = attrs.evolve(self)
        part.reorder(slots)
        return part

    def mark_settled(self, slot: torch.Tensor, end: torch.Tensor) -> None:
        """An exact store written in place by a forward: each slot's stored columns now end at ``end``."""
        self.window_of[slot, 1] = end

    def holds(self, slot: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Rows whose slot's cache was refreshed for exactly these columns."""
        return (self.window_of[slot] == query).all(dim=1)

    def store(self, slot: torch.Tensor, first: int, kv: list[KeyValues], query: torch.Tensor, width: int) -> None:
        """Refresh the caches of ``slot`` from a full forward of columns ``first:``."""
        if not self.layers:
            tail = (
                int((query[:, 1] - query[:, 0]).max()) + 1
            )  # one lane of the window (and a shifted model's extra column)
            self.width = width
            self.layers = [
                tuple(
                    torch.zeros(
                        len(self.window_of), t.shape[1], width + tail, t.shape[3], dtype=t.dtype, device=t.device
                    )
                    for t in pair
                )
                for pair in kv
            ]
        rows = slot.to(kv[0][0].device)
        for (keys, values), (k, v) in zip(self.layers, kv):
            keys[rows, :, first:width] = k
            values[rows, :, first:width] = v
        self.window_of[slot] = query

    def allocate(self, layers: list[KeyValues]) -> None:
        """Take these zeroed ``[slots, kv_heads, width, head_dim]`` tensors as the storage (a store that
        cached forwards fill, the exact block cache); nothing is marked stored."""
        self.width = layers[0][0].shape[2]
        self.layers = layers

    def _reserve(self, tail: int) -> None:
        """Grow the tail to at least ``tail`` scratch columns (rare: more branches or a longer window than before)."""
        have = self.layers[0][0].shape[2] - self.width
        if tail <= have:
            return
        self.layers = [tuple(F.pad(t[:, :, : self.width], (0, 0, 0, tail)) for t in pair) for pair in self.layers]

    def window(
        self,
        slot: torch.Tensor,
        column: torch.Tensor,
        cache_visible: torch.Tensor,
        fresh_visible: torch.Tensor,
        in_place: torch.Tensor | None = None,
    ) -> CachedWindow:
        """The forward of ``[rows, length]`` queries against their slots' caches.

        ``column`` is each query's canvas column (-1: not a canvas column, such as WINO's shadow
        or the padding of a shorter window), ``cache_visible [rows, width]`` the cached columns
        each row reads (never its own forwarded ones), ``fresh_visible [rows, length, length]``
        which of the row's own queries each query sees. A slot's first row writes its columns in
        place (``in_place [rows]``: the rows that do instead, at most one per slot; the exact block
        cache lets only a slot's own canvas write), so no other row of the slot may read one of them
        from the cache (Fast-dLLM's caches: the rows of a slot forward the same window).
        """
        rows, length = column.shape
        lane = lanes_of(slot)
        lanes = int(lane.max()) + 1
        low, high = int(slot.min()), int(slot.max()) + 1
        writer = (
            (lane == 0) if in_place is None else in_place
        )  # given: exactly the rows allowed to, whatever their lane
        overwritten = torch.zeros(
            high - low, self.width + 1, dtype=torch.bool
        )  # the last column collects what is not written in place
        written = torch.where(writer[:, None] & (column >= 0), column, self.width)
        overwritten[(slot - low)[:, None].expand_as(written), written] = True
        if bool((cache_visible & overwritten[slot - low, : self.width]).any()):
            raise ValueError(
                "a row would read from its slot's cache a column that the slot's first row overwrites in the same forward"
            )
        self._reserve(lanes * length)
        keys = self.width + lanes * length
        device = self.layers[0][0].device
        scratch = self.width + lane[:, None] * length + torch.arange(length)[None, :]
        destination = torch.where(writer[:, None] & (column >= 0), column, scratch)
        # Every stacked query sees the whole canvas by default: unused lanes give finite, discarded outputs.
        mask = torch.zeros(high - low, lanes, length, keys, dtype=torch.bool)
        mask[..., : self.width] = True
        own = torch.zeros(rows, length, keys, dtype=torch.bool)
        own[..., : self.width] = cache_visible[:, None, :]
        own.scatter_(2, destination[:, None, :].expand(rows, length, length), fresh_visible)
        mask[slot - low, lane] = own
        layers = [(k[low:high, :, :keys], v[low:high, :, :keys]) for k, v in self.layers]
        on = lambda t: t.to(device, non_blocking=True)
        return CachedWindow(
            layers, on(slot - low), on(lane), lanes, on(destination), on(mask.view(high - low, 1, lanes * length, keys))
        )
