"""Elastic-Cache (Nguyen-Tri, Ranjan, Shen; arXiv 2510.14973): ``cache=elastic``. Implemented from
the paper's description (the repository could not be obtained; nothing of it is used).

Per layer and slot it keeps the layer's input stream, queries, keys and values of every column,
and per slot the *tracked* columns (the most attended decoded ones). A slot's first forward
computes every column at every layer. Later forwards, per row:

1. the window ``W``: the first ``window`` (beta) still-masked columns of the decoder's window, left to
   right; only their logits are read (Elastic-Cache commits inside ``W`` alone). A shifted model
   (Dream) forwards each one's left neighbour as well;
2. the query columns: the tracked ones, the ones committed since the last forward, and ``W``;
3. at each layer, while the row is in reuse mode, only the query columns are computed (their
   input, query, key and value written into the store), against every stored key. The drift test
   on the tracked columns: ``sigma_l`` is the mean, over tracked columns and heads, of the cosine
   between each one's attention row at its last computation (its stored query against the keys
   before this layer's writes) and now. ``sigma_l < gamma`` (``drift``) switches the row to refresh
   mode from layer ``l + 1`` on;
4. in refresh mode every column is computed, from the stored input where a column was not
   computed at the layer below (fresh elsewhere), and written into the store;
5. tracking: at each layer, the attention the ``W`` queries pay to each key (summed over heads and
   queries), masked keys excluded, gives its top ``track`` columns; their union over the layers is
   the next forward's tracked set.

Choices where the description leaves it open: the cosine is taken along the key axis (between
attention distributions); the reference's drift average over the whole batch is per row here
(so one row's drift refreshes only that row).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch
import torch.nn.functional as F

from dlmsearch.models.layer_store import Fields, LayerStore
from dlmsearch.models.layerwise import LayerPass, cells, gather_columns
from dlmsearch.search.engine.adaptive.layer_rules import LayerCall, LayerwisePolicy, RecomputeRule, committed_since
from dlmsearch.validation import number


@attrs.define(eq=False)
class _Rule(RecomputeRule):
    policy: ElasticCache = attrs.field(kw_only=True)
    needs_weights: ClassVar[bool] = True
    window: torch.Tensor = attrs.field(init=False)  # [rows, columns] W
    queries: torch.Tensor = attrs.field(init=False)  # [rows, columns] the reuse mode's query columns
    refreshing: torch.Tensor = attrs.field(init=False)  # [rows] in refresh mode (from the current layer on)
    fresh: torch.Tensor = attrs.field(init=False)  # [rows, columns] computed at the layer below (layer 0: every column)
    tracked: torch.Tensor = attrs.field(init=False)  # [rows, columns] the next forward's tracked columns
    before: torch.Tensor | None = attrs.field(
        init=False, default=None
    )  # [rows, heads, tracked, keys] their attention before this layer
    tracked_at: torch.Tensor | None = attrs.field(
        init=False, default=None
    )  # [rows, tracked] the tracked columns computed at this layer
    tracked_valid: torch.Tensor | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        call, fields = self.call, self.fields
        masked_window = call.masked & call.window
        self.window = masked_window & (torch.cumsum(masked_window.long(), dim=1) <= self.policy.window)
        self.queries = (
            fields["tracked"] | committed_since(fields, call) | self.window | call.queries_of(self.window)
        ) & call.real
        self.refreshing = fields["stepped"] == 0
        self.fresh = call.real.clone()
        self.tracked = torch.zeros_like(call.real)

    def layer_input(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        stored = self.fields["inputs"][:, layer]
        return torch.where(self.fresh[..., None], x, stored.to(x.dtype))

    def select(self, layer: int, probed: torch.Tensor | None) -> torch.Tensor:
        chosen = torch.where(self.refreshing[:, None], self.call.real, self.queries)
        self.before = None
        tracked = self.fields["tracked"] & chosen & ~self.refreshing[:, None]
        if bool(
            tracked.any()
        ):  # the tracked columns' attention at their last computation, against the keys before this layer's writes
            self.tracked_at, self.tracked_valid = gather_columns(tracked)
            keys = self.fields["keys"][:, layer]
            stored = self.fields["queries"][:, layer].gather(
                2, self.tracked_at[:, None, :, None].expand(-1, self.fields["queries"].shape[2], -1, keys.shape[-1])
            )
            groups = stored.shape[1] // keys.shape[1]
            scores = (
                stored.double()
                @ keys.repeat_interleave(groups, dim=1).double().transpose(-1, -2)
                / stored.shape[-1] ** 0.5
            )
            self.before = torch.softmax(
                scores.masked_fill(~self.call.real[:, None, None, :], -torch.inf), dim=-1
            )  # [rows, heads, tracked, keys]
        return chosen

    def layer_output(self, computed: LayerPass) -> torch.Tensor:
        """The default stream; stores the recomputed columns' inputs and queries, tests the tracked
        columns' attention drift, and tracks the decoded columns the window attends to most.
        """
        layer, x, index, valid, queries, weights = (
            computed.layer,
            computed.x,
            computed.index,
            computed.valid,
            computed.queries,
            computed.weights,
        )
        out = super().layer_output(computed)
        assert weights is not None and self.last is not None
        call, fields = self.call, self.fields
        row, column = cells(index, valid)
        fields["inputs"][:, layer][row, column] = x[row, column].to(fields["inputs"].dtype)
        fields["queries"][:, layer][row, :, column] = queries.transpose(1, 2)[valid].to(fields["queries"].dtype)
        if self.before is not None:  # the drift test: where each tracked column sits among the computed ones
            place = torch.zeros(call.rows, call.width, dtype=torch.long, device=x.device)
            place[row, column] = torch.arange(index.shape[1], device=x.device).expand_as(index)[valid]
            at = place.gather(1, self.tracked_at)
            now = weights.double().gather(2, at[:, None, :, None].expand(-1, weights.shape[1], -1, weights.shape[-1]))
            similarity = F.cosine_similarity(self.before, now, dim=-1).mean(dim=1)  # [rows, tracked]
            count = self.tracked_valid.sum(dim=1)
            drift = torch.where(self.tracked_valid, similarity, 0.0).sum(dim=1) / count.clamp(min=1)
            self.refreshing = self.refreshing | ((count > 0) & (drift < self.policy.drift))
        in_window = self.window.gather(1, index) & valid  # [rows, n] the window's queries among the computed
        paid = torch.where(in_window[:, None, :, None], weights.double(), 0.0).sum(dim=(1, 2))  # [rows, keys]
        decoded = ~call.masked & call.real
        top = torch.sort(torch.where(decoded, paid, -torch.inf), dim=1, descending=True, stable=True).indices[
            :, : self.policy.track
        ]
        self.tracked |= torch.zeros_like(self.tracked).scatter_(1, top, decoded.gather(1, top))
        self.fresh = self.last
        return out

    def read(self) -> torch.Tensor:
        assert self.last is not None
        return self.last & self.call.queries_of(self.window)

    def finish(self, logits: torch.Tensor, read: torch.Tensor) -> None:
        self.fields["tracked"] = self.tracked
        self.fields["seen"] = self.call.tokens.clone()
        self.fields["stepped"] = self.fields["stepped"] + 1


@attrs.frozen
class ElasticCache(LayerwisePolicy):
    """Elastic-Cache: a sliding window of masks, the most attended decoded columns tracked, and
    every layer from the first whose attention drifted on recomputed whole."""

    name: ClassVar[str] = "elastic"
    # LLaDA-8B-Instruct scripts seen (HumanEval, MBPP): window_length 16, gamma 0.9, track_num 1;
    # Dream-v0-Instruct-7B GSM8K script: window_length 32, gamma 0.9, track_num 1
    family_defaults: ClassVar[dict[str, dict[str, object]]] = {
        "llada": {"window": 16, "drift": 0.9, "track": 1},
        "dream": {"window": 32, "drift": 0.9, "track": 1},
    }
    window: int = number(int, 1, default=16)
    drift: float = number(float, 0.0, 1.0, default=0.9)
    track: int = number(int, 0, default=1)

    def prepare(self, store: LayerStore, call: LayerCall, dtype: torch.dtype, device: torch.device | str) -> None:
        super().prepare(store, call, dtype, device)
        c = call.config
        store.ensure("inputs", (c.num_layers, call.width, c.hidden_size), dtype, device, column_axis=2)
        store.ensure("queries", (c.num_layers, c.num_heads, call.width, c.head_dim), dtype, device, column_axis=3)
        store.ensure("tracked", (call.width,), torch.bool, device, column_axis=1)
        store.ensure("seen", (call.width,), torch.long, device, column_axis=1)
        store.ensure("stepped", (), torch.long, device)

    def rule(self, fields: Fields, call: LayerCall) -> RecomputeRule:
        return _Rule(fields, call, policy=self)
