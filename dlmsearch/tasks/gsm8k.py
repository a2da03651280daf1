"""GSM8K: grade-school maths word problems, judged by the number after the model's ``####``.

The test split (1319 problems, MIT) ships inside the package; ``task.path`` reads another JSONL
file with the same ``question`` / ``answer`` fields. The prompt is the question followed by
``instruction``; answers are read by :func:`dlmsearch.tasks.answers.extract_answer`, which
sees only the model's text, and compared to the reference number exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import attrs
import torch

from dlmsearch.shipped import package_data
from dlmsearch.tasks.answers import extract_answer, gsm8k_reference, numbers_equal
from dlmsearch.tasks.base import TaskItem
from dlmsearch.tasks.text import TaskFileError, TextTask, read_jsonl, shorten
from dlmsearch.validation import check_type

# Our choice: the chain-of-thought instruction of Qwen2.5-Math ("Please reason step by step, and
# put your final answer within \boxed{}.") with GSM8K's own "#### N" answer format instead.
DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer after ####."


def shipped_gsm8k_path() -> Path:
    """The GSM8K test split shipped inside the package."""
    return package_data("gsm8k") / "test.jsonl"


@attrs.frozen
class GSM8KProblem:
    """A problem: its question, the worked ``solution`` and the gold number after ``####``."""

    question: str
    solution: str
    reference: str


def load_gsm8k(path: str | Path) -> list[tuple[str, GSM8KProblem]]:
    """``(id, problem)`` per line of a GSM8K-style JSONL file; ids are ``stem:line``."""
    file = Path(path).expanduser()
    problems = []
    for line, record in read_jsonl(file, ("question", "answer")):
        question, solution = record["question"], record["answer"]
        if not isinstance(question, str) or not isinstance(solution, str):
            raise TaskFileError(f"{file}:{line}: 'question' and 'answer' must be strings")
        reference = gsm8k_reference(solution)
        if reference is None:
            raise TaskFileError(f"{file}:{line}: the answer does not end in '#### N' with a number N")
        problems.append(
            (f"{file.stem}:{line}", GSM8KProblem(question=question, solution=solution, reference=reference))
        )
    return problems


def gsm8k_prompt(question: str, instruction: str) -> str:
    """The question, then the instruction on its own line (none when empty)."""
    return f"{question.strip()}\n{instruction.strip()}" if instruction.strip() else question.strip()


@attrs.define(kw_only=True)
class GSM8KTask(TextTask):
    """GSM8K problems (the shipped test split, or ``path``); correct when the stated number equals the reference."""

    instruction: str = attrs.field(default=DEFAULT_INSTRUCTION, validator=check_type(str))
    name: ClassVar[str] = "gsm8k"

    @property
    def source(self) -> str:
        return self.path or "GSM8K test split"

    def sources(self) -> list[tuple[str, str, Any]]:
        problems = load_gsm8k(self.path if self.path else shipped_gsm8k_path())
        return [(id_, gsm8k_prompt(p.question, self.instruction), p) for id_, p in problems]

    def answer(self, tokens: torch.Tensor) -> str | None:
        """The number the generation states (from its text only)."""
        return extract_answer(self.decode(tokens))

    def judge(self, item: TaskItem, tokens: torch.Tensor) -> bool:
        return numbers_equal(self.answer(tokens), item.reference.reference)

    def details(self, item: TaskItem, tokens: torch.Tensor) -> dict[str, Any]:
        return {"answer": self.answer(tokens), "reference": item.reference.reference}

    def render(self, item: TaskItem, output: str) -> str:
        answer = extract_answer(output)
        verdict = "correct" if numbers_equal(answer, item.reference.reference) else "WRONG"
        return "\n".join(
            [
                f"[{item.id}] question: {shorten(item.reference.question)}",
                "--- output:",
                output.strip(),
                f"--- answer: {answer} (reference {item.reference.reference}): {verdict}",
            ]
        )
