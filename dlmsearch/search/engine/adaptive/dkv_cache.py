"""dKV-Cache-Decode (Ma et al., arXiv 2505.15781): ``cache=dkv``. Implemented from the paper's
description (its code has no licence and is not used).

Delayed caching: a token's keys and values are stored one step after it is committed (its first
forward as a real token) and then kept until the next refresh; masked columns are always
recomputed. Per slot, with ``i`` the forward's index within the current block (the window the
decoder is on; it restarts when the window moves):

* ``i = 0``: a full forward; nothing is kept;
* ``i = 1`` or ``i mod R = 0`` (``refresh_interval``): a full forward, keeping the keys and values
  of every non-mask column of this forward's input;
* otherwise: only the columns not kept are forwarded (every mask of the canvas, and the tokens
  committed at the previous step), at every layer, against the kept keys and values; the kept set
  then becomes this forward's non-mask columns.

On a model with shifted logits (Dream) the left neighbour of every masked window column is
forwarded too (its query yields that column's logits). Departure: the reference's Dream rule
(``shift_type="un"``: one window, step 0 already keeping) is not followed; both families use the
rule above.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from dlmsearch.models.layer_store import Fields, LayerStore
from dlmsearch.search.engine.adaptive.layer_rules import LayerCall, LayerwisePolicy, RecomputeRule
from dlmsearch.validation import number


@attrs.define(eq=False)
class _Rule(RecomputeRule):
    policy: DKVCache = attrs.field(kw_only=True)
    index: torch.Tensor = attrs.field(init=False)  # [rows] i: this forward's index within its block
    chosen: torch.Tensor = attrs.field(init=False)  # [rows, columns] forwarded at every layer

    def __attrs_post_init__(self) -> None:
        call, fields = self.call, self.fields
        same_block = (
            fields["block"] == call.start - call.gen_start + 1
        )  # from the generation's start (left padding may grow), + 1: 0 means never
        self.index = torch.where(same_block, fields["step"], 0)
        full = (self.index <= 1) | (self.index % self.policy.refresh_interval == 0)
        partial = ~fields["kept"] | call.queries_of(call.masked & call.window)
        self.chosen = torch.where(full[:, None], call.real, partial & call.real)

    def select(self, layer: int, probed: torch.Tensor | None) -> torch.Tensor:
        return self.chosen

    def finish(self, logits: torch.Tensor, read: torch.Tensor) -> None:
        call, fields = self.call, self.fields
        fields["kept"] = ~call.masked & call.real & (self.index >= 1)[:, None]
        fields["step"] = self.index + 1
        fields["block"] = call.start - call.gen_start + 1


@attrs.frozen
class DKVCache(LayerwisePolicy):
    """dKV-Cache-Decode: delayed caching of decoded tokens, a full refresh every ``refresh_interval`` steps of a block."""

    name: ClassVar[str] = "dkv"
    # The README's settings (there are no GSM8K scripts): LLaDA-8B-Instruct cache_reloading_step=8, Dream-v0-Instruct-7B cache_steps=16
    family_defaults: ClassVar[dict[str, dict[str, object]]] = {
        "llada": {"refresh_interval": 8},
        "dream": {"refresh_interval": 16},
    }
    refresh_interval: int = number(int, 2, default=8)

    def prepare(self, store: LayerStore, call: LayerCall, dtype: torch.dtype, device: torch.device | str) -> None:
        super().prepare(store, call, dtype, device)
        store.ensure("kept", (call.width,), torch.bool, device, column_axis=1)
        store.ensure("step", (), torch.long, device)
        store.ensure("block", (), torch.long, device)

    def rule(self, fields: Fields, call: LayerCall) -> RecomputeRule:
        return _Rule(fields, call, policy=self)
