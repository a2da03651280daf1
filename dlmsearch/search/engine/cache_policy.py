"""Cache policies: which columns each row forwards against a slot's stored keys and values, and
when the slot refreshes them (the Hydra group ``cache=``; one class and one YAML file each).

The engine asks a policy four things per call, before any forward:

* :meth:`~CachePolicy.columns` — the ``[rows, 2]`` canvas columns a cached row computes, given
  the window it is decoding (the blocks with masks left), its first real column and its slot's storage;
* :meth:`~CachePolicy.hits` — which rows may run against their slot's stored keys and values
  (the rest get a full forward);
* :meth:`~CachePolicy.refreshes` — which rows of a full forward write their keys and values
  into their slot's storage;
* :meth:`~CachePolicy.settled` — for rows of a cached forward that refresh, up to which column
  their slot's storage is exact afterwards (only the block cache fills its storage that way).

The storage itself and the attention that reads it in place live with the models
(:class:`~dlmsearch.models.kv_storage.KVStorage`). Fast-dLLM's two caches are approximate: a
slot refreshes when the window it decodes moves (a block completed), and between refreshes the
columns outside the window keep the keys and values of that refresh. The block cache of
block-diffusion models is exact: nothing before a block attends to it, so a finished block's keys
and values never change and are written once.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.models.kv_storage import KVStorage


@attrs.frozen
class RowWindows:
    """What a policy decides from, per engine call: each row's window, its first real column and its slot's store."""

    start: torch.Tensor  # [rows] the first column of each row's window
    end: torch.Tensor  # [rows] the end of each row's window
    width: int  # the canvas's length
    first: torch.Tensor  # [rows] each row's first real column
    storage: KVStorage  # the slots' stored keys and values
    slot: torch.Tensor  # [rows] each row's slot in storage


class CachePolicy(Protocol):
    """What a policy declares (the engine reads these, never the policy's type) and what it answers."""

    name: ClassVar[str]
    stores: ClassVar[bool]  # whether it keeps keys and values at all (False: every forward is full)
    # its store holds exact keys and values, written in place by the forwards of refreshing rows (never a
    # branch's), and allocated before the first
    exact: ClassVar[bool]
    layerwise: ClassVar[bool]  # it decides per layer inside one whole-canvas forward (adaptive KV caches)

    def prepare_call(self, rows: RowWindows, root: torch.Tensor) -> torch.Tensor | None:
        """``[rows]`` rows whose slot needs a write forward of its own before this call (the block
        cache's separate write), or None: this call's forwards write what they need (``root``: the
        rows that are their slot's own canvas)."""

    def columns(self, rows: RowWindows) -> torch.Tensor:
        """``[rows, 2]`` first and end column a cached row computes, for its window."""

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """``[rows]`` rows that run against their slot's stored keys and values."""

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """``[rows]`` rows whose forward refreshes their slot's storage (``root``: the slot's own canvas)."""

    def settled(self, start: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """``[rows]`` for refreshing rows of a cached forward: the column before which their slot's storage is exact afterwards."""


@attrs.frozen
class NoCache:
    """Every row forwards the whole canvas; nothing is stored."""

    name: ClassVar[str] = "none"
    stores: ClassVar[bool] = False
    exact: ClassVar[bool] = False
    layerwise: ClassVar[bool] = False

    def prepare_call(self, rows: RowWindows, root: torch.Tensor) -> None:
        return None

    def columns(self, rows: RowWindows) -> torch.Tensor:
        """``[rows, 2]`` no columns: nothing is cached."""
        return torch.zeros(len(rows.start), 2, dtype=torch.long)

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(slot), dtype=torch.bool)

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hit)

    def settled(self, start: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        raise AssertionError("no cached forward without a cache")


@attrs.frozen
class _WindowRefresh:
    """Fast-dLLM's refresh rule: a slot's root refreshes when its window differs from the stored one."""

    exact: ClassVar[bool] = False  # a slot's first row of a cached forward writes its window over the stale one
    layerwise: ClassVar[bool] = False

    def prepare_call(self, rows: RowWindows, root: torch.Tensor) -> None:
        return None

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
class BlockCache:
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

    def prepare_call(self, rows: RowWindows, root: torch.Tensor) -> torch.Tensor | None:
        """``[rows]`` root rows with finished columns their slot has not stored yet, which a
        separate write forward stores first (``fuse_write=false``; ``fuse_write=true``: None)."""
        if self.fuse_write:
            return None
        return root & (self.stored_end(rows.storage, rows.slot, rows.first) < rows.start)


@attrs.frozen
class ModelsExact:
    """``cache=auto`` (the default): the model's own exact cache, chosen when the engine meets the
    model — a block-diffusion model's block cache (the reference loops' ``store_kv``: the same
    tokens, a quarter of the token-forwards on the shipped block model), else no cache. The
    approximate caches (prefix, dual, the adaptive ones) are never chosen for the user."""

    name: ClassVar[str] = "auto"

    @staticmethod
    def for_model(attention_block: int | None) -> CachePolicy:
        return BlockCache() if attention_block is not None else NoCache()


def _policies() -> dict[str, type]:
    from dlmsearch.search.engine.adaptive import ADAPTIVE_POLICIES

    return {policy.name: policy for policy in (NoCache, PrefixCache, DualCache, BlockCache, *ADAPTIVE_POLICIES)}


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
    declared = ("name", "stores", "exact", "layerwise", "prepare_call", "columns", "hits", "refreshes", "settled")
    if not all(hasattr(value, name) for name in declared):
        raise TypeError(
            f"cache must be a cache policy (cache={'|'.join(POLICIES)}) or its name; got {type(value).__name__}"
        )
    return value  # type: ignore[return-value]
