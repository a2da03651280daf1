"""dLLM-Cache (Liu et al., arXiv 2506.06295; code maomaocun/dLLM-cache ``17235bf``): ``cache=dllm_cache``.

Per layer and slot it keeps the keys and values, the attention output (after the output
projection) and the MLP output of every column; the stream itself is not kept: a column that is
not recomputed adds its cached attention and MLP outputs to its current input.

Clock: ``s`` counts the slot's forwards from 1 (the slot's own canvas advances it; it is not reset
at block boundaries). The response (the generation region, every block) is recomputed when
``(s - 1) mod K_r = 0``, the prompt when ``(s - 1) mod K_p = 0``; layer 0 always recomputes both
(upstream since ``1ef9d03``). Otherwise, the adaptive update (``0 < rho``): every response column's
value is projected from its current input and replaces the stored one; the ``floor(rho * n)``
response columns whose new value is least cosine-similar to the stored one (ties: the lower
column) are recomputed (query, key, attention over every key, MLP). A prompt refresh recomputes
the prompt's columns too; a response refresh all of the response and no adaptive update.

Departures: the clock is per slot (the reference's is one per process, so a batch shares it; here
each sample's is its own, so batching is exact); left padding is masked (the reference passes no
attention mask).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch
import torch.nn.functional as F

from dlmsearch.models.layer_store import Fields, LayerStore
from dlmsearch.models.layerwise import LayerPass, cells
from dlmsearch.search.engine.adaptive.layer_rules import LayerCall, LayerwisePolicy, RecomputeRule
from dlmsearch.validation import number


@attrs.define(eq=False)
class _Rule(RecomputeRule):
    policy: DLLMCache = attrs.field(kw_only=True)
    step: torch.Tensor = attrs.field(init=False)  # [rows] this forward's clock s

    def __attrs_post_init__(self) -> None:
        self.step = self.fields["clock"] + 1

    def _refreshes(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[rows]`` whether the prompt and the response are recomputed whole at ``layer``."""
        prompt = ((self.step - 1) % self.policy.prompt_interval == 0) | (layer == 0)
        response = ((self.step - 1) % self.policy.response_interval == 0) | (layer == 0)
        return prompt, response

    def _adaptive(self, layer: int) -> torch.Tensor:
        return ~self._refreshes(layer)[1] & torch.tensor(self.policy.ratio > 0)

    def probe(self, layer: int) -> torch.Tensor | None:
        adaptive = self._adaptive(layer)
        return (self.call.response & adaptive[:, None]) if bool(adaptive.any()) else None

    def select(self, layer: int, probed: torch.Tensor | None) -> torch.Tensor:
        call = self.call
        prompt, response = self._refreshes(layer)
        chosen = (~call.response & prompt[:, None]) | (call.response & response[:, None])
        if probed is None:
            return chosen
        stored = self.fields["values"][:, layer].transpose(1, 2)  # [rows, columns, kv_heads, head_dim]
        similarity = F.cosine_similarity(probed.flatten(2), stored.flatten(2), dim=-1)
        n = call.width - call.gen_start
        count = int(n * self.policy.ratio)
        order = torch.sort(torch.where(call.response, similarity.float(), torch.inf), dim=1, stable=True).indices[
            :, :count
        ]
        drifted = torch.zeros_like(chosen).scatter_(1, order, True) & self._adaptive(layer)[:, None]
        return chosen | drifted

    def layer_output(self, computed: LayerPass) -> torch.Tensor:
        """The stream leaving ``layer`` from the recomputed columns' attention and MLP outputs and
        the cached ones of the rest (each stored back for the next call).
        """
        layer, x, index, valid, attended, mlp = (
            computed.layer,
            computed.x,
            computed.index,
            computed.valid,
            computed.attended,
            computed.mlp,
        )
        at = cells(index, valid)
        attention, feed = self.fields["attention"][:, layer], self.fields["mlp"][:, layer]
        attention[at] = attended[valid].to(attention.dtype)
        feed[at] = mlp[valid].to(feed.dtype)
        return (x + attention) + feed

    def read(self) -> torch.Tensor:
        return self.call.real

    def finish(self, logits: torch.Tensor, read: torch.Tensor) -> None:
        self.fields["clock"] = self.step


@attrs.frozen
class DLLMCache(LayerwisePolicy):
    """dLLM-Cache: long-interval prompt refresh (``prompt_interval``, K_p), short-interval response
    refresh (``response_interval``, K_r), and between them the ``ratio`` (rho) of response columns
    whose values drifted most recomputed at every layer."""

    name: ClassVar[str] = "dllm_cache"
    # The authors' GSM8K scripts (scripts/run_*_gsm8k_*.sh; the same in d2Cache's configs/gen_args.py)
    family_defaults: ClassVar[dict[str, dict[str, object]]] = {
        "llada": {"prompt_interval": 50, "response_interval": 7, "ratio": 0.25},  # LLaDA-8B-Instruct
        "dream": {"prompt_interval": 25, "response_interval": 2, "ratio": 0.25},  # Dream-v0-Instruct-7B
    }
    prompt_interval: int = number(int, 1, default=50)
    response_interval: int = number(int, 1, default=7)
    ratio: float = number(float, 0.0, 1.0, default=0.25)

    def prepare(self, store: LayerStore, call: LayerCall, dtype: torch.dtype, device: torch.device | str) -> None:
        super().prepare(store, call, dtype, device)
        c = call.config
        for name in ("attention", "mlp"):
            store.ensure(name, (c.num_layers, call.width, c.hidden_size), dtype, device, column_axis=2)
        store.ensure("clock", (), torch.long, device)

    def rule(self, fields: Fields, call: LayerCall) -> RecomputeRule:
        return _Rule(fields, call, policy=self)
