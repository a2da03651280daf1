"""Which particle of a population becomes the sample's output.

Only complete particles that are alive compete (all of them where none is). ``best_score``
trusts the model; ``verified`` prefers what the task's verifier accepts; ``majority_vote``
takes the answer most particles state (self-consistency), then its best-scoring particle.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

import attrs
import torch

from dlmsearch.search.components.selectors import best_of
from dlmsearch.search.records.verifier import Verifier


@attrs.frozen
class Finalists:
    """A population's particles at the end, per sample: what a final choice picks from."""

    scores: torch.Tensor  # [S, P] each particle's score
    candidates: torch.Tensor  # [S, P] the particles that compete (complete and alive, else all)
    accepted: torch.Tensor  # [S, P] the verifier accepted its output
    tokens: torch.Tensor  # [S, P, n] the particles' generation regions


class FinalChoice(Protocol):
    needs_verifier: bool

    def choose(self, finalists: Finalists, verifier: Verifier | None) -> torch.Tensor:
        """``[S]`` particle per sample, among the finalists (the verifier: for rules that read answers)."""


@attrs.define
class BestScore:
    needs_verifier: bool = attrs.field(default=False, init=False)

    def choose(self, finalists: Finalists, verifier: Verifier | None) -> torch.Tensor:
        return best_of(finalists.scores, finalists.candidates)


@attrs.define
class Verified:
    """An accepted particle if there is one (the best-scoring such), else the best score."""

    needs_verifier: bool = attrs.field(default=True, init=False)

    def choose(self, finalists: Finalists, verifier: Verifier | None) -> torch.Tensor:
        scores, candidates = finalists.scores, finalists.candidates
        good = candidates & finalists.accepted
        return best_of(scores, torch.where(good.any(dim=1, keepdim=True), good, candidates))


@attrs.define
class MajorityVote:
    """The answer stated by most candidates (ties: the one with the best-scoring particle)."""

    needs_verifier: bool = attrs.field(default=True, init=False)

    def choose(self, finalists: Finalists, verifier: Verifier | None) -> torch.Tensor:
        assert verifier is not None
        scores, candidates, tokens = finalists.scores, finalists.candidates, finalists.tokens
        samples, size = scores.shape
        chosen = best_of(scores, candidates)
        for s in range(samples):
            members = candidates[s].nonzero().squeeze(1)
            answers = verifier.answers(torch.full((len(members),), s), tokens[s, members])
            votes = Counter(a for a in answers if a is not None)
            if not votes:
                continue
            top = max(votes.values())
            winners = {a for a, n in votes.items() if n == top}
            allowed = torch.zeros(size, dtype=torch.bool)
            allowed[members[[a in winners for a in answers]]] = True
            chosen[s] = best_of(scores[s : s + 1], allowed[None])[0]
        return chosen
