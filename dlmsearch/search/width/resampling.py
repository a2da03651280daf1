"""When a population is pruned or resampled: never (best-of-N), keep the best few (beam), or
draw in proportion to the weights (sequential Monte Carlo).

A policy sees, per sample, the particles' scores ``[S, P]``, which of them may be kept
(``candidates``: alive, sample not stopped) and their canvases, and returns for every slot the
particle it continues from (``[S, P]``), or None to leave the population as it is.
"""

from __future__ import annotations

import math
from typing import Protocol

import attrs
import torch

from dlmsearch.validation import number


@attrs.frozen
class ResamplingPoint:
    """A population at a resampling point, per sample: what a resampling policy draws the next one from."""

    scores: torch.Tensor  # [S, P] each particle's score now
    base: torch.Tensor  # [S, P] its score at the last resampling point
    candidates: torch.Tensor  # [S, P] the particles that may be drawn (alive, of a sample still decoding)
    tokens: torch.Tensor  # [S, P, n] the particles' generation regions
    uniform: torch.Tensor  # [S] a seeded draw per sample


class Resampling(Protocol):
    every: int  # rounds between resampling points (0: never)

    def sources(self, point: ResamplingPoint) -> torch.Tensor | None:
        """``[S, P]`` source particle per slot, or None: no resampling at this point."""


def own_slots(samples: int, size: int) -> torch.Tensor:
    """``[S, P]`` every slot its own source (the population as it is)."""
    return torch.arange(size).expand(samples, size)


def _fill(survivor: torch.Tensor, order: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Survivors keep their own slots; every other slot copies the survivors in turn, best first.

    ``order [S, P]`` lists particles best first; the first ``kept [S]`` of them survive.
    """
    samples, size = survivor.shape
    slots = own_slots(samples, size)
    others = (~survivor).long().cumsum(dim=1) - 1  # 0, 1, ... over the non-surviving slots
    turn = order.gather(1, (others % kept.clamp(min=1)[:, None]))
    source = torch.where(survivor, slots, turn)
    return torch.where((kept > 0)[:, None], source, slots)


@attrs.define
class NoResampling:
    """Best-of-N: particles run independently to the end."""

    every: int = 0

    def sources(self, point: ResamplingPoint) -> torch.Tensor | None:
        return None


@attrs.define
class KeepBest:
    """Beam: every ``every`` rounds keep the ``keep`` best distinct canvases of each sample;
    the other slots take copies of them (which then diverge again)."""

    keep: int = number(int, 1, default=2)
    every: int = number(int, 1, default=1)

    def sources(self, point: ResamplingPoint) -> torch.Tensor | None:
        scores, candidates, tokens = point.scores, point.candidates, point.tokens
        size = scores.shape[1]
        same = (tokens[:, :, None] == tokens[:, None, :]).all(dim=3) & candidates[:, None, :]
        earlier = torch.ones(size, size, dtype=torch.bool).tril(-1)  # [p, q]: q < p
        repeat = (same & earlier).any(dim=2)  # an earlier candidate holds the same canvas
        eligible = candidates & ~repeat
        ranked = torch.where(eligible, scores, -math.inf)
        order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
        kept = eligible.sum(dim=1).clamp(max=self.keep)
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(size).expand_as(order).contiguous())
        return _fill(rank < kept[:, None], order, kept)


@attrs.define
class SMCResampling:
    """Sequential Monte Carlo: weights ``exp((score - score at the last resampling) / temperature)``;
    every ``every`` rounds, where the effective sample size falls below ``ess_fraction`` of the
    live particles, draw the population anew by systematic resampling (seeded)."""

    temperature: float = number(float, 1e-6, default=0.1)
    every: int = number(int, 1, default=1)
    ess_fraction: float = number(float, 0.0, 1.0, default=0.5)

    def sources(self, point: ResamplingPoint) -> torch.Tensor | None:
        scores, candidates = point.scores, point.candidates
        samples, size = scores.shape
        log_weight = torch.where(candidates, (scores - point.base) / self.temperature, -math.inf)
        weight = torch.softmax(log_weight.double(), dim=1)
        weight = torch.nan_to_num(weight, nan=0.0)  # a sample without candidates
        ess = 1.0 / (weight**2).sum(dim=1).clamp(min=1e-300)
        resample = candidates.any(dim=1) & (ess < self.ess_fraction * candidates.sum(dim=1))
        cdf = weight.cumsum(dim=1)
        cdf[:, -1] = 1.0
        points = (point.uniform.double()[:, None] + torch.arange(size, dtype=torch.double)) / size
        drawn = torch.searchsorted(cdf, points).clamp(max=size - 1)
        return torch.where(resample[:, None], drawn, own_slots(samples, size))
