"""Per-sample key/value caches for the engine (Fast-dLLM's approximate prefix and dual caches).

A sample's cache holds, for every layer, the keys and values of its whole canvas as they were
at the last refresh, with the window of columns it was refreshed for. While a row of that
sample (its root or any lookahead branch) decodes the same window, only the window is
forwarded: ``prefix`` forwards the window and everything after it, ``dual`` the window alone,
against the cached keys and values of all other columns. Branches index into their sample's
cache; nothing is copied per branch between calls.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.validation import check_choice

MODES = ("none", "prefix", "dual")


@attrs.define(eq=False)
class KVCache:
    """Keys and values ``[samples, kv_heads, width, head_dim]`` per layer, and each sample's window."""

    mode: str = attrs.field(default="none", validator=check_choice(*MODES))
    layers: list[tuple[torch.Tensor, torch.Tensor]] = attrs.field(factory=list)
    window: torch.Tensor = attrs.field(factory=lambda: torch.zeros(0, 2, dtype=torch.long))

    def reset(self, samples: int) -> None:
        """Forget everything: a new batch of ``samples``."""
        self.layers = []
        self.window = torch.full((samples, 2), -1, dtype=torch.long)

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes slot ``source[i]``'s keys, values and window."""
        self.window = self.window[source]
        if self.layers:
            index = source.to(self.layers[0][0].device)
            self.layers = [(keys[index], values[index]) for keys, values in self.layers]

    def query(self, start: torch.Tensor, end: torch.Tensor, width: int) -> torch.Tensor:
        """``[rows, 2]`` columns a cached forward computes: the window (dual), or the window and
        everything after it (prefix)."""
        return torch.stack([start, end if self.mode == "dual" else torch.full_like(end, width)], dim=1)

    def hits(self, sample: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Rows whose sample's cache was refreshed for exactly this query window."""
        return (self.window[sample] == query).all(dim=1)

    def store(self, sample: torch.Tensor, first: int, kv: list[tuple[torch.Tensor, torch.Tensor]], query: torch.Tensor, width: int) -> None:
        """Refresh the caches of ``sample`` from a full forward of columns ``first:``."""
        if not self.layers:
            self.layers = [
                tuple(torch.zeros(len(self.window), t.shape[1], width, t.shape[3], dtype=t.dtype, device=t.device) for t in pair)
                for pair in kv
            ]
        rows = sample.to(kv[0][0].device)
        for (keys, values), (k, v) in zip(self.layers, kv):
            keys[rows, :, first:] = k
            values[rows, :, first:] = v
        self.window[sample] = query

    def gather(self, sample: torch.Tensor, first: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The cached keys and values of each row's sample, columns ``first:``."""
        rows = sample.to(self.layers[0][0].device)
        return [(keys[rows, :, first:], values[rows, :, first:]) for keys, values in self.layers]
