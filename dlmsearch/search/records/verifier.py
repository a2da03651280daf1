"""What a search may ask of a task about its outputs: the protocol populations prune, stop and vote with.

The search owns the protocol (tasks implement it), so ``search/`` never imports ``tasks/``.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Verifier(Protocol):
    """A task's check of outputs, built from the questions of a batch only (indexed by ``sample``).

    ``consistent`` tells whether a partial output can still be right (False ends a particle);
    ``accepts`` whether a complete output passes the task's own check (False where the task
    cannot tell); ``answers`` the extracted answer per output, for majority votes.
    """

    checks_partial: bool
    checks_complete: bool  # accepts() can say True (False: a free-text task's verifier, which only extracts answers)

    def consistent(self, sample: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """``[R]`` bool for generation regions ``tokens [R, n]`` with ``masked`` positions still open."""

    def accepts(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``[R]`` bool for complete generation regions."""

    def violations(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``[R]`` float: how many of the task's rules complete generation regions break (0: none; a task
        that cannot count them says 1 for an output it does not accept). A tree search's graded value."""

    def answers(self, sample: torch.Tensor, tokens: torch.Tensor) -> list[str | None]:
        """The answer each complete generation region states (None: none found)."""
