"""Particle scores: how promising a partial canvas of a population is (no model call needed).

Scores read the canvas's own commit record, so they cost nothing beyond the decode. They
compose in YAML as a weighted sum (the practitioner guide's "hybrid evaluation"): each term has
a ``weight``, and :class:`WeightedSum` adds them up.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import torch

from dlmsearch.search.records.verifier import Verifier
from dlmsearch.validation import check_choice, check_type, number


@attrs.frozen
class ParticleView:
    """Each particle's generation region and how it was committed."""

    sample: torch.Tensor  # [R] sample index within the batch
    tokens: torch.Tensor  # [R, n]
    masked: torch.Tensor  # [R, n] still the mask
    committed: torch.Tensor  # [R, n] committed by the decoder (not given)
    log_confidence: torch.Tensor  # [R, n] log-probability of each committed token when committed (0 elsewhere)
    verifier: Verifier | None
    remask: torch.Tensor | None = (
        None  # [R] the model's re-check of complete particles (see RemaskAgreement), where run
    )


class ParticleScore(Protocol):
    weight: float

    def __call__(self, view: ParticleView) -> torch.Tensor:
        """``[R]`` score, higher is better (before ``weight``)."""


@attrs.define
class LogProbability:
    """The model's log-probability of the committed tokens: their ``sum``, their ``mean``
    (comparable between particles that committed different numbers of tokens), or the ``min``
    (the particle's weakest commitment)."""

    weight: float = attrs.field(default=1.0, validator=check_type(float))
    reduce: str = attrs.field(default="mean", validator=check_choice("mean", "sum", "min"))

    def __call__(self, view: ParticleView) -> torch.Tensor:
        if self.reduce == "min":
            return torch.where(view.committed, view.log_confidence, 0.0).min(dim=1).values
        total = view.log_confidence.sum(dim=1)
        return total / view.committed.sum(dim=1).clamp(min=1) if self.reduce == "mean" else total


@attrs.define
class RepetitionPenalty:
    """Minus the share of repeated ``n``-grams among the filled n-grams (text that loops)."""

    weight: float = attrs.field(default=1.0, validator=check_type(float))
    n: int = number(int, 1, default=3)

    def __call__(self, view: ParticleView) -> torch.Tensor:
        penalties = []
        for tokens, masked in zip(view.tokens.tolist(), view.masked.tolist()):
            grams = [
                tuple(tokens[i : i + self.n])
                for i in range(len(tokens) - self.n + 1)
                if not any(masked[i : i + self.n])
            ]
            penalties.append(-(len(grams) - len(set(grams))) / len(grams) if grams else 0.0)
        return torch.tensor(penalties)


@attrs.define
class Consistency:
    """0 for a particle the task's verifier still finds consistent, -1 for one it rejects
    (a soft version of pruning: the particle lives on, ranked down)."""

    weight: float = attrs.field(default=10.0, validator=check_type(float))

    def __call__(self, view: ParticleView) -> torch.Tensor:
        if view.verifier is None:
            raise ValueError("the consistency score needs a task with a verifier")
        return view.verifier.consistent(view.sample, view.tokens, view.masked).float() - 1.0


@attrs.define
class RemaskAgreement:
    """The model checks a complete particle: its committed positions are masked again in
    ``groups`` interleaved groups (one extra row per group, all in one extra step) and each is
    scored by the model's view with the rest filled in: ``log c`` where the model's best token
    is the committed one, ``log(1 - c)`` (a bound on the committed token's probability) where it
    is not; the mean over positions. A contradiction (a Sudoku digit twice in a unit) is seen
    from the other side, so this separates wrong complete outputs that the commit-time
    probabilities cannot. Run once, at the final choice, over samples with more than one
    complete candidate; elsewhere (resampling) the term is 0."""

    weight: float = attrs.field(default=1.0, validator=check_type(float))
    groups: int = number(int, 1, default=3)
    needs_model: bool = attrs.field(default=True, init=False)

    def __call__(self, view: ParticleView) -> torch.Tensor:
        return torch.zeros(len(view.tokens)) if view.remask is None else view.remask


@attrs.define
class WeightedSum:
    """``sum(term.weight * term(view))`` over ``terms``."""

    terms: list = attrs.field(factory=lambda: [LogProbability()])

    def __attrs_post_init__(self) -> None:
        if not self.terms:
            raise ValueError("a weighted score needs at least one term")
        bad = [type(t).__name__ for t in self.terms if not callable(t) or not hasattr(t, "weight")]
        if bad:
            raise TypeError(f"score terms must be particle scores with a weight; got {', '.join(bad)}")

    @property
    def needs_verifier(self) -> bool:
        return any(isinstance(t, Consistency) for t in self.terms)

    @property
    def remask_groups(self) -> int:
        """Groups of the model's re-check of complete particles (0: no term asks for it)."""
        return max((t.groups for t in self.terms if isinstance(t, RemaskAgreement)), default=0)

    def __call__(self, view: ParticleView) -> torch.Tensor:
        return sum(t.weight * t(view) for t in self.terms)
