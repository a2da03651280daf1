"""The sampling settings a user, a checkpoint and a decoder layer over each other.

A record below both ``models/`` (a checkpoint's ``generation_config.json`` is read into one)
and ``search/`` (the engine samples with the resolved one).
"""

from __future__ import annotations

from typing import Any

import attrs

from dlmsearch.validation import check_choice, number

CONFIDENCE_SOURCES = ("model", "sampling")


@attrs.frozen
class Sampling:
    """How proposals are drawn and where their confidence is read; ``None``: not set here (see :meth:`over`)."""

    temperature: float | None = number(float, 0.0, optional=True, default=None)
    top_p: float | None = number(float, 0.0, 1.0, optional=True, open_low=True, default=None)
    top_k: int | None = number(int, 1, optional=True, default=None)
    confidence: str | None = attrs.field(default=None, validator=check_choice(*CONFIDENCE_SOURCES, optional=True))

    def over(self, fallback: Sampling) -> Sampling:
        """Each field set here, else ``fallback``'s (settings layered: the user's over the checkpoint's over the decoder's)."""
        mine, theirs = attrs.asdict(self), attrs.asdict(fallback)
        return Sampling(**{name: theirs[name] if value is None else value for name, value in mine.items()})

    def resolved(self) -> Sampling:
        """Unset fields at their neutral values: temperature 0, no truncation, the model's confidence."""
        return self.over(Sampling(temperature=0.0, confidence="model"))

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)
