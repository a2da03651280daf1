"""Cache policies: which columns each row forwards against a slot's stored keys and values, and
when the slot refreshes them (the Hydra group ``cache=``; one class and one YAML file each).

The engine asks a policy three things per call, before any forward:

* :meth:`~CachePolicy.columns` — the ``[rows, 2]`` canvas columns a cached row computes, given
  the window it is decoding (the blocks with masks left);
* :meth:`~CachePolicy.hits` — which rows may run against their slot's stored keys and values
  (the rest get a full forward);
* :meth:`~CachePolicy.refreshes` — which rows of a full forward write their keys and values
  into their slot's storage.

The storage itself and the attention that reads it in place live with the models
(:class:`~dlmsearch.models.kv_storage.KVStorage`). Fast-dLLM's two caches are approximate: a
slot refreshes when the window it decodes moves (a block completed), and between refreshes the
columns outside the window keep the keys and values of that refresh.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.models.kv_storage import KVStorage


class CachePolicy(Protocol):
    name: ClassVar[str]
    stores: ClassVar[bool]  # whether it keeps keys and values at all (False: every forward is full)

    def columns(self, start: torch.Tensor, end: torch.Tensor, width: int) -> torch.Tensor:
        """``[rows, 2]`` first and end column a cached row computes, for windows ``start:end``."""

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """``[rows]`` rows that run against their slot's stored keys and values."""

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        """``[rows]`` rows whose full forward refreshes their slot's storage (``root``: the slot's own canvas)."""


@attrs.frozen
class NoCache:
    """Every row forwards the whole canvas; nothing is stored."""

    name: ClassVar[str] = "none"
    stores: ClassVar[bool] = False

    def columns(self, start: torch.Tensor, end: torch.Tensor, width: int) -> torch.Tensor:
        return torch.zeros(len(start), 2, dtype=torch.long)

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(slot), dtype=torch.bool)

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hit)


@attrs.frozen
class _WindowRefresh:
    """Fast-dLLM's refresh rule: a slot's root refreshes when its window differs from the stored one."""

    def hits(self, storage: KVStorage, slot: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return storage.holds(slot, columns)

    def refreshes(self, hit: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
        return ~hit & root


@attrs.frozen
class PrefixCache(_WindowRefresh):
    """Fast-dLLM's prefix cache (``use_cache``): the window and everything after it are forwarded,
    against the stored keys and values of the columns before the window."""

    name: ClassVar[str] = "prefix"
    stores: ClassVar[bool] = True

    def columns(self, start: torch.Tensor, end: torch.Tensor, width: int) -> torch.Tensor:
        return torch.stack([start, torch.full_like(end, width)], dim=1)


@attrs.frozen
class DualCache(_WindowRefresh):
    """Fast-dLLM's dual cache (``dual_cache``): the window alone is forwarded, against the stored
    keys and values of the columns before and after it."""

    name: ClassVar[str] = "dual"
    stores: ClassVar[bool] = True

    def columns(self, start: torch.Tensor, end: torch.Tensor, width: int) -> torch.Tensor:
        return torch.stack([start, end], dim=1)


POLICIES: dict[str, type] = {policy.name: policy for policy in (NoCache, PrefixCache, DualCache)}


def cache_policy(value: object) -> CachePolicy:
    """A policy, or the name of one (``engine.cache=prefix``, the older spelling of ``cache=prefix``)."""
    if isinstance(value, str):
        if value not in POLICIES:
            raise ValueError(f"unknown cache policy {value!r}; available: {', '.join(POLICIES)} (choose one with cache=NAME)")
        return POLICIES[value]()
    if not all(hasattr(value, name) for name in ("name", "stores", "columns", "hits", "refreshes")):
        raise TypeError(f"cache must be a cache policy (cache=none|prefix|dual) or its name; got {type(value).__name__}")
    return value  # type: ignore[return-value]
