"""Per-slot storage of a layerwise cache policy (dLLM-Cache, d2Cache, Elastic-Cache, dKV-Cache).

Those policies keep more than keys and values (attention and MLP outputs, layer inputs, queries,
confidences, a step clock), so the store is a set of named tensors, each ``[slots, ...]``, with the
axis of canvas columns named where there is one (a longer prompt joining the decode pads it on the
left). A call takes its rows' copies (:meth:`take`: a lookahead branch computes on its slot's store
and never writes it), and puts back the slots' own canvases' (:meth:`put`), so a row's result never
depends on which other rows share its call.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

Fields = dict[str, torch.Tensor]


@attrs.define(eq=False)
class LayerStore:
    """Named tensors ``[slots, ...]`` (``column_axis``: the axis of canvas columns, where a field has one)."""

    fields: Fields = attrs.field(factory=dict)
    column_axis: dict[str, int] = attrs.field(factory=dict)
    slots: int = 0

    def reset(self, slots: int) -> None:
        """Forget everything: a new batch of ``slots``."""
        self.fields, self.column_axis, self.slots = {}, {}, slots

    def ensure(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device | str,
        column_axis: int | None = None,
    ) -> None:
        """Allocate field ``name`` as zeros ``[slots, *shape]`` unless it exists with that shape (a slot's zeros mean: never written)."""
        have = self.fields.get(name)
        if have is not None and tuple(have.shape[1:]) == tuple(shape):
            return
        if have is not None:
            raise ValueError(
                f"layer store field {name!r} is {tuple(have.shape[1:])} per slot, asked for {tuple(shape)}"
            )
        self.fields[name] = torch.zeros(self.slots, *shape, dtype=dtype, device=device)
        if column_axis is not None:
            self.column_axis[name] = column_axis

    def take(self, slot: torch.Tensor) -> Fields:
        """Copies of these slots' fields, one per row (rows may repeat a slot)."""
        return {name: field[slot.to(field.device)] for name, field in self.fields.items()}

    def put(self, slot: torch.Tensor, rows: Fields, which: torch.Tensor) -> None:
        """Write back the rows ``which`` (at most one per slot: its own canvas) into their slots."""
        if not bool(which.any()):
            return
        at = which.nonzero().squeeze(1)
        for name, field in self.fields.items():
            field[slot[at].to(field.device)] = rows[name][at.to(field.device)]

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes slot ``source[i]``'s fields (a population resampled, or slots were evicted)."""
        self.fields = {name: field[source.to(field.device)] for name, field in self.fields.items()}
        self.column_axis, self.slots = dict(self.column_axis), len(source)

    def admit(self, slots: int) -> None:
        """Append ``slots`` slots that were never written."""
        self.fields = {
            name: torch.cat([field, field.new_zeros(slots, *field.shape[1:])]) for name, field in self.fields.items()
        }
        self.slots += slots

    def widen(self, columns: int) -> None:
        """``columns`` more columns of left padding in every canvas."""
        if columns == 0:
            return
        for name, axis in self.column_axis.items():
            field = self.fields[name]
            self.fields[name] = F.pad(field, (0, 0) * (field.dim() - 1 - axis) + (columns, 0))

    def split(self, slots: torch.Tensor) -> LayerStore:
        """A copy holding only these slots' entries (indexed: new tensors, nothing shared that a write changes)."""
        part = attrs.evolve(self)
        part.reorder(slots)
        return part

    @property
    def nbytes(self) -> int:
        """What the store holds now, in bytes (the extra memory a policy keeps)."""
        return sum(field.numel() * field.element_size() for field in self.fields.values())
