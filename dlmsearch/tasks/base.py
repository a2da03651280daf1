"""What a task gives the runner: items to decode, a judge, and a way to show results."""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import torch

from dlmsearch.search.records.verifier import Verifier


@attrs.frozen
class TaskItem:
    """One item: ``prompt`` ids, the initial generation region (mask where to fill), a reference,
    and the ``question``: what a verifier may see (never the reference answer)."""

    id: str
    prompt: torch.Tensor
    generation: torch.Tensor
    reference: Any = None
    question: Any = None


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
