"""What the engine keeps per slot between calls: stored keys and values, a layerwise policy's
store, KLASS's previous distributions, an encoder's prefixes and the self-conditioning memory. A
decode session owns one and hands it to every engine call; the engine itself keeps no per-sample
state, so samples can join and leave a decode between steps.

The stores are large device tensors (and model caches) that the engine's forwards read and write
in place (a copy per step would cost what the cache saves), so this is the one mutable record of
a decode: its methods keep every store's slots in step with the decode state's rows, one
:class:`SlotStore` protocol for all of them.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import torch

from dlmsearch.models.kv_storage import KVStorage
from dlmsearch.models.layer_store import LayerStore
from dlmsearch.search.engine.encoder_prefix import EncoderPrefixes, SelfConditioning
from dlmsearch.search.engine.stability import DistributionHistory


class SlotStore(Protocol):
    """One per-slot store: what it holds moves with its slots."""

    def reset(self, slots: int) -> None:
        """``slots`` empty slots."""

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes over slot ``source[i]``'s entry (a population resampled, or slots were evicted)."""

    def admit(self, slots: int) -> None:
        """``slots`` new empty slots after the others."""

    def widen(self, columns: int) -> None:
        """Every canvas gained ``columns`` of left padding."""

    def split(self, slots: torch.Tensor) -> SlotStore:
        """A copy holding only these slots' entries, sharing nothing a later write changes in place."""


@attrs.define(eq=False)
class SlotMemory:
    """Per slot: the key/value storage a cache policy reads and refreshes, a layerwise policy's
    store (adaptive KV caches), the ``kl`` statistic's memory, and an encoder-decoder model's
    encoded prefix and self-conditioning memory (the canvas's last processed logits and drafts)."""

    kv: KVStorage = attrs.field(factory=KVStorage)
    history: DistributionHistory = attrs.field(factory=DistributionHistory)
    layers: LayerStore = attrs.field(factory=LayerStore)
    prefixes: EncoderPrefixes = attrs.field(factory=EncoderPrefixes)
    conditioning: SelfConditioning = attrs.field(factory=SelfConditioning)
    # Moves on as every step starts and with every change of the slots (reorder, admit): a decode state
    # made at another version reads stores written for another one, and is refused (``decode.state.check_current``);
    # a step that failed midway leaves its input state refused too
    version: int = 0

    @property
    def stores(self) -> tuple[SlotStore, ...]:
        return (self.kv, self.history, self.layers, self.prefixes, self.conditioning)

    def advance(self) -> int:
        """The stores move past the state that last read them; the new version."""
        self.version += 1
        return self.version

    @classmethod
    def for_slots(cls, slots: int) -> SlotMemory:
        memory = cls()
        for store in memory.stores:
            store.reset(slots)
        return memory

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes over slot ``source[i]``'s stores (a population resampled, or slots were evicted)."""
        self.advance()
        for store in self.stores:
            store.reorder(source)

    def admit(self, slots: int, widen: int = 0) -> None:
        """``slots`` new empty slots after the others; ``widen`` more columns of left padding in every canvas."""
        self.advance()
        for store in self.stores:
            store.widen(widen)
            store.admit(slots)

    def adopt(self, slot: torch.Tensor, row_key: torch.Tensor) -> None:
        """The lookahead is over: each slot takes what the branch it adopted (``row_key``) kept of its own."""
        self.conditioning.adopt(slot, row_key)

    def split(self, slots: torch.Tensor) -> SlotMemory:
        """A copy holding only these slots' stores (finished samples taken out of a decode); this one
        is unchanged. It shares nothing with this one, so neither decode can write the other's stores."""
        part = SlotMemory(*(store.split(slots) for store in self.stores), version=self.version)
        part.advance()
        return part
