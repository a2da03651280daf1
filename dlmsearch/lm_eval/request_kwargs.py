"""What a ``generate_until`` request's generation kwargs mean here: its stop sequences and its length."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

MAX_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """``text`` up to the earliest occurrence of any stop sequence (empty ones ignored)."""
    cut = len(text)
    for stop in until:
        if stop:
            at = text.find(stop)
            if 0 <= at < cut:
                cut = at
    return text[:cut]


def gen_length_for(max_gen_toks: int, block_length: int) -> int:
    """The generation length for ``max_gen_toks``: rounded up to whole blocks."""
    if max_gen_toks < 1:
        raise ValueError(f"max_gen_toks must be at least 1, got {max_gen_toks}")
    return math.ceil(max_gen_toks / block_length) * block_length


def stop_sequences(value: Any) -> list[str]:
    """A request's ``until`` as a list (lm-eval passes a string, a list or nothing); anything else fails."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"generation kwarg 'until' must be a string or a list of strings, got {value!r}")
