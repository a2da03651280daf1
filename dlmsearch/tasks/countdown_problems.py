"""Making Countdown problems and their worked answers (the training data and the held-out tiers).

A problem is three (or four) numbers and a target in 1-100 that some equation reaches using each
number once, with ``+ - * /`` and every intermediate result a non-negative whole number. With
three numbers every such equation is two steps: combine a pair, then combine the result with the
third number (in either order); with four, three steps, the later ones reading the earlier results
(where decoding order starts to matter). :func:`solutions` lists them all as worked answers
``a op b=x,x op c=t``, the format the shipped model writes: each step is one short piece of
arithmetic, and :func:`dlmsearch.tasks.arithmetic.extract_equation` reads the chain back into
one equation for the judge.

Commutative steps are written with the larger operand first, so one equation has one spelling.
"""

from __future__ import annotations

import itertools
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


def solutions(numbers: tuple[int, ...]) -> dict[int, list[str]]:
    """Worked answers ``"a op b=x,x op c=t"`` (three numbers; four: three steps) by the target ``t``
    (in 1-100) they reach: every way of combining two of the numbers left into one, until one is left.
    The step's result goes first among the numbers left, so with three numbers the second step
    combines it with the third."""
    found: dict[int, dict[str, None]] = {}
    for value, steps in _worked(tuple(numbers), ()):
        if value in TARGETS:
            found.setdefault(value, {})[",".join(steps)] = None
    return {target: list(answers) for target, answers in sorted(found.items())}


def _worked(numbers: tuple[int, ...], steps: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
    """Every (value, steps) that combining ``numbers`` pair by pair reaches, after ``steps`` so far."""
    if len(numbers) == 1:
        return [(numbers[0], steps)]
    out = []
    for i, j in itertools.combinations(range(len(numbers)), 2):
        rest = tuple(n for k, n in enumerate(numbers) if k not in (i, j))
        for step in combine(numbers[i], numbers[j]):
            out += _worked((step.value, *rest), (*steps, step.text()))
    return out


@attrs.frozen
class CountdownProblem:
    """The numbers to use (each once, in the order shown) and the target to reach."""

    numbers: tuple[int, ...]
    target: int

    def key(self) -> tuple[int, ...]:
        """The numbers as a multiset: the unit held out of training."""
        return tuple(sorted(self.numbers))


def draw_worked(rng: np.random.Generator, low: int, high: int, count: int = 3) -> tuple[CountdownProblem, list[str]]:
    """``count`` distinct numbers from ``low..high``, a target drawn uniformly from those they reach,
    and that target's worked answers (the solutions are enumerated once)."""
    while True:
        numbers = tuple(int(n) for n in rng.choice(np.arange(low, high + 1), size=count, replace=False))
        worked = solutions(numbers)
        if worked:
            targets = list(worked)
            target = int(targets[rng.integers(len(targets))])
            return CountdownProblem(numbers=numbers, target=target), worked[target]


def draw_problem(rng: np.random.Generator, low: int, high: int, numbers: int = 3) -> CountdownProblem:
    """``numbers`` distinct numbers from ``low..high`` and a target drawn uniformly from those they reach."""
    return draw_worked(rng, low, high, numbers)[0]


def draw_tier(
    seed: int, count: int, low: int, high: int, excluded: set[tuple[int, ...]] = frozenset(), numbers: int = 3
) -> list[CountdownProblem]:
    """``count`` problems of ``numbers`` numbers with distinct number sets, none of them in ``excluded``.

    Args:
        seed: the generator's seed (a tier is written once, reproducibly).
        count: problems in the tier.
        low: the smallest number drawn.
        high: the largest number drawn.
        excluded: number sets (sorted tuples) already used elsewhere (other tiers, training's hold-out).
        numbers: numbers per problem (3, or 4 for answers of three steps).
    """
    rng = np.random.default_rng(seed)
    problems: list[CountdownProblem] = []
    seen = set(excluded)
    while len(problems) < count:
        problem = draw_problem(rng, low, high, numbers)
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
