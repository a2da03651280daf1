"""Countdown: reach a target with an equation that uses each given number exactly once.

Problems come from a tier shipped inside the package (``task.tier``: d1's 3-number split,
256 problems, Apache-2.0, or the project's own held-out tiers made by
``experiments/make_countdown_tiers.py``), or ``task.path`` (JSONL with ``input`` "a,b,c" and
``output`` the target). The
equation is read from the model's text only (:func:`extract_equation`) and checked by the safe
evaluator of :mod:`dlmsearch.tasks.arithmetic`; the problem's numbers and target are used by the
judge alone.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import attrs
import torch

from dlmsearch.shipped import package_data
from dlmsearch.tasks.arithmetic import (
    InvalidExpression,
    evaluate,
    extract_equation,
    format_value,
    uses_exactly,
    wrong_steps,
)
from dlmsearch.tasks.base import TaskItem
from dlmsearch.tasks.countdown_problems import CountdownProblem
from dlmsearch.tasks.text import TaskFileError, TextTask, read_jsonl
from dlmsearch.validation import check_choice, check_type

# Our wording, in the spirit of d1's Countdown prompt: the rules, then the answer format.
DEFAULT_TEMPLATE = (
    "Using the numbers {numbers}, write an equation that equals {target}. Use each number exactly once, "
    "and only +, -, *, / and parentheses. Reason step by step, then give only the equation, without "
    "'=' or the result, inside <answer></answer>, for example <answer>(1 + 2) * 3</answer>."
)
PLACEHOLDERS = ("numbers", "target")


# tier -> (file in dlmsearch/data/countdown/, what it holds)
TIERS = {
    "d1": ("countdown_cd3_test.jsonl", "d1's 3-number test split (numbers up to 100)"),
    "small": ("countdown_small.jsonl", "256 problems, numbers 1-20"),
    "medium": ("countdown_medium.jsonl", "256 problems, numbers 1-50"),
    "large": ("countdown_large.jsonl", "256 problems, numbers 1-100"),
    "validation": ("countdown_validation.jsonl", "128 problems, numbers 1-20 (training's checkpoint measure)"),
    "small4": ("countdown_small4.jsonl", "256 problems of four numbers 1-20 (answers of three steps)"),
    "medium4": ("countdown_medium4.jsonl", "256 problems of four numbers 1-50 (answers of three steps)"),
    "validation4": ("countdown_validation4.jsonl", "128 problems of four numbers 1-20 (training's checkpoint measure)"),
}


def shipped_countdown_path(tier: str = "d1") -> Path:
    """A Countdown tier shipped inside the package."""
    if tier not in TIERS:
        raise ValueError(f"task.tier must be one of {', '.join(TIERS)}; got {tier!r}")
    return package_data("countdown") / TIERS[tier][0]


@attrs.frozen
class CountdownCheck:
    """What the judge found: the equation, its value, and why it fails (None when it is correct)."""

    equation: str | None
    value: str | None
    error: str | None

    @property
    def correct(self) -> bool:
        return self.error is None


def load_countdown(path: str | Path) -> list[tuple[str, CountdownProblem]]:
    """``(id, problem)`` per line of a Countdown JSONL file; ids are ``stem:line``."""
    file = Path(path).expanduser()
    problems = []
    for line, record in read_jsonl(file, ("input", "output")):
        try:
            numbers = tuple(int(str(n).strip()) for n in str(record["input"]).split(","))
            target = int(str(record["output"]).strip())
        except ValueError:
            raise TaskFileError(
                f"{file}:{line}: 'input' must be whole numbers separated by commas and 'output' a whole number"
            ) from None
        problems.append((f"{file.stem}:{line}", CountdownProblem(numbers=numbers, target=target)))
    return problems


def check_equation(equation: str | None, problem: CountdownProblem) -> CountdownCheck:
    """Whether ``equation`` uses exactly the problem's numbers and evaluates to its target."""
    if equation is None:
        return CountdownCheck(equation=None, value=None, error="no equation found")
    try:
        evaluation = evaluate(equation)
    except InvalidExpression as error:
        return CountdownCheck(equation=equation, value=None, error=str(error))
    value = format_value(evaluation.value)
    if not uses_exactly(evaluation.numbers, problem.numbers):
        used = ", ".join(map(str, evaluation.numbers))
        return CountdownCheck(
            equation=equation,
            value=value,
            error=f"uses {used}, not each of {', '.join(map(str, problem.numbers))} once",
        )
    if evaluation.value != problem.target:
        return CountdownCheck(equation=equation, value=value, error=f"equals {value}, not {problem.target}")
    return CountdownCheck(equation=equation, value=value, error=None)


@attrs.frozen
class CountdownVerifier:
    """Accepts an output whose equation uses the given numbers once each and hits the target."""

    decode: Callable[[torch.Tensor], str]
    problems: tuple[CountdownProblem, ...]
    checks_partial: ClassVar[bool] = False
    checks_complete: ClassVar[bool] = True  # accepts() judges a complete output

    def consistent(self, sample: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(tokens), dtype=torch.bool)

    def accepts(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.tensor(
            [
                check_equation(extract_equation(self.decode(row)), self.problems[int(s)]).correct
                for s, row in zip(sample, tokens)
            ],
            dtype=torch.bool,
        )

    def violations(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """1 where the equation is not a correct one, else 0 (the check does not count its faults)."""
        return (~self.accepts(sample, tokens)).float()

    def answers(self, sample: torch.Tensor, tokens: torch.Tensor) -> list[str | None]:
        """The value each equation reaches (equations that reach the same value vote together)."""
        values = []
        for s, row in zip(sample, tokens):
            found = check_equation(extract_equation(self.decode(row)), self.problems[int(s)])
            values.append(found.value if found.correct else None)
        return values


def _check_template(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    names = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    unknown, missing = names - set(PLACEHOLDERS), set(PLACEHOLDERS) - names
    if unknown or missing:
        raise ValueError(
            f"{attribute.name} must contain {{numbers}} and {{target}} and no other placeholders; got {value!r}"
        )


@attrs.define(kw_only=True)
class CountdownTask(TextTask):
    """Countdown problems (the shipped split, or ``path``); the prompt is ``template`` filled in."""

    template: str = attrs.field(
        default=DEFAULT_TEMPLATE,
        converter=lambda t: DEFAULT_TEMPLATE if t is None else t,
        validator=[check_type(str), _check_template],
    )
    tier: str = attrs.field(default="d1", validator=[check_type(str), check_choice(*TIERS)])
    strict_steps: bool = attrs.field(default=False, validator=check_type(bool))  # also every written step must be right
    name: ClassVar[str] = "countdown"

    @property
    def source(self) -> str:
        return self.path or f"Countdown tier {self.tier}: {TIERS[self.tier][1]}"

    def prompt(self, problem: CountdownProblem) -> str:
        return self.template.format(numbers=", ".join(map(str, problem.numbers)), target=problem.target)

    def sources(self) -> list[tuple[str, str, Any]]:
        problems = load_countdown(self.path if self.path else shipped_countdown_path(self.tier))
        return [(id_, self.prompt(p), p) for id_, p in problems]

    def question(self, text: str, reference: Any) -> CountdownProblem:
        """The numbers and the target are the question itself."""
        return reference

    def verifier(self, questions: list[Any]) -> CountdownVerifier:
        return CountdownVerifier(self.decode, tuple(questions))

    def check(self, item: TaskItem, text: str) -> CountdownCheck:
        """The equation's check; with ``strict_steps`` a correct equation whose written steps
        claim a wrong intermediate result (``17+14=29,29*3=93``) fails too."""
        found = check_equation(extract_equation(text), item.reference)
        if found.correct and self.strict_steps:
            wrong = wrong_steps(text)
            if wrong:
                return attrs.evolve(found, error=f"the written step {wrong[0]} is wrong")
        return found

    def judge(self, item: TaskItem, tokens: torch.Tensor) -> bool:
        return self.check(item, self.decode(tokens)).correct

    def details(self, item: TaskItem, tokens: torch.Tensor) -> dict[str, Any]:
        found = self.check(item, self.decode(tokens))
        return {
            "equation": found.equation,
            "value": found.value,
            "why_wrong": found.error,
        }  # not "error": that marks a failed decode

    def render(self, item: TaskItem, output: str) -> str:
        problem, found = item.reference, self.check(item, output)
        verdict = "correct" if found.correct else f"WRONG ({found.error})"
        return "\n".join(
            [
                f"[{item.id}] numbers {', '.join(map(str, problem.numbers))} -> {problem.target}",
                "--- output:",
                output.strip(),
                f"--- equation: {found.equation} = {found.value}: {verdict}",
            ]
        )
