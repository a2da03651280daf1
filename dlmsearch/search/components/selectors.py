"""Selectors: which branches stay live between rollout steps, and which one is committed."""

from __future__ import annotations

import math
from typing import ClassVar, Protocol

import attrs
import torch


class Selector(Protocol):
    reevaluates: bool  # True: the driver runs the trigger on every branch after each rollout step

    def prune(
        self, live: torch.Tensor, branch_fires: torch.Tensor, scores: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Before a further rollout step: new ``live [S, K]`` and ``restart [S]`` (stop and adopt the best)."""

    def best(self, scores: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """``[S]`` index of the branch to commit."""


def best_of(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``[S]`` the best-scoring allowed entry of each row (the first on ties): a lookahead's live
    branch, a population's finalist."""
    return torch.where(allowed, scores, -math.inf).argmax(dim=1)


@attrs.define
class BestScoreSelector:
    """ETE: keep every branch, commit the highest score."""

    reevaluates: ClassVar[bool] = False

    def prune(
        self, live: torch.Tensor, branch_fires: torch.Tensor, scores: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return live, torch.zeros(live.shape[0], dtype=torch.bool)

    def best(self, scores: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        return best_of(scores, live)


@attrs.define
class SettledFirstSelector:
    """AdaLook's branch re-evaluation: branches whose own state no longer triggers win.

    Before each further rollout step: if some live branches still trigger and others do not,
    the triggering ones are pruned; if all still trigger, the best branch is adopted at once
    and a fresh lookahead starts from its state (``restart``).
    """

    reevaluates: ClassVar[bool] = True

    def prune(
        self, live: torch.Tensor, branch_fires: torch.Tensor, scores: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        settled = live & ~branch_fires
        all_fire = live.any(dim=1) & ~settled.any(dim=1)
        return torch.where(all_fire[:, None], live, settled), all_fire

    def best(self, scores: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        return best_of(scores, live)
