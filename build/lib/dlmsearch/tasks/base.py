"""What a task gives the runner: items to decode, a judge, and a way to show results."""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import torch


@attrs.frozen
class TaskItem:
    """One item: ``prompt`` ids, the initial generation region (mask where to fill), a reference,
    and the ``question``: what a verifier may see (never the reference answer)."""

    id: str
    prompt: torch.Tensor
    generation: torch.Tensor
    reference: Any = None
    question: Any = None


class Verifier(Protocol):
    """A task's check of outputs, built from the questions of a batch only (indexed by ``sample``).

    ``consistent`` tells whether a partial output can still be right (False ends a particle);
    ``accepts`` whether a complete output passes the task's own check (False where the task
    cannot tell); ``answers`` the extracted answer per output, for majority votes.
    """

    checks_partial: bool

    def consistent(self, sample: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """``[R]`` bool for generation regions ``tokens [R, n]`` with ``masked`` positions still open."""

    def accepts(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``[R]`` bool for complete generation regions."""

    def answers(self, sample: torch.Tensor, tokens: torch.Tensor) -> list[str | None]:
        """The answer each complete generation region states (None: none found)."""


class Task(Protocol):
    name: str
    gen_length: int
    block_length: int

    def items(self) -> list[TaskItem]:
        """The items to decode (never empty: an empty source is an error)."""

    def judge(self, item: TaskItem, tokens: torch.Tensor) -> bool | None:
        """Whether the generated tokens are correct, or None where the task cannot judge."""

    def output(self, item: TaskItem, tokens: torch.Tensor) -> str:
        """The generation as text for the results file."""

    def details(self, item: TaskItem, tokens: torch.Tensor) -> dict[str, Any]:
        """Extra per-item fields for the results file (e.g. the extracted answer); may be empty."""

    def token_strings(self, ids: list[int]) -> list[str]:
        """A readable string per token id, for traces."""

    def verifier(self, questions: list[Any]) -> Verifier:
        """The task's verifier for a batch whose items have these ``question`` fields."""

    def render(self, item: TaskItem, output: str) -> str:
        """A human-readable view of the item and its generation (as written by :meth:`output`)."""
