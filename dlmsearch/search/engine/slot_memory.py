"""What the engine keeps per slot between calls: stored keys and values, and KLASS's previous
distributions. A decode session owns one and hands it to every engine call; the engine itself
keeps no per-sample state, so samples can join and leave a decode between steps.

Both stores are large device tensors that the engine's forwards read and write in place (a copy
per step would cost what the cache saves), so this is the one mutable record of a decode: its
methods keep its slots in step with the decode state's rows.
"""

from __future__ import annotations

import copy

import attrs
import torch

from dlmsearch.models.diffusion_gemma import CanvasMemory, EncoderPrefixes
from dlmsearch.models.kv_storage import KVStorage
from dlmsearch.models.layer_store import LayerStore
from dlmsearch.search.engine.stability import DistributionHistory


@attrs.define(eq=False)
class SlotMemory:
    """Per slot: the key/value storage a cache policy reads and refreshes, a layerwise policy's
    store (adaptive KV caches), the ``kl`` statistic's memory, and a uniform-noise model's encoded
    prefix and memory of the canvas it denoises (self-conditioning input, drafts)."""

    kv: KVStorage = attrs.field(factory=KVStorage)
    history: DistributionHistory = attrs.field(factory=DistributionHistory)
    layers: LayerStore = attrs.field(factory=LayerStore)
    prefixes: EncoderPrefixes = attrs.field(factory=EncoderPrefixes)
    canvas: CanvasMemory = attrs.field(factory=CanvasMemory)
    # Moves on as every step starts and with every change of the slots (reorder, admit): a decode state
    # made at another version reads stores written for another one, and is refused (``driver._check_current``);
    # a step that failed midway leaves its input state refused too
    version: int = 0

    def advance(self) -> int:
        """The stores move past the state that last read them; the new version."""
        self.version += 1
        return self.version

    @classmethod
    def for_slots(cls, slots: int) -> SlotMemory:
        memory = cls()
        memory.kv.reset(slots)
        memory.history.reset(slots)
        memory.layers.reset(slots)
        memory.prefixes.reset(slots)
        memory.canvas.reset(slots)
        return memory

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes over slot ``source[i]``'s stores (a population resampled, or slots were evicted)."""
        self.advance()
        self.kv.reorder(source)
        self.history.reorder(source)
        self.layers.reorder(source)
        self.prefixes.reorder(source)
        self.canvas.reorder(source)

    def admit(self, slots: int, widen: int = 0) -> None:
        """``slots`` new empty slots after the others; ``widen`` more columns of left padding in every canvas."""
        self.advance()
        self.kv.widen(widen)
        self.kv.admit(slots)
        self.history.admit(slots)
        self.layers.widen(widen)
        self.layers.admit(slots)
        for store in (self.prefixes, self.canvas):
            store.widen(widen)
            store.admit(slots)

    def split(self, slots: torch.Tensor) -> SlotMemory:
        """A copy holding only these slots' stores (finished samples taken out of a decode); this one
        is unchanged. It shares nothing with this one, so neither decode can write the other's
        stores: the tensor stores are indexed (a new tensor), transformers' prefix caches (objects
        an encoder call extends) are deep-copied."""
        part = SlotMemory(
            attrs.evolve(self.kv),
            attrs.evolve(self.history),
            attrs.evolve(self.layers),
            attrs.evolve(self.prefixes),
            attrs.evolve(self.canvas),
            self.version,
        )
        part.reorder(slots)
        part.prefixes.caches = [copy.deepcopy(cache) for cache in part.prefixes.caches]
        return part
