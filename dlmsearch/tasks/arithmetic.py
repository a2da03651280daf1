"""A safe, exact arithmetic evaluator for model-written equations (Countdown).

Model output is untrusted text, so it is never ``eval``-ed: it is parsed with ``ast`` in
``eval`` mode and only integer literals, ``+ - * /``, unary minus and parentheses are walked.
Anything else (names, calls, attributes, powers, floats, strings, ...) is rejected, as is
division by zero. Values are exact :class:`~fractions.Fraction` s, so ``7 / 2 * 2 == 7``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

import attrs

MAX_EXPRESSION = 200  # characters; an equation over a few numbers is far shorter
MAX_LITERAL_DIGITS = 12

_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# Unicode and LaTeX spellings of the four operations, mapped to Python's.
_SPELLINGS = [
    ("\\times", "*"),
    ("\\cdot", "*"),
    ("\\div", "/"),
    ("\u00d7", "*"),
    ("\u22c5", "*"),
    ("\u00b7", "*"),
    ("\u2217", "*"),
    ("\u00f7", "/"),
    ("\u2212", "-"),
    ("\u2013", "-"),
    ("\\left", ""),
    ("\\right", ""),
    ("\\(", ""),
    ("\\)", ""),
    ("\\[", ""),
    ("\\]", ""),
    ("$", ""),
    ("{", "("),
    ("}", ")"),
]
_ARITHMETIC_RUN = re.compile(r"[\d\s+\-*/().]+")


class InvalidExpression(ValueError):
    """An expression the evaluator refuses; the message says why."""


@attrs.frozen
class ExpressionValue:
    """An expression's exact value and the integer literals it used, in order."""

    value: Fraction
    numbers: tuple[int, ...]


def evaluate(expression: str) -> ExpressionValue:
    """The exact value of an arithmetic expression over integer literals, or :class:`InvalidExpression`."""
    if len(expression) > MAX_EXPRESSION:
        raise InvalidExpression(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise InvalidExpression(f"not an arithmetic expression ({type(error).__name__})") from None
    numbers: list[int] = []
    value = _walk(tree.body, numbers)
    return ExpressionValue(value=value, numbers=tuple(numbers))


def _walk(node: ast.AST, numbers: list[int]) -> Fraction:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:  # bools, floats, strings, ... are not allowed
            raise InvalidExpression(f"only whole numbers are allowed, got {node.value!r}")
        if len(str(node.value)) > MAX_LITERAL_DIGITS:
            raise InvalidExpression(f"number {node.value} is too long")
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_walk(node.operand, numbers)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _walk(node.left, numbers), _walk(node.right, numbers)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise InvalidExpression("division by zero")
        return left / right
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise InvalidExpression(f"only + - * / and parentheses are allowed, found {what}")


def uses_exactly(numbers: tuple[int, ...], given: tuple[int, ...]) -> bool:
    """Whether the literals used are the given numbers as a multiset (each exactly once)."""
    return Counter(numbers) == Counter(given)


def format_value(value: Fraction) -> str:
    """``"23"`` for whole values, ``"7/3"`` otherwise."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _normalise(text: str) -> str:
    for spelling, python in _SPELLINGS:
        text = text.replace(spelling, python)
    return text


def _expression_in(text: str) -> str | None:
    """The longest run of arithmetic characters holding a digit and an operator, in each side of ``=``."""
    best: str | None = None
    for side in _normalise(text).split("="):
        for run in _ARITHMETIC_RUN.findall(side):
            run = run.strip().rstrip(".").strip()
            is_arithmetic = re.search(r"\d", run) and re.search(r"\d\s*[+\-*/]|[+\-*/]\s*[\d(]", run)
            if is_arithmetic and (best is None or len(re.findall(r"\d+", run)) > len(re.findall(r"\d+", best))):
                best = run
    return best


_STEP = re.compile(r"([\d\s+\-*/()]*\d[\d\s+\-*/()]*[+\-*/][\d\s+\-*/()]*\d[\d\s()]*)=\s*(\d+)")


def chain_equation(line: str) -> str | None:
    """One equation from worked steps on a line, ``"12*5=60,60-1=59"`` -> ``"(12*5)-1"``.

    Each step's result is put back, as its expression in parentheses, where the next step uses
    it (the first whole-number occurrence of it); the last step's expression is the equation.
    None unless the line has at least two steps and every step's result is used by a later one.
    The claimed results are links only: the judge evaluates the composed equation itself, so a
    wrong intermediate result makes a wrong equation.
    """
    steps = [(m.group(1).strip(), m.group(2)) for m in _STEP.finditer(_normalise(line))]
    if len(steps) < 2:
        return None
    expression = steps[-1][0]
    for earlier, value in reversed(steps[:-1]):
        use = re.search(rf"(?<!\d){value}(?!\d)", expression)
        if use is None:
            return None
        expression = expression[: use.start()] + f"({earlier})" + expression[use.end() :]
    return expression


def wrong_steps(text: str) -> list[str]:
    """The worked steps ``expr=value`` in ``text`` whose claimed value is not the value of their
    expression (``"17+14=29"``); a step that does not parse counts as wrong."""
    wrong = []
    for match in _STEP.finditer(_normalise(text)):
        expression, claimed = match.group(1).strip(), match.group(2)
        try:
            right = evaluate(expression).value == int(claimed)
        except InvalidExpression:
            right = False
        if not right:
            wrong.append(f"{expression}={claimed}")
    return wrong


def extract_equation(text: str) -> str | None:
    """The equation a model wrote: inside the last ``<answer>...</answer>`` if there is one, else
    on the last line that has digits and an operator (worked steps on that line composed by
    :func:`chain_equation`); ``= target`` and prose are dropped."""
    tagged = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL | re.IGNORECASE)
    if tagged:
        return _expression_in(tagged[-1])
    opened = re.split(r"<answer>", text, flags=re.IGNORECASE)
    if len(opened) > 1:  # an answer tag that the generation never closed
        found = _expression_in(opened[-1])
        if found:
            return found
    for line in reversed(text.splitlines()):
        found = chain_equation(line) or _expression_in(line)
        if found:
            return found
    return None
