"""The layerwise forward: at each layer, each row recomputes only the columns its cache policy selects.

Adaptive KV caches decide per layer and per row what to recompute (dLLM-Cache: the rows whose values
drifted; Elastic-Cache: every row from the layer whose attention drifted on; d2Cache and dKV-Cache:
the same few rows at every layer). One loop serves them all. The hidden state of every column is
carried through every layer (elementwise work only); at layer ``l`` a :class:`LayerRule` names:

* ``layer_input``: the stream entering the layer (Elastic-Cache: the cached input where a column is
  not fresh);
* ``probe``: columns whose values are projected before the selection (dLLM-Cache's value drift);
* ``select``: the columns whose query, key, value, attention and MLP are recomputed; their keys
  and values are written into the rows' stored ones (the probed values too), and their queries
  attend over every stored key of their row;
* ``layer_output``: the stream leaving the layer (dLLM-Cache: cached attention and MLP outputs where
  a column was not recomputed).

Selected columns are gathered per row and padded to the call's most; padding is never written and
every operation is per token or per row, so a row's result does not depend on its batch. Padding
columns of a left-padded row are never selected and never attended to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import attrs
import torch
import torch.nn.functional as F

from dlmsearch.core import attention as pattern
from dlmsearch.models import token_ops

if TYPE_CHECKING:
    from dlmsearch.models.transformer import BidirectionalTransformer, Block, TransformerConfig


@attrs.frozen
class LayerPass:
    """What one layer computed for a call's recomputed columns (handed to :meth:`LayerRule.layer_output`)."""

    layer: int  # the layer's index
    x: torch.Tensor  # [rows, columns, hidden] the layer's input (what layer_input returned)
    index: torch.Tensor  # [rows, n] the recomputed columns (gather_columns, padded with column 0)
    valid: torch.Tensor  # [rows, n] which entries of index are real
    queries: torch.Tensor  # [rows, heads, n, head_dim] their queries (rotated)
    attended: torch.Tensor  # [rows, n, hidden] their attention output (projected, before the residual)
    mlp: torch.Tensor  # [rows, n, hidden] their MLP output (before the residual)
    weights: torch.Tensor | None  # [rows, heads, n, columns] their attention probabilities (needs_weights), else None


class LayerRule(Protocol):
    """One call's per-layer decisions, over the rows' copies of their slots' stores."""

    needs_weights: bool  # the attention probabilities of the selected queries are handed to layer_output

    def keys_values(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' stored keys and values ``[rows, kv_heads, columns, head_dim]`` of this layer (written in place)."""

    def layer_input(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The stream ``[rows, columns, hidden]`` entering ``layer`` given the previous layer's output."""

    def probe(self, layer: int) -> torch.Tensor | None:
        """``[rows, columns]`` columns whose values are projected before :meth:`select` (None: none)."""

    def select(self, layer: int, probed: torch.Tensor | None) -> torch.Tensor:
        """``[rows, columns]`` columns recomputed at ``layer`` (``probed``: their fresh values, zeros elsewhere; stored values not yet replaced)."""

    def layer_output(self, computed: LayerPass) -> torch.Tensor:
        """The stream ``[rows, columns, hidden]`` leaving ``computed.layer``, from what the layer computed
        for the recomputed columns.

        Args:
            computed: the layer's input and the recomputed columns' queries, attention and MLP outputs.
        """

    def final(self, x: torch.Tensor, logits_of: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The last layer's stream, with the head (a policy that reads logits beyond the window: d2Cache's confidences)."""

    def read(self) -> torch.Tensor:
        """``[rows, columns]`` the query columns whose final stream is current (their logits are read)."""


def gather_columns(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, n]`` the chosen columns of each row in column order, padded with column 0, and which are real (``n``: the most any row has)."""
    count = chosen.sum(dim=1)
    n = max(int(count.max()), 1)
    index = torch.sort((~chosen).to(torch.int8), dim=1, stable=True).indices[:, :n]
    return index, torch.arange(n, device=chosen.device)[None, :] < count[:, None]


def cells(index: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, column) of every real entry of gathered columns ``index``/``valid`` (:func:`gather_columns`)."""
    return torch.arange(len(index), device=index.device)[:, None].expand_as(index)[valid], index[valid]


def _gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[-1]))


def _attend_with_weights(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its probabilities ``[rows, heads, n, columns]``, reduced in float64 (as :func:`token_ops.attend` on CPU)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1).double(), v.repeat_interleave(groups, dim=1).double()
    scores = (q.double() @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    weights = torch.softmax(scores.masked_fill(~mask, -torch.inf), dim=-1)
    return (weights @ v).to(q.dtype), weights.to(q.dtype)


def _probe_values(block: Block, config: TransformerConfig, x: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """Fresh values ``[rows, columns, kv_heads, head_dim]`` of the probed columns (zeros elsewhere) for the drift test."""
    rows, width = probe.shape
    fresh = F.linear(
        token_ops.rms_norm(x, block.attn_norm.weight, block.attn_norm.eps), block.v_proj.weight, block.v_proj.bias
    )
    return torch.where(probe[..., None], fresh, 0).view(rows, width, config.num_kv_heads, config.head_dim)


def _selected_qkv(
    block: Block,
    xs: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    index: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The selected columns' rotated queries, keys and values ``[rows, heads, n, head_dim]``, per token as dense blocks.

    Args:
        block: the layer's (dense) block, whose norm, projections and configuration are used.
        xs: ``[rows, n, hidden]`` the selected columns' input stream.
        cos: ``[rows, 1, columns, rotary_dim]`` the rotary cosines of every column.
        sin: ``[rows, 1, columns, rotary_dim]`` the rotary sines of every column.
        index: ``[rows, n]`` the selected columns (:func:`gather_columns`).
    """
    rows, n = index.shape

    def angle(t: torch.Tensor) -> torch.Tensor:
        return _gather(t[:, 0], index).reshape(rows * n, 1, -1)

    return block.token_attention_inputs(xs.reshape(rows * n, -1), angle(cos), angle(sin), rows, n, eager=True)


def _attend_selected(
    block: Block,
    config: TransformerConfig,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    key_mask: torch.Tensor,
    needs_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The selected queries' attention output ``[rows, n, hidden]`` (projected) and, where asked, its probabilities.

    Args:
        block: the layer's block, whose output projection is used.
        config: the model's configuration (heads, attention width).
        q: ``[rows, heads, n, head_dim]`` the selected columns' rotated queries.
        keys: ``[rows, kv_heads, columns, head_dim]`` the rows' stored keys, the selected ones already written.
        values: ``[rows, kv_heads, columns, head_dim]`` the rows' stored values, likewise.
        key_mask: the padding mask: which keys each row's queries may attend to.
        needs_weights: also return the probabilities ``[rows, heads, n, columns]`` (else None).
    """
    rows, _, n, _ = q.shape
    if needs_weights:
        attended, weights = _attend_with_weights(q, keys, values, key_mask)
    else:
        attended, weights = (
            token_ops.attend(q, keys, values, key_mask, config.num_kv_heads != config.num_heads),
            None,
        )
    return F.linear(attended.transpose(1, 2).reshape(rows, n, config.attention_width), block.o_proj.weight), weights


def _layer(
    module: BidirectionalTransformer,
    layer: int,
    rule: LayerRule,
    x: torch.Tensor,
    real: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer under the rule: its output stream, and how many columns each row recomputed ``[rows]``.

    Args:
        module: the transformer whose block ``layer`` runs.
        layer: the layer's index.
        rule: the call's per-layer decisions (:class:`LayerRule`).
        x: ``[rows, columns, hidden]`` the previous layer's output stream.
        real: ``[rows, columns]`` which columns are tokens (not left padding).
        cos: ``[rows, 1, columns, rotary_dim]`` the rotary cosines of every column.
        sin: ``[rows, 1, columns, rotary_dim]`` the rotary sines of every column.
        key_mask: the padding mask: which keys each row's queries may attend to.
    """
    block = module.blocks[layer]
    if block.moe is not None:
        raise ValueError(
            f"a layerwise cache policy runs dense blocks only (this model's layer {layer} is a mixture of experts)"
        )
    x = rule.layer_input(layer, x)
    keys, values = rule.keys_values(layer)
    probe = rule.probe(layer)
    probed = None
    if probe is not None:
        probe = probe & real
        probed = _probe_values(block, module.config, x, probe)
    chosen = rule.select(layer, probed) & real
    if probed is not None:
        values.copy_(torch.where(probe[:, None, :, None], probed.transpose(1, 2), values))
    index, valid = gather_columns(chosen)
    xs = _gather(x, index)
    q, k, v = _selected_qkv(block, xs, cos, sin, index)
    row, column = cells(index, valid)
    keys[row, :, column] = k.transpose(1, 2)[valid]
    values[row, :, column] = v.transpose(1, 2)[valid]
    attended, weights = _attend_selected(block, module.config, q, keys, values, key_mask, rule.needs_weights)
    mlp = token_ops.mlp(
        xs + attended,
        block.mlp_norm.weight,
        block.mlp_norm.eps,
        block.gate_proj.weight,
        block.up_proj.weight,
        block.down_proj.weight,
        module.config.activation,
    )
    computed = LayerPass(layer, x, index, valid, q, attended, mlp, weights)
    return rule.layer_output(computed), chosen.sum(dim=1)


def layerwise_logits(
    module: BidirectionalTransformer,
    input_ids: torch.Tensor,
    real: torch.Tensor,
    rule: LayerRule,
    low: torch.Tensor,
    high: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits ``[rows, max(high - low), vocab]`` of each row's columns ``low:high`` (left-aligned),
    which of them are current (the rule's :meth:`~LayerRule.read`), and the columns each row
    recomputed per layer ``[rows, layers]``.

    Args:
        module: the transformer (dense blocks, whole: the decode plan refuses a layerwise cache on a sharded one).
        input_ids: ``[rows, columns]`` the rows' tokens, left-padded.
        real: ``[rows, columns]`` which columns are tokens (not left padding).
        rule: the call's per-layer decisions over the rows' copies of their slots' stores.
        low: ``[rows]`` the first column whose logits are read.
        high: ``[rows]`` one past the last column whose logits are read.
    """
    rows, width = input_ids.shape
    device = input_ids.device
    cos, sin = module.rotary(pattern.positions(real))
    key_mask = pattern.padding_mask(real)
    x = module.embed(input_ids)
    recomputed = torch.zeros(rows, module.config.num_layers, dtype=torch.long, device=device)
    for layer in range(len(module.blocks)):
        x, count = _layer(module, layer, rule, x, real, cos, sin, key_mask)
        recomputed[:, layer] = count
    rule.final(x, module.logits_of)
    length = int((high - low).max())
    column = (low[:, None] + torch.arange(length, device=device)[None, :]).clamp(max=width - 1)
    logits = module.logits_of(_gather(x, column))
    return logits, rule.read().gather(1, column) & (column < high[:, None]), recomputed
