"""A component's copy for one decode plan, with the fields only the layout decides.

Some rules count in steps per block (``block_budget``) that only the canvas layout fixes. The
decode plan asks each such component for a bound copy; the configured component is never
written, so one decoder can serve plans of different layouts side by side.
"""

from __future__ import annotations

import copy
from typing import TypeVar

Component = TypeVar("Component")


def with_layout(component: Component, **values: object) -> Component:
    """A shallow copy of ``component`` with the layout-derived (``init=False``) fields ``values`` set."""
    clone = copy.copy(component)
    for name, value in values.items():
        object.__setattr__(clone, name, value)
    return clone
