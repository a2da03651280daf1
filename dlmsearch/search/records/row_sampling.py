"""Per-row sampling settings: what lets requests at different temperatures share one forward.

A server's requests differ in ``temperature``, ``top_p`` and ``top_k`` far more often than in
anything else. Held as vectors (one value per slot, then per row of an engine call), they ride
along with the rows like the seeds do, and the engine's logits processors apply each row's own:
a request decodes exactly what it decodes alone, whatever it shares a forward with.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.core.sampling import Sampling


@attrs.frozen(eq=False)
class RowSampling:
    """Each row's resolved settings: ``temperature`` (0: greedy), ``top_p`` (1: no nucleus
    truncation) and ``top_k`` (0: no top-k)."""

    temperature: torch.Tensor  # [rows] float
    top_p: torch.Tensor  # [rows] float
    top_k: torch.Tensor  # [rows] long

    @classmethod
    def of(cls, settings: list[Sampling]) -> RowSampling:
        """One row per resolved :class:`Sampling` (unset fields at their neutral values)."""
        return cls(
            torch.tensor([float(s.temperature or 0.0) for s in settings]),
            torch.tensor([1.0 if s.top_p is None else float(s.top_p) for s in settings]),
            torch.tensor([s.top_k or 0 for s in settings], dtype=torch.long),
        )

    @classmethod
    def uniform(cls, sampling: Sampling, rows: int) -> RowSampling:
        """``rows`` rows that all sample as ``sampling`` says."""
        return cls.of([sampling]).repeated(rows)

    def repeated(self, times: int) -> RowSampling:
        """Each row ``times`` times in a row (a sample's settings for each of its particles)."""
        return RowSampling(*(t.repeat_interleave(times) for t in attrs.astuple(self, recurse=False)))

    def take(self, at: torch.Tensor) -> RowSampling:
        return RowSampling(*(t[at] for t in attrs.astuple(self, recurse=False)))

    def joined(self, other: RowSampling) -> RowSampling:
        return RowSampling(
            *(
                torch.cat([a, b])
                for a, b in zip(attrs.astuple(self, recurse=False), attrs.astuple(other, recurse=False))
            )
        )

    @property
    def hot(self) -> bool:
        """Whether any row samples (temperature > 0)."""
        return bool((self.temperature > 0).any())

    @property
    def changes(self) -> torch.Tensor:
        """``[rows]`` whether a row's settings change its distribution (it samples or truncates)."""
        return (self.temperature > 0) | (self.top_p < 1.0) | (self.top_k > 0)

    def __len__(self) -> int:
        return len(self.temperature)
