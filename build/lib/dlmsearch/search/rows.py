"""Row operations shared by every batch-of-rows record (canvases, evaluations).

Such records are attrs classes whose fields are tensors with a leading row dimension (or None
for statistics nobody asked for); these functions return new records and never write in place.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import attrs
import torch

Record = TypeVar("Record")


def map_rows(record: Record, transform: Callable[[torch.Tensor], torch.Tensor]) -> Record:
    """A record with ``transform`` applied to every present field."""
    return type(record)(**{f.name: None if (v := getattr(record, f.name)) is None else transform(v) for f in attrs.fields(type(record))})


def take_rows(record: Record, index: torch.Tensor) -> Record:
    """The rows at ``index`` (a long index or a bool mask)."""
    return map_rows(record, lambda tensor: tensor[index])


def put_rows(record: Record, index: torch.Tensor, other: Record) -> Record:
    """A copy of ``record`` with the rows at ``index`` replaced by ``other``'s."""
    values = {}
    for f in attrs.fields(type(record)):
        mine, theirs = getattr(record, f.name), getattr(other, f.name)
        if mine is None or theirs is None:
            values[f.name] = None
            continue
        mine = mine.clone()
        mine[index] = theirs
        values[f.name] = mine
    return type(record)(**values)
