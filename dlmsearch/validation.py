"""attrs validators whose messages name the offending config key.

Components are built from Hydra YAML, so a wrong type (``max_depth=abc``) must fail at start
with the key's name, not deep inside a tensor operation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]

_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def check_type(kind: type, *, optional: bool = False) -> Validator:
    """Accept ``kind`` (ints where floats are expected; never bools as numbers)."""

    def validate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise TypeError(f"{attribute.name} must be {_NAMES.get(kind, kind.__name__)}, got {value!r}")

    return validate


def check_range(
    low: float = -math.inf, high: float = math.inf, *, optional: bool = False, open_low: bool = False
) -> Validator:
    """Numbers within ``[low, high]`` (``(low, high]`` with ``open_low``)."""

    def validate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        if not (low < value if open_low else low <= value) or not value <= high:
            raise ValueError(f"{attribute.name} must be within {'(' if open_low else '['}{low}, {high}], got {value!r}")

    return validate


def check_choice(*choices: str, optional: bool = False) -> Validator:
    """One of a fixed set of strings."""

    def validate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(choices)}; got {value!r}")

    return validate


def number(
    kind: type,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    optional: bool = False,
    open_low: bool = False,
    **kwargs: Any,
) -> Any:
    """An attrs field holding a typed number within a range.

    Args:
        kind: the number's type (``int`` or ``float``).
        low: the least value allowed.
        high: the greatest value allowed.
        optional: None allowed, meaning not set.
        open_low: ``low`` itself not allowed (the range ``(low, high]``).
        **kwargs: passed to :func:`attrs.field` (``default``, ``converter``, ...).
    """
    return attrs.field(
        validator=[check_type(kind, optional=optional), check_range(low, high, optional=optional, open_low=open_low)],
        **kwargs,
    )
