"""What every layerwise cache policy shares: the call it sees, the stored keys and values, and the
default per-layer decisions (recompute the selected columns, carry the rest).

A layerwise policy (``layerwise = True``) is asked once per engine call, for all rows at once:
:meth:`LayerwisePolicy.prepare` allocates its fields in the slots' :class:`LayerStore`,
:meth:`LayerwisePolicy.rule` builds the call's :class:`~dlmsearch.models.layerwise.LayerRule` over
the rows' copies of those fields, and the rule's ``finish`` updates the per-slot records (clocks,
cached sets, confidences) after the forward. Only a slot's own canvas (its root row, never a
lookahead branch) writes its copy back, so a branch sees its slot's store as the next root step
will, and a row's decisions depend on its own canvas and store alone: batching is exact.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from dlmsearch.models.layer_store import Fields, LayerStore
from dlmsearch.models.layerwise import LayerPass, cells
from dlmsearch.models.transformer import TransformerConfig


@attrs.frozen
class LayerCall:
    """One forward's rows as a layerwise policy sees them (canvas columns from 0)."""

    tokens: torch.Tensor  # [rows, columns]
    real: torch.Tensor  # [rows, columns] not padding
    start: torch.Tensor  # [rows] first column of the window being decoded
    end: torch.Tensor  # [rows] its end
    gen_start: int  # first column of the generation region (the prompt ends here, in every row)
    mask_id: int
    shift: bool  # logits of column c are read at column c - 1 (Dream)
    config: TransformerConfig

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    @property
    def masked(self) -> torch.Tensor:
        return (self.tokens == self.mask_id) & self.real

    @property
    def column(self) -> torch.Tensor:
        """``[1, columns]`` column numbers."""
        return torch.arange(self.width, device=self.tokens.device)[None, :]

    @property
    def window(self) -> torch.Tensor:
        """``[rows, columns]`` the window's columns."""
        return (self.column >= self.start[:, None]) & (self.column < self.end[:, None])

    @property
    def response(self) -> torch.Tensor:
        """``[rows, columns]`` the generation region."""
        return (self.column >= self.gen_start).expand(self.rows, -1)

    def queries_of(self, columns: torch.Tensor) -> torch.Tensor:
        """The columns whose query yields these columns' logits: themselves, or (Dream) each one's left neighbour."""
        if not self.shift:
            return columns
        return torch.cat([columns[:, 1:], torch.zeros_like(columns[:, :1])], dim=1) | (columns & (self.column == 0))


def scatter_rows(x: torch.Tensor, index: torch.Tensor, valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``x`` with ``values [rows, n, ...]`` written at columns ``index`` where ``valid`` (a copy)."""
    out = x.clone()
    out[cells(index, valid)] = values[valid].to(x.dtype)
    return out


def committed_since(fields: Fields, call: LayerCall) -> torch.Tensor:
    """``[rows, columns]`` columns that were masked at the slot's last forward and hold a token now
    (their input changed; the policy's ``seen`` field keeps the last forward's tokens)."""
    return (fields["seen"] == call.mask_id) & ~call.masked & call.real


@attrs.define(eq=False)
class RecomputeRule:
    """The default layer rule: the selected columns are recomputed and replace their stream; the
    others carry theirs (it is read only where a column was recomputed at the last layer)."""

    fields: Fields
    call: LayerCall
    needs_weights: ClassVar[bool] = False
    last: torch.Tensor | None = None  # the columns recomputed at the last layer so far
    extra_bytes: int = 0  # what the rule holds beside the store during the forward (d2Cache's attention rollout)

    def keys_values(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fields["keys"][:, layer], self.fields["values"][:, layer]

    def layer_input(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return x

    def probe(self, layer: int) -> torch.Tensor | None:
        return None

    def select(self, layer: int, probed: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def layer_output(self, computed: LayerPass) -> torch.Tensor:
        """The stream ``[rows, columns, hidden]`` leaving ``layer``: the recomputed columns' residual
        sums, the carried columns as they came (and the recomputed set noted for :meth:`read`).
        """
        x, index, valid, attended, mlp = computed.x, computed.index, computed.valid, computed.attended, computed.mlp
        chosen = torch.zeros_like(self.call.real)
        chosen[cells(index, valid)] = True
        self.last = chosen
        rows = x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))
        return scatter_rows(x, index, valid, (rows + attended) + mlp)

    def final(self, x: torch.Tensor, logits_of) -> None:
        pass

    def read(self) -> torch.Tensor:
        assert self.last is not None, "read before the forward"
        return self.last

    def finish(self, logits: torch.Tensor, read: torch.Tensor) -> None:
        """After the forward: update the rows' records (``logits`` and ``read`` of the window columns, left-aligned)."""


class LayerwisePolicy:
    """Mixin of the layerwise cache policies (attrs classes): what the engine asks of them."""

    stores: ClassVar[bool] = True
    exact: ClassVar[bool] = False  # approximate: stored keys and values go stale between recomputations
    layerwise: ClassVar[bool] = True
    keeps_processed: ClassVar[bool] = False
    family_defaults: ClassVar[dict[str, dict[str, object]]] = {}

    def write_first(self, *args: object) -> None:
        """Nothing to write before the call: the layerwise forward writes the store itself."""

    def remember(self, *args: object) -> tuple:
        """Nothing beyond the store: the engine puts each root's copy of it back."""
        return ()

    def prepare(self, store: LayerStore, call: LayerCall, dtype: torch.dtype, device: torch.device | str) -> None:
        """Allocate the fields this policy keeps (keys and values per layer, and its own)."""
        c = call.config
        for name in ("keys", "values"):
            store.ensure(name, (c.num_layers, c.num_kv_heads, call.width, c.head_dim), dtype, device, column_axis=3)

    def rule(self, fields: Fields, call: LayerCall) -> RecomputeRule:
        raise NotImplementedError

    # The questions the engine asks the column policies (none, prefix, dual, block) do not arise.
    def columns(self, *args: object) -> torch.Tensor:
        raise AssertionError("a layerwise policy decides per layer, inside the forward")

    hits = refreshes = settled = read = columns

    @classmethod
    def for_family(cls, family: str | None = None, **settings: object):
        """The policy with the authors' settings for this model family (``family_defaults``), each
        overridden where ``settings`` gives it (None: the default)."""
        defaults = cls.family_defaults.get(family or "", cls.family_defaults.get("llada", {}))
        chosen = {key: value for key, value in settings.items() if value is not None}
        return cls(**{**defaults, **chosen})
