"""Numeric answers in free text (GSM8K and the like): extraction, normalisation, equality.

Extraction looks only at the model's text, never at the reference, in this order:

1. ``#### N`` (GSM8K's own answer format; the first one, as lm-eval's strict match does),
2. ``\\boxed{N}`` or "the answer is N" / "answer: N" (case-insensitive; the last one, since a
   model states its final answer last),
3. the last number anywhere in the text (lm-eval's flexible match).

Numbers may carry ``$``, thousands commas, a sign and decimals; they are compared exactly as
fractions, so "18.0", "18." and "$18" all equal "18".
"""

from __future__ import annotations

import re
from fractions import Fraction

# A number: optional sign and dollar sign, digits with proper thousands commas or plain, decimals.
# A minus is a sign only where it cannot be subtraction (not right after a digit, letter or bracket).
_NUMBER = r"(?:(?<![\w)\]])-)?(?:\$\s?-?)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
NUMBER = re.compile(_NUMBER)
_HASHES = re.compile(r"####\s*(?:\\\(|\$\$?)?\s*(" + _NUMBER + ")")
_STATED = re.compile(
    r"\\boxed\{\s*(?:\\\$|\\text\{\s*\\?\$\s*\}|\$)?\s*(" + _NUMBER + r")[^{}]*\}"
    r"|answer\s*(?:is|:|=)\s*:?\s*(?:\*\*|\\\(|\\\$|\$\$?)?\s*(" + _NUMBER + ")",
    re.IGNORECASE,
)
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-"})


def normalize_number(text: str) -> str | None:
    """A number string as a canonical decimal ("1,234.50" -> "1234.5", "$18." -> "18"), or None."""
    value = to_fraction(text)
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    digits = f"{float(value):.12g}"
    return digits if Fraction(digits) == value else f"{value.numerator}/{value.denominator}"


def to_fraction(text: str) -> Fraction | None:
    """The exact value of a number string (``$``, commas, a trailing ``.`` allowed), or None."""
    cleaned = text.translate(_MINUS).strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)", cleaned):
        return None
    return Fraction(cleaned)


def numbers_equal(a: str | None, b: str | None) -> bool:
    """Exact numeric equality of two number strings; anything unreadable is unequal."""
    x = to_fraction(a) if a is not None else None
    y = to_fraction(b) if b is not None else None
    return x is not None and y is not None and x == y


def extract_answer(text: str) -> str | None:
    """The answer stated in ``text``, normalised (see the module docstring for the order)."""
    text = text.translate(_MINUS)
    found = _HASHES.search(text)
    if found:
        return normalize_number(found.group(1))
    stated = list(_STATED.finditer(text))
    if stated:
        last = stated[-1]
        return normalize_number(last.group(1) or last.group(2))
    numbers = NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def gsm8k_reference(answer: str) -> str | None:
    """The gold number of a GSM8K ``answer`` field: what follows its ``####``."""
    if "####" not in answer:
        return None
    return normalize_number(answer.rsplit("####", 1)[1].strip())
