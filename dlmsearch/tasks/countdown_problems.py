"""Making Countdown problems and their worked answers (the training data and the held-out tiers).

A problem is three numbers and a target in 1-100 that some equation reaches using each number
once, with ``+ - * /`` and every intermediate result a non-negative whole number. With three
numbers every such equation is two steps: combine a pair, then combine the result with the
third number (in either order). :func:`solutions` lists them all as worked answers
``a op b=x,x op c=t``, the format the shipped model writes: each step is one short piece of
arithmetic, and :func:`dlmsearch.tasks.arithmetic.extract_equation` reads the chain back into
one equation for the judge.

Commutative steps are written with the larger operand first, so one equation has one spelling.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import numpy as np

TARGETS = range(1, 101)


@attrs.frozen
class Step:
    """``left op right = value``, all whole numbers."""

    left: int
    op: str
    right: int
    value: int

    def text(self) -> str:
        return f"{self.left}{self.op}{self.right}={self.value}"


def combine(a: int, b: int) -> list[Step]:
    """Every step over the pair ``(a, b)`` whose result is a non-negative whole number."""
    high, low = max(a, b), min(a, b)
    steps = [Step(high, "+", low, high + low), Step(high, "*", low, high * low), Step(high, "-", low, high - low)]
    for left, right in ((a, b), (b, a)):
        if right and left % right == 0:
            steps.append(Step(left, "/", right, left // right))
    return list({s: None for s in steps})  # a == b gives some steps twice


def solutions(numbers: tuple[int, int, int]) -> dict[int, list[str]]:
    """Worked answers ``"a op b=x,x op c=t"`` by the target ``t`` (in 1-100) they reach."""
    found: dict[int, dict[str, None]] = {}
    for i, j in ((0, 1), (0, 2), (1, 2)):
        third = numbers[3 - i - j]
        for first in combine(numbers[i], numbers[j]):
            for second in combine(first.value, third):
                if second.value in TARGETS:
                    found.setdefault(second.value, {})[f"{first.text()},{second.text()}"] = None
    return {target: list(answers) for target, answers in sorted(found.items())}


@attrs.frozen
class CountdownProblem:
    """The numbers to use (each once, in the order shown) and the target to reach."""

    numbers: tuple[int, ...]
    target: int

    def key(self) -> tuple[int, ...]:
        """The numbers as a multiset: the unit held out of training."""
        return tuple(sorted(self.numbers))


def draw_worked(rng: np.random.Generator, low: int, high: int) -> tuple[CountdownProblem, list[str]]:
    """Three distinct numbers from ``low..high``, a target drawn uniformly from those they reach,
    and that target's worked answers (the solutions are enumerated once)."""
    while True:
        numbers = tuple(int(n) for n in rng.choice(np.arange(low, high + 1), size=3, replace=False))
        worked = solutions(numbers)
        if worked:
            targets = list(worked)
            target = int(targets[rng.integers(len(targets))])
            return CountdownProblem(numbers=numbers, target=target), worked[target]


def draw_problem(rng: np.random.Generator, low: int, high: int) -> CountdownProblem:
    """Three distinct numbers from ``low..high`` and a target drawn uniformly from those they reach."""
    return draw_worked(rng, low, high)[0]


def draw_tier(
    seed: int, count: int, low: int, high: int, excluded: set[tuple[int, ...]] = frozenset()
) -> list[CountdownProblem]:
    """``count`` problems with distinct number triples, none of them in ``excluded``."""
    rng = np.random.default_rng(seed)
    problems: list[CountdownProblem] = []
    seen = set(excluded)
    while len(problems) < count:
        problem = draw_problem(rng, low, high)
        if problem.key() not in seen:
            seen.add(problem.key())
            problems.append(problem)
    return problems


def write_tier(path: Path, problems: list[CountdownProblem]) -> None:
    """d1's JSONL layout: ``input`` "a,b,c" and ``output`` the target."""
    lines = [json.dumps({"input": ",".join(map(str, p.numbers)), "output": str(p.target)}) for p in problems]
    path.write_text("\n".join(lines) + "\n")


def triples_in(problems: list[CountdownProblem]) -> set[tuple[int, ...]]:
    return {p.key() for p in problems}
