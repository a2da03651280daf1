"""Row operations shared by every batch-of-rows record (canvases, evaluations, usage).

Such records are attrs classes whose fields are tensors with a leading row dimension (or None
for statistics nobody asked for); these functions return new records and never write in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import attrs
import torch

Record = TypeVar("Record")


def map_rows(record: Record, transform: Callable[[torch.Tensor], torch.Tensor]) -> Record:
    """A record with ``transform`` applied to every present field."""
    return type(record)(
        **{f.name: None if (v := getattr(record, f.name)) is None else transform(v) for f in attrs.fields(type(record))}
    )


def take_rows(record: Record, index: torch.Tensor) -> Record:
    """The rows at ``index`` (a long index or a bool mask)."""
    return map_rows(record, lambda tensor: tensor[index])


def _covers_all(index: torch.Tensor, rows: int) -> bool:
    """Whether ``index`` selects every row in order (a put then replaces the whole record)."""
    if index.dtype == torch.bool:
        return bool(index.all())
    return len(index) == rows and bool((index == torch.arange(rows, device=index.device)).all())


def put_rows(record: Record, index: torch.Tensor, other: Record) -> Record:
    """A record with the rows at ``index`` replaced by ``other``'s: one new tensor per field
    that changes (out-of-place ``index_put``), ``other``'s own tensors where every row is
    replaced, and the unchanged fields shared, never cloned."""
    fields = attrs.fields(type(record))
    present = next((getattr(record, f.name) for f in fields if getattr(record, f.name) is not None), None)
    whole = present is not None and _covers_all(index, len(present))
    values = {}
    for f in fields:
        mine, theirs = getattr(record, f.name), getattr(other, f.name)
        if mine is None or theirs is None:
            values[f.name] = None
        elif whole or theirs is mine:
            values[f.name] = theirs
        else:
            values[f.name] = mine.index_put((index,), theirs)
    return type(record)(**values)


def cat_rows(record: Record, other: Record) -> Record:
    """``other``'s rows after ``record``'s (samples joining a decode); a field is None in the
    result where it is None in both, and must be present in both otherwise."""
    values = {}
    for f in attrs.fields(type(record)):
        mine, theirs = getattr(record, f.name), getattr(other, f.name)
        if (mine is None) != (theirs is None):
            raise ValueError(f"cannot join rows: {type(record).__name__}.{f.name} is present in one record only")
        values[f.name] = None if mine is None else torch.cat([mine, theirs])
    return type(record)(**values)


def pad_columns(record: Record, columns: int, fill: dict[str, float] | None = None, right: bool = False) -> Record:
    """Every ``[rows, width]`` field with ``columns`` more columns on the left (left padding of a
    wider canvas; ``right``: on the right, a canvas whose rows grow), holding ``fill[name]`` (0
    where not named); per-row fields unchanged."""
    if columns == 0:
        return record
    fill = fill or {}
    values = {}
    for f in attrs.fields(type(record)):
        value = getattr(record, f.name)
        if value is not None and value.dim() == 2:
            pad = torch.full((len(value), columns), fill.get(f.name, 0), dtype=value.dtype, device=value.device)
            value = torch.cat([value, pad] if right else [pad, value], dim=1)
        values[f.name] = value
    return type(record)(**values)
