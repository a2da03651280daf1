"""Cache policies: which columns each row forwards against a slot's stored keys and values, and
when the slot refreshes them (the Hydra group ``cache=``; one class and one YAML file each).

The engine asks a policy, per call: which rows take a write of their own first
(:meth:`~CachePolicy.write_first`: the block cache's separate write of finished blocks, an
encoder's call), and, before any forward:

* :meth:`~CachePolicy.columns` — the ``[rows, 2]`` canvas columns a cached row computes, given
  the window it is decoding (the blocks with masks left), its first real column and its slot's storage;
* :meth:`~CachePolicy.hits` — which rows may run against their slot's stored keys and values
  (the rest get a full forward);
* :meth:`~CachePolicy.refreshes` — which rows of a full forward write their keys and values
  into their slot's storage;
* :meth:`~CachePolicy.settled` — for rows of a cached forward that refresh, up to which column
  their slot's storage is exact afterwards (only the block cache fills its storage that way);

and per cached forward what it reads of the slots' stores (:meth:`~CachePolicy.read`) and what it
keeps for the next step once it succeeded (:meth:`~CachePolicy.remember`).

The storage itself and the attention that reads it in place live with the models
(:class:`~dlmsearch.models.kv_storage.KVStorage`). Fast-dLLM's two caches are approximate: a
slot refreshes when the window it decodes moves (a block completed), and between refreshes the
columns outside the window keep the keys and values of that refresh. The block cache of
block-diffusion models is exact: nothing before a block attends to it, so a finished block's keys
and values never change and are written once. The encoder-prefix cache of an encoder-decoder model
(DiffusionGemma) is exact too: its separate write is the encoder's call over everything finished
before the canvas, which the decoder reads with its self-conditioning input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.core.capabilities import ModelCapabilities
from dlmsearch.models.group_decisions import GroupDecisions
from dlmsearch.models.kv_storage import CachedRows, KVStorage, PrefixRead
from dlmsearch.search.engine import encoder_prefix
from dlmsearch.search.engine.back_off import out_of_memory
from dlmsearch.search.engine.call_records import CallRows, Forward, PreparedCall
from dlmsearch.search.engine.slot_memory import SlotMemory
from dlmsearch.search.records.usage import CallCost

Written = tuple[torch.Tensor, CallCost] | None  # the rows that took a write of their own ([n]) and its cost


@attrs.frozen
class RowWindows:
    """What a policy decides from, per engine call: each row's window, its first real column and its slot's store."""

    start: torch.Tensor  # [rows] the first column of each row's window
    end: torch.Tensor  # [rows] the end of each row's window
    width: int  # the canvas's length
    first: torch.Tensor  # [rows] each row's first real column
    storage: KVStorage  # the slots' stored keys and values
    slot: torch.Tensor  # [rows] each row's slot in storage


@attrs.frozen
class Writer:
    """What a policy's separate write runs on: the slots' stores, the engine's own write forward
    of some rows (a call of its own, no summaries: its cost), or the model's encoder call, outside
    the back-off (a tensor-parallel group's rank that fails there alone ends the run: ``decisions.paired``)."""

    memory: SlotMemory
    forward: Callable[[CallRows], CallCost]
    encoder: encoder_prefix.Encoder
    decisions: GroupDecisions


class CachePolicy(Protocol):
    """What a policy declares (the engine reads these, never the policy's type) and what it answers."""

    name: ClassVar[str]
    stores: ClassVar[bool]  # whether it keeps keys and values at all (False: every forward is full)
    # its store holds exact keys and values, written in place by the forwards of refreshing rows (never a
    # branch's), and allocated before the first
    exact: ClassVar[bool]
    layerwise: ClassVar[bool]  # it decides per layer inside one whole-canvas forward (adaptive KV caches)
    keeps_processed: ClassVar[bool]  # its forwards keep their processed logits (a decoder's self-conditioning)

    def write_first(self, rows: CallRows, windows: RowWindows, writer: Writer) -> Written:
        """The write some rows take before this call (the block cache's separate write, an
        encoder's call), run on ``writer``: those rows and its cost, or None: this call's forwards
        write what they need."""

    def read(self, call: PreparedCall, forward: Forward) -> CachedRows | PrefixRead:
        """What a cached forward's rows read of their slots' stores (``call.settings.memory``)."""

    def remember(
        self, call: PreparedCall, forward: Forward, summaries: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> tuple[Callable[[], None], ...]:
        """The writes a forward's rows keep for their next step, pending until it succeeded; it may
        take what it kept out of ``summaries`` (on the device; ``processed``: the processed logits,
        where kept) and add the statistics it provides (``dtype``: the model's)."""

    def columns(self, rows: RowWindows) -> torch.Tensor:
        """``[rows, 2]`` first and end column a cached row computes, for its window."""

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """``[rows]`` rows that run against their slot's stored keys and values."""

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """``[rows]`` rows whose forward refreshes their slot's storage (``root``: the slot's own canvas)."""

    def settled(self, start: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """``[rows]`` for refreshing rows of a cached forward: the column before which their slot's storage is exact afterwards."""


class _KeysAndValues:
    """What a policy over stored keys and values answers beyond its columns: no write of its own
    before a call (unless it says otherwise), its rows read the key/value storage, and nothing is
    kept for the next step but what the forward stored."""

    exact: ClassVar[bool]
    keeps_processed: ClassVar[bool] = False

    def write_first(self, rows: CallRows, windows: RowWindows, writer: Writer) -> Written:
        return None

    def read(self, call: PreparedCall, forward: Forward) -> CachedRows:
        """The storage and each row's slot; an exact store's refreshing rows write in place."""
        in_place = forward.refresh if self.exact else None
        return CachedRows(call.settings.memory.kv, call.rows.slot[forward.rows], in_place, forward.logits_from)

    def remember(self, *args: object) -> tuple[Callable[[], None], ...]:
        return ()


class _NoStorage:
    """What a policy that keeps no key/value storage answers (``none``; ``encoder``, whose stores are
    the encoder's prefixes): no row refreshes a store, so none is settled."""

    name: ClassVar[str]
    stores: ClassVar[bool] = False
    exact: ClassVar[bool] = False  # nothing is written in place into the key/value storage
    layerwise: ClassVar[bool] = False

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hit)

    def settled(self, start: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        raise AssertionError(f"cache={self.name} keeps no key/value storage: no forward refreshes one")


@attrs.frozen
class NoCache(_NoStorage, _KeysAndValues):
    """Every row forwards the whole canvas; nothing is stored."""

    name: ClassVar[str] = "none"

    def columns(self, rows: RowWindows) -> torch.Tensor:
        """``[rows, 2]`` no columns: nothing is cached."""
        return torch.zeros(len(rows.start), 2, dtype=torch.long)

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(slot), dtype=torch.bool)


@attrs.frozen
class _WindowRefresh(_KeysAndValues):
    """Fast-dLLM's refresh rule: a slot's root refreshes when its window differs from the stored one."""

    exact: ClassVar[bool] = False  # a slot's first row of a cached forward writes its window over the stale one
    layerwise: ClassVar[bool] = False

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return storage.holds(slot, columns)

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        return ~hit & root

    def settled(self, start: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        raise AssertionError("Fast-dLLM's caches refresh from full forwards only")


@attrs.frozen
class PrefixCache(_WindowRefresh):
    """Fast-dLLM's prefix cache (``use_cache``): the window and everything after it are forwarded,
    against the stored keys and values of the columns before the window."""

    name: ClassVar[str] = "prefix"
    stores: ClassVar[bool] = True

    def columns(self, rows: RowWindows) -> torch.Tensor:
        """``[rows, 2]`` the window and everything after it."""
        return torch.stack([rows.start, torch.full_like(rows.end, rows.width)], dim=1)


@attrs.frozen
class DualCache(_WindowRefresh):
    """Fast-dLLM's dual cache (``dual_cache``): the window alone is forwarded, against the stored
    keys and values of the columns before and after it."""

    name: ClassVar[str] = "dual"
    stores: ClassVar[bool] = True

    def columns(self, rows: RowWindows) -> torch.Tensor:
        """``[rows, 2]`` the window alone."""
        return torch.stack([rows.start, rows.end], dim=1)


@attrs.frozen
class BlockCache(_KeysAndValues):
    """The exact block cache of block-diffusion models (SDAR's ``store_kv``, LLaDA2.x): a slot
    stores the keys and values of every column before its earliest block with a mask left, each
    written once; every row forwards only the columns after its slot's stored ones up to the end
    of its current block, against the stored ones (block-causal, so this is exact).

    A lookahead branch or a particle forwards only its own block(s) against the shared stored
    prefix (a branch that finished a block forwards that block too, and writes nothing); a root
    row's forward writes the finished blocks it covers, and its slot's store then ends at its
    earliest unfinished block. A revision that re-masks a stored column moves that end back.

    ``fuse_write=false`` (the reference loops): a finished block is written by one more forward of
    that block alone (and the prompt's whole blocks by a prefill), a model call of its own before
    the next block's first denoising forward; ``fuse_write=true``: the root's next denoising forward
    takes the finished block's columns as well and writes them on the way (one call fewer per
    block, the same tokens). Either way the block's tokens are forwarded once more, counted in
    row- and token-forwards; a separate write counts as a step (model call).
    """

    name: ClassVar[str] = "block"
    stores: ClassVar[bool] = True
    exact: ClassVar[bool] = True
    layerwise: ClassVar[bool] = False
    fuse_write: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    @staticmethod
    def stored_end(storage: KVStorage, slot: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """``[rows]`` the column where each row's slot's exact store ends (its first real column when nothing is stored)."""
        end = storage.window_of[slot, 1]
        return torch.where(end >= 0, end, first)

    def columns(self, rows: RowWindows) -> torch.Tensor:
        """``[rows, 2]`` from the slot's stored end (or the window's start, if earlier) to the window's end."""
        return torch.stack(
            [torch.minimum(self.stored_end(rows.storage, rows.slot, rows.first), rows.start), rows.end], dim=1
        )

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(slot), dtype=torch.bool)

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        return root.clone()

    def settled(self, start: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return torch.minimum(start, columns[:, 1])

    def write_first(self, rows: CallRows, windows: RowWindows, writer: Writer) -> Written:
        """Root rows with finished columns their slot has not stored yet take a write forward of
        those columns first (``fuse_write=false``; ``fuse_write=true``: None)."""
        if self.fuse_write:
            return None
        writes = rows.root & (self.stored_end(windows.storage, windows.slot, windows.first) < windows.start)
        if not bool(writes.any()):
            return None
        at = writes.nonzero().squeeze(1)
        start = windows.start[at]
        return at, writer.forward(attrs.evolve(rows.take(at), window=(start, start), group=None))


@attrs.frozen
class EncoderPrefixCache(_NoStorage):
    """The exact cache of an encoder-decoder model (DiffusionGemma): a slot stores the model's own
    cache of everything finished before its canvas, written by the encoder's call (the separate
    write: one per slot and finished canvas, a model call of its own, never a branch's); every row
    forwards its canvas alone through the decoder against it, with its self-conditioning input
    (the slot's, or a lookahead branch's own, previous processed logits on this canvas), which the
    forward keeps for the next step (:mod:`~dlmsearch.search.engine.encoder_prefix`). Its stores
    are not key/value storage: ``stores`` is False, and nothing is refreshed."""

    name: ClassVar[str] = "encoder"
    keeps_processed: ClassVar[bool] = True

    def write_first(self, rows: CallRows, windows: RowWindows, writer: Writer) -> Written:
        """The encoder's call for every root whose slot's prefix ends before its canvas."""
        with writer.decisions.paired(out_of_memory):  # no back-off here: a sharded encoder's rank fails alone
            return encoder_prefix.encode_pending(
                writer.encoder, rows.tokens, rows.attention, windows.start, rows.slot, rows.root, writer.memory.prefixes
            )

    def columns(self, rows: RowWindows) -> torch.Tensor:
        """``[rows, 2]`` the canvas (the window)."""
        return torch.stack([rows.start, rows.end], dim=1)

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(slot), dtype=torch.bool)

    def read(self, call: PreparedCall, forward: Forward) -> PrefixRead:
        memory, rows, index = call.settings.memory, call.rows, forward.rows
        return encoder_prefix.prefix_read(
            memory.prefixes, memory.conditioning, rows.slot[index], forward.query[:, 0], rows.row_key[index]
        )

    def remember(
        self, call: PreparedCall, forward: Forward, summaries: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> tuple[Callable[[], None], ...]:
        """The rows' processed logits (taken out of ``summaries``) and drafts, kept in the slots'
        self-conditioning memory for their next step, in the model's dtype; ``repeats`` where asked."""
        processed = summaries.pop("processed")
        draft = summaries["draft"].long().cpu()  # the rule that reads the self-conditioned canvas asks for it
        memory, rows, index = call.settings.memory, call.rows, forward.rows
        repeats, write = encoder_prefix.remember(
            memory.conditioning, rows.slot[index], forward.query[:, 0], rows.row_key[index], processed, draft, dtype
        )
        if "repeats" in call.settings.statistics:
            summaries["repeats"] = repeats[:, None].float().expand(-1, processed.shape[1]).to(processed.device)
        return (write,)


@attrs.frozen
class ModelsExact:
    """``cache=auto`` (the default): the model's own exact cache, chosen when the engine meets the
    model — a block-diffusion model's block cache (the reference loops' ``store_kv``: the same
    tokens, a quarter of the token-forwards on the shipped block model), else no cache. The
    approximate caches (prefix, dual, the adaptive ones) are never chosen for the user."""

    name: ClassVar[str] = "auto"

    @staticmethod
    def for_model(able: ModelCapabilities) -> CachePolicy:
        """The model's own exact cache: an encoder-decoder model's prefix cache, a block model's block cache, else none."""
        if able.encoder:
            return EncoderPrefixCache()
        return BlockCache() if able.attention_block is not None else NoCache()


def for_model(policy: CachePolicy, able: ModelCapabilities) -> CachePolicy:
    """The policy that runs on this model: ``cache=auto``'s choice; an encoder-decoder model, which
    has no forward without its encoder's prefix, runs that exact cache for ``cache=none`` too."""
    if isinstance(policy, ModelsExact) or (able.encoder and policy.name == "none"):
        return ModelsExact.for_model(able)
    return policy


def _policies() -> dict[str, type]:
    from dlmsearch.search.engine.adaptive import ADAPTIVE_POLICIES

    chosen = (NoCache, PrefixCache, DualCache, BlockCache, EncoderPrefixCache, *ADAPTIVE_POLICIES)
    return {policy.name: policy for policy in chosen}


POLICIES: dict[str, type] = _policies()


def cache_policy(value: object) -> CachePolicy:
    """A policy, or the name of one (``engine.cache=prefix``, the older spelling of ``cache=prefix``)."""
    if value == "auto" or isinstance(value, ModelsExact):
        return ModelsExact()  # type: ignore[return-value]  (the engine resolves it: ModelsExact.for_model)
    if isinstance(value, str):
        if value not in POLICIES:
            raise ValueError(
                f"unknown cache policy {value!r}; available: auto, {', '.join(POLICIES)} (choose one with cache=NAME)"
            )
        chosen = POLICIES[value]
        return chosen.for_family() if hasattr(chosen, "for_family") else chosen()
    declared = ("name", "stores", "exact", "layerwise", "keeps_processed", "write_first", "columns", "hits")
    declared += ("refreshes", "settled", "read", "remember")
    if not all(hasattr(value, name) for name in declared):
        raise TypeError(
            f"cache must be a cache policy (cache={'|'.join(POLICIES)}) or its name; got {type(value).__name__}"
        )
    return value  # type: ignore[return-value]
