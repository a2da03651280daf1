"""Length policies: how long a canvas is, decided while it decodes (``decoder/length=...``).

After each round's commit a policy reads the round's evaluation and may append masks at a row's
tail, trim its tail, or replace a masked position by several masks (an insertion); the decode loop
applies the change (:mod:`~dlmsearch.search.records.resize`) to the canvas, its layout and its
evaluation. ``task.gen_length`` is the initial length, ``decoder.length.max_length`` the ceiling.
Both policies read the model's confidence in the end-of-sequence token (EOS, the model's first
stop id) from the most likely token at each position (the ``draft`` statistics: argmax and its
probability, the mask id excluded as everywhere in dlmsearch), vectorised over rows.

* :class:`FixedLength` — the default: the length never changes.
* :class:`Daedal` — DAEDAL (Li et al., arXiv 2508.00819): first grow the all-mask canvas by
  ``expansion_factor`` while the tail's EOS confidence is below ``eos_confidence`` (each probe one
  model call, nothing committed), then append ``eos_check_tokens // 2`` given EOS tokens; while
  decoding, where the EOS confidence is below ``expand_eos_confidence``, the least confident masked
  position of the current block that the step left (confidence below ``low_confidence``) becomes
  ``expansion_factor`` masks.
* :class:`RhoEos` — rho-EOS (Yang et al., arXiv 2601.22527): from the same evaluation as the
  step's commit, the implicit EOS density rho decides: above ``high_density`` the tail is trimmed by
  K, below ``low_density`` K masks are appended, K = ``expansion_factor`` times a multiplier that
  grows with rho's distance from the band (``scheduler``).

The tail EOS confidence (DAEDAL's, and rho-EOS's released code's density): the positions of the
row's generation predicted EOS, at most ``eos_check_tokens`` of them counted from the row's end,
their EOS probabilities summed and divided by ``eos_check_tokens`` (not by how many there were).
"""

from __future__ import annotations

import math
from typing import ClassVar, Protocol, Self

import attrs
import torch

from dlmsearch.search.records.resize import (
    LENGTH_FREE,
    LENGTH_SETTLED,
    LENGTH_SIZING,
    NEW_EOS,
    NEW_MASK,
    Resize,
)
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_choice, number

EOS_STATISTICS = frozenset({"draft", "draft_confidence"})


@attrs.frozen
class LengthAt:
    """What a length policy reads after a round's commit, for the ``n`` rows that committed or probed."""

    before: Canvas  # [n] the canvases the round's evaluation is of
    after: Canvas  # [n] after the round's commit
    evaluation: Evaluation  # [n] of ``before``
    layout: Layout
    calls: torch.Tensor  # [n] model calls each row's sample has made, this round's included


class LengthPolicy(Protocol):
    """When and how a canvas's length changes."""

    statistics: frozenset[str]  # what the engine computes for it (beyond token and confidence)
    changes: bool  # False: the length never changes (the loop skips the policy)
    trims: bool  # it may cut committed tokens off the tail (nothing is final before its length is)
    max_length: int | None  # the ceiling (None: the initial length)
    eos_id: int | None  # bound by the plan: the model's EOS

    def bind(self, eos_id: int | None) -> LengthPolicy:
        """The policy for this model (its EOS id, where the policy names none)."""

    def prepare(self, canvas: Canvas) -> Canvas:
        """The canvases as the first round finds them (their length phase)."""

    def resize(self, at: LengthAt) -> tuple[Resize, torch.Tensor]:
        """The rows' change, and ``[n]`` the rows whose canvas changed (or must be evaluated again)."""

    def extra_rounds(self, initial: int) -> int:
        """Rounds beyond one per position of the ceiling that a sample may need (probes, insertions)."""


@attrs.frozen
class FixedLength:
    """The length the task sets, for the whole decode."""

    statistics: ClassVar[frozenset[str]] = frozenset()
    changes: ClassVar[bool] = False
    trims: ClassVar[bool] = False
    max_length: ClassVar[int | None] = None
    eos_id: ClassVar[int | None] = None

    def bind(self, eos_id: int | None) -> FixedLength:
        return self

    def prepare(self, canvas: Canvas) -> Canvas:
        return canvas

    def resize(self, at: LengthAt) -> tuple[Resize, torch.Tensor]:
        raise NotImplementedError("a fixed length never resizes")

    def extra_rounds(self, initial: int) -> int:
        return 0


def generation_lengths(canvas: Canvas, layout: Layout) -> torch.Tensor:
    """``[n]`` each row's generation length (its present columns after the generation's start)."""
    return canvas.extent - layout.gen_start


def tail_eos_confidence(
    evaluation: Evaluation, canvas: Canvas, layout: Layout, eos_id: int, count: int
) -> torch.Tensor:
    """``[n]`` the tail EOS confidence: over the row's generation, the positions whose most likely
    token is EOS, the last ``count`` of them, their EOS probabilities summed (in float64, as Python
    sums them) and divided by ``count``."""
    column = torch.arange(canvas.tokens.shape[1])[None, :]
    present = canvas.attention & (column >= layout.gen_start)
    is_eos = present & (evaluation.draft.long() == eos_id)
    from_end = is_eos.flip(1).long().cumsum(1).flip(1)  # EOS positions at or after each column
    counted = is_eos & (from_end <= count)
    total = torch.where(counted, evaluation.draft_confidence.double(), 0.0).sum(dim=1)
    return (total / count).float()


def least_confident(scores: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """``[n]`` the eligible column with the lowest score (ties: the lowest column), -1 where none."""
    ranked = torch.where(eligible, scores.double(), math.inf)
    best = ranked.argmin(dim=1)  # the first minimum
    return torch.where(eligible.any(dim=1), best, -1)


@attrs.frozen
class ReadsEos:
    """What both published policies share: they read the model's confidence in its end token, the
    model's own unless ``eos_id`` names another."""

    eos_id: int | None = number(int, 0, optional=True, default=None)
    statistics: ClassVar[frozenset[str]] = EOS_STATISTICS
    changes: ClassVar[bool] = True

    def bind(self, eos_id: int | None) -> Self:
        return self if self.eos_id is not None else attrs.evolve(self, eos_id=eos_id)


@attrs.frozen
class Daedal(ReadsEos):
    """DAEDAL's two stages: before any commit, grow the all-mask canvas while the tail's EOS confidence is
    low, then, while decoding, turn the least confident masked position into several masks while it stays
    low; the authors' settings are the defaults."""

    max_length: int = number(int, 1, default=2048)
    expansion_factor: int = number(int, 1, default=8)
    eos_confidence: float = number(float, 0.0, 1.0, default=0.5)  # the first stage stops growing at this
    expand_eos_confidence: float = number(float, 0.0, 1.0, default=0.9)  # no insertion at or above this
    eos_check_tokens: int = number(int, 1, default=32)
    low_confidence: float = number(float, 0.0, 1.0, default=0.1)  # insertion candidates are below this
    trims: ClassVar[bool] = False

    def prepare(self, canvas: Canvas) -> Canvas:
        """Every canvas starts in the first stage: sized before any commit."""
        return attrs.evolve(canvas, length_phase=torch.full_like(canvas.length_phase, LENGTH_SIZING))

    def resize(self, at: LengthAt) -> tuple[Resize, torch.Tensor]:
        assert self.eos_id is not None, "bind the policy to the model's EOS first"
        length = generation_lengths(at.before, at.layout)
        confidence = tail_eos_confidence(at.evaluation, at.before, at.layout, self.eos_id, self.eos_check_tokens)
        sizing = at.before.length_phase == LENGTH_SIZING
        grow = sizing & (confidence < self.eos_confidence) & (length < self.max_length)
        # the first stage ends: its masks, then half the checked tokens' worth of given EOS
        ended = sizing & ~grow
        appended = torch.where(grow, self.expansion_factor, torch.where(ended, self.eos_check_tokens // 2, 0))
        # the second stage: the least confident masked position the step left in the current block
        candidates = (
            at.before.masked
            & at.after.masked
            & at.before.in_current_block(at.layout)
            & (at.evaluation.confidence < self.low_confidence)
        )
        may_insert = ~sizing & (confidence < self.expand_eos_confidence) & (length < self.max_length)
        column = least_confident(at.evaluation.confidence, candidates & may_insert[:, None])
        inserting = column >= 0
        grown = length + appended + torch.where(inserting, self.expansion_factor - 1, 0)
        resize = Resize(
            length=grown.clamp(max=self.max_length),
            insert_at=torch.where(inserting, column - at.layout.gen_start, -1),
            insert=torch.full_like(length, self.expansion_factor),
            tail=torch.where(ended, NEW_EOS, NEW_MASK),
            phase=torch.where(grow, LENGTH_SIZING, torch.where(ended, LENGTH_FREE, at.before.length_phase)),
        )
        return resize, sizing | inserting

    def extra_rounds(self, initial: int) -> int:
        """The first stage's probes, and one round per insertion's new masks (each adds at most the factor)."""
        probes = -(-max(self.max_length - initial, 0) // self.expansion_factor) + 1
        return probes + self.max_length * self.expansion_factor


SCHEDULERS = ("const", "linear", "exp")
DENSITIES = ("masked_fraction", "tail_confidence")


@attrs.frozen
class RhoEos(ReadsEos):
    """rho-EOS's bidirectional length control: after each step, trim the tail where the implicit EOS
    density is high, append masks where it is low; the authors' published settings are the defaults. ``density``: ``masked_fraction``, the paper's rho (the share of the
    positions masked at the step's model call whose most likely token is EOS, the README's "implicit
    EOS at step t / remaining MASK at step t"), or ``tail_confidence``, what the released code
    computes (the tail EOS confidence, DAEDAL's). After ``max_adjust_rounds`` model calls, and once a
    row has reached ``max_length``, the length is final (the released loop's denoise-only mode)."""

    max_length: int = number(int, 1, default=2048)
    expansion_factor: int = number(int, 1, default=8)
    low_density: float = number(float, 0.0, 1.0, default=0.4)
    high_density: float = number(float, 0.0, 1.0, default=0.6)
    scheduler: str = attrs.field(default="exp", validator=check_choice(*SCHEDULERS))
    density: str = attrs.field(default="masked_fraction", validator=check_choice(*DENSITIES))
    density_interval: float = number(float, 0.0, default=0.1, open_low=True)
    max_multiplier: int = number(int, 1, default=8)
    eos_check_tokens: int = number(int, 1, default=32)
    max_adjust_rounds: int = number(int, 0, default=64)
    trims: ClassVar[bool] = True

    def prepare(self, canvas: Canvas) -> Canvas:
        return canvas

    def rho(self, at: LengthAt) -> torch.Tensor:
        """``[n]`` float32 the density this policy reads."""
        assert self.eos_id is not None, "bind the policy to the model's EOS first"
        if self.density == "tail_confidence":
            return tail_eos_confidence(at.evaluation, at.before, at.layout, self.eos_id, self.eos_check_tokens)
        masked = at.before.masked
        eos = (masked & (at.evaluation.draft.long() == self.eos_id)).sum(dim=1)
        count = masked.sum(dim=1)
        return torch.where(count > 0, eos.float() / count.clamp(min=1).float(), 0.0)

    def steps(self, density: torch.Tensor) -> torch.Tensor:
        """``[n]`` signed change: +K append, -K trim, 0 keep; K = ``expansion_factor`` times the
        scheduler's multiplier of the distance band (``ceil(gap / density_interval)``, capped)."""
        expand, contract = density < self.low_density, density > self.high_density
        gap = torch.where(expand, (self.low_density - density).clamp(min=0.0), 0.0)
        gap = torch.where(contract, (density - self.high_density).clamp(min=0.0), gap)
        band = torch.where(expand | contract, torch.ceil((gap + 1e-12) / self.density_interval).long(), 0)
        if self.scheduler == "const":
            multiplier = torch.ones_like(band)
        elif self.scheduler == "linear":
            multiplier = band.clamp(min=1)
        else:
            multiplier = torch.where(band > 0, 2 ** (band - 1).clamp(min=0), 0).clamp(min=1)
        size = multiplier.clamp(max=self.max_multiplier) * self.expansion_factor
        return torch.where(expand, size, torch.where(contract, -size, 0))

    def resize(self, at: LengthAt) -> tuple[Resize, torch.Tensor]:
        length = generation_lengths(at.before, at.layout)
        final = (
            (at.before.length_phase == LENGTH_SETTLED)
            | (length >= self.max_length)
            | (at.calls > self.max_adjust_rounds)
        )
        change = torch.where(final, 0, self.steps(self.rho(at)))
        new_length = (length + change).clamp(min=0, max=self.max_length)
        resize = Resize(
            length=new_length,
            insert_at=torch.full_like(length, -1),
            insert=torch.ones_like(length),
            tail=torch.full_like(length, NEW_MASK),
            phase=torch.where(final, LENGTH_SETTLED, at.before.length_phase),
        )
        return resize, new_length != length

    def extra_rounds(self, initial: int) -> int:
        """Appended masks: at most ``max_multiplier * expansion_factor`` per model call while lengths may change."""
        return (self.max_adjust_rounds + 1) * self.max_multiplier * self.expansion_factor
