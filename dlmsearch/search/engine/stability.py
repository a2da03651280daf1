"""How much each position's predictive distribution moved since the slot's previous step (KLASS).

KLASS (Kim et al., NeurIPS 2025) commits a token once it is confident *and* its distribution has
stopped moving: ``d_i = sum_v p_i(v) (log(p_i(v) + 1e-12) - log(p_prev,i(v) + 1e-12))`` in float64
against the slot's previous step, stable when the last two values are below a bound. The
previous distributions are vocabulary-sized (``slots x generation x vocab``, float64: about 0.4 GB
at 400 positions of LLaDA), so they stay here, inside the engine, allocated only when a decoder
asks for the ``kl`` statistic; before a slot's first step they are zeros, so its first
divergence is huge, as upstream.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs
import torch


@attrs.define(eq=False)
class DistributionHistory:
    """Per slot: the previous step's distributions over the generation region and its divergence."""

    probs: torch.Tensor | None = None  # [slots, n, V] float64
    last: torch.Tensor | None = None  # [slots, n] float64, the previous step's divergence
    slots: int = 0

    def reset(self, slots: int) -> None:
        self.probs, self.last, self.slots = None, None, slots

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes over slot ``source[i]``'s history (a population resampled; also: evicting, with fewer slots)."""
        self.slots = len(source)
        if self.probs is not None and self.last is not None:
            self.probs, self.last = self.probs[source.to(self.probs.device)], self.last[source.to(self.last.device)]

    def admit(self, slots: int) -> None:
        """Append ``slots`` slots with no previous step (zeros, as before any slot's first step)."""
        self.slots += slots
        if self.probs is not None and self.last is not None:
            self.probs = torch.cat([self.probs, self.probs.new_zeros(slots, *self.probs.shape[1:])])
            self.last = torch.cat([self.last, self.last.new_zeros(slots, *self.last.shape[1:])])

    def widen(self, columns: int) -> None:
        """Nothing moves: the history's columns count from the generation region, not the canvas's left edge."""

    def split(self, slots: torch.Tensor) -> DistributionHistory:
        """A copy holding only these slots' entries (indexed: new tensors, nothing shared that a write changes)."""
        part = attrs.evolve(self)
        part.reorder(slots)
        return part

    def step(
        self, logits: torch.Tensor, slots: torch.Tensor, start: int, store: torch.Tensor
    ) -> tuple[torch.Tensor, Callable[[], None]]:
        """``[R, T]`` the larger of this step's and the previous step's divergence at generation
        columns ``start : start + T`` of these rows' slots, and the write that makes the rows in
        ``store`` (roots) their slots' new previous step. The caller applies it only once the whole
        forward succeeded: one retried after running out of memory must read the history as it was."""
        probs = torch.softmax(logits.double(), dim=-1)
        width = start + probs.shape[1]
        index = slots.to(probs.device)
        if self._fits(width, probs.shape[2]):
            assert self.probs is not None and self.last is not None
            previous, last = self.probs[index, start:width], self.last[index, start:width]
        else:  # none yet, or too narrow: the write starts afresh (zeros, as before any slot's first step)
            previous, last = torch.zeros_like(probs), probs.new_zeros(probs.shape[:2])
        divergence = (probs * (torch.log(probs + 1e-12) - torch.log(previous + 1e-12))).sum(dim=-1)
        recent = torch.maximum(divergence, last)
        keep = store.to(probs.device)
        return recent.float(), functools.partial(self._keep, index[keep], start, probs[keep], divergence[keep])

    def _fits(self, width: int, vocab: int) -> bool:
        """The history holds ``width`` generation columns of this vocabulary."""
        return self.probs is not None and self.probs.shape[1] >= width and self.probs.shape[2] == vocab

    def _keep(self, slots: torch.Tensor, start: int, probs: torch.Tensor, divergence: torch.Tensor) -> None:
        """These slots' new previous step (a history too narrow for it is first replaced by zeros)."""
        width = start + probs.shape[1]
        if not self._fits(width, probs.shape[2]):
            self.probs = torch.zeros(self.slots, width, probs.shape[2], dtype=torch.float64, device=probs.device)
            self.last = torch.zeros(self.slots, width, dtype=torch.float64, device=probs.device)
        assert self.probs is not None and self.last is not None
        if slots.numel():
            self.probs[slots, start:width] = probs
            self.last[slots, start:width] = divergence
