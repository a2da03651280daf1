"""A bidirectional Llama/Qwen2-style transformer: the native body of LLaDA and Dream.

Both families are pre-norm transformers with RMSNorm, rotary positions, (grouped-query)
attention without a causal mask and a SiLU-gated MLP; they differ only in a few switches
(q/k/v bias, where RoPE is computed, tied head) and in parameter names, which
``llada.py`` / ``dream.py`` map onto this module. Owning the forward means padding is exact
(padded keys are masked and each row's positions start at its first real token), no remote
code runs, and the KV cache is read and written inside the attention itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from dlmsearch.core import attention as pattern
from dlmsearch.core.capabilities import ModuleFeatures
from dlmsearch.models import token_ops
from dlmsearch.models.token_ops import ACTIVATIONS, Bucketed, rms_norm

if TYPE_CHECKING:
    from dlmsearch.models.kv_storage import CachedWindow

KeyValues = tuple[torch.Tensor, torch.Tensor]  # [rows, kv_heads, columns, head_dim] each, rotated


@attrs.frozen
class MixtureOfExperts:
    """Routed experts plus shared experts (LLaDA2.x / Ling): grouped top-k routing over sigmoid scores."""

    num_experts: int
    top_k: int
    groups: int  # experts are routed within the best ``top_groups`` of ``groups`` groups
    top_groups: int
    scaling: float  # routed_scaling_factor
    intermediate_size: int  # each expert's
    shared_experts: int  # a shared gated MLP of ``shared_experts * intermediate_size`` (0: none)
    dense_layers: int  # the first layers keep a dense MLP (first_k_dense_replace)


@attrs.frozen
class TransformerConfig:
    """The architecture, in family-neutral names (filled from a checkpoint's ``config.json``)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_length: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False
    activation: str = attrs.field(default="silu", validator=attrs.validators.in_(tuple(ACTIVATIONS)))
    tie_embeddings: bool = False
    rope_in_float32: bool = True  # LLaDA rotates in fp32 and casts back; Dream rotates in the model dtype
    qk_norm: bool = False  # an RMSNorm of each head's query and key before rotation (Qwen3-style: SDAR, LLaDA2)
    head_dim: int = attrs.field(
        default=attrs.Factory(lambda self: self.hidden_size // self.num_heads, takes_self=True)
    )  # Qwen3/SDAR set it apart from hidden / heads
    block_size: int | None = (
        None  # block diffusion (SDAR, LLaDA2.x): attention is block-causal over blocks of this many positions
    )
    rotary_dim: int | None = (
        None  # partial rotary (LLaDA2.x): only the first rotary_dim dimensions of each head rotate; None: all
    )
    moe: MixtureOfExperts | None = None  # mixture-of-experts MLPs after ``moe.dense_layers`` dense ones

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index >= self.moe.dense_layers

    @property
    def attention_width(self) -> int:
        """Query (and output-projection input) width: heads times head_dim."""
        return self.num_heads * self.head_dim


@attrs.frozen
class EagerOps:
    """The per-token halves of a block, run as written."""

    attention_inputs: Callable = token_ops.attention_inputs
    block_output: Callable = token_ops.block_output


@attrs.frozen
class CompiledOps:
    """The per-token halves of a block compiled per token-count bucket (``engine.compile=true``)."""

    attention_inputs: Bucketed
    block_output: Bucketed


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, scaled in the input dtype (as both families do)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` of shape ``[rows, 1, length, head_dim]`` in float32 for integer positions."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)[:, None]
    return angles.cos(), angles.sin()


class Block(nn.Module):
    """Pre-norm attention and gated MLP with residuals; in a mixture-of-experts layer the gated MLP
    is the shared experts' and the routed experts' weights are stacked ``[experts, ...]``."""

    def __init__(self, config: TransformerConfig, index: int = 0) -> None:
        super().__init__()
        self.config = config
        moe = config.moe if config.is_moe_layer(index) else None
        mlp = config.intermediate_size if moe is None else moe.intermediate_size * moe.shared_experts
        kv = config.num_kv_heads * config.head_dim
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.q_proj = nn.Linear(config.hidden_size, config.attention_width, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.attention_width, config.hidden_size, bias=False)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gate_proj = nn.Linear(config.hidden_size, mlp, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, mlp, bias=False)
        self.down_proj = nn.Linear(mlp, config.hidden_size, bias=False)
        self.moe = moe
        if moe is not None:
            experts, width = moe.num_experts, moe.intermediate_size
            self.router = nn.Parameter(torch.empty(experts, config.hidden_size))
            self.register_buffer("expert_bias", torch.zeros(experts))
            self.expert_gate = nn.Parameter(torch.empty(experts, width, config.hidden_size))
            self.expert_up = nn.Parameter(torch.empty(experts, width, config.hidden_size))
            self.expert_down = nn.Parameter(torch.empty(experts, config.hidden_size, width))
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.ops: EagerOps | CompiledOps = EagerOps()
        # tensor parallelism (dlmsearch.models.tensor_parallel): sums the output projections' partial
        # sums over the ranks; this rank's first routed expert (its experts are a slice of them all)
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = token_ops.identity
        self.first_expert = 0

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        key_mask: torch.Tensor | None,
        cached: tuple[CachedWindow, int] | None = None,
    ) -> tuple[torch.Tensor, KeyValues]:
        """The block over the given columns. Without ``cached`` they are the whole canvas (or a
        caller's explicit layout); with ``cached`` (a :class:`~dlmsearch.models.kv_storage.CachedWindow`
        and this block's layer) they are each row's own columns, whose keys and values are
        written into the cache in place and attended together with the cached ones. Returns the
        new hidden states and this call's rotated keys and values (what a refresh stores).
        The per-token work runs through ``self.ops`` (eager, or compiled by ``compile_blocks``)."""
        c = self.config
        rows, length, _ = x.shape
        flat = x.reshape(rows * length, c.hidden_size)
        q, k, v = self._attention_inputs(flat, cos, sin, rows, length)
        grouped = (
            c.num_kv_heads != c.num_heads
        )  # grouped-query attention without copying keys and values per head group
        if cached is None:
            attended = token_ops.attend(q, k, v, key_mask, grouped)
        else:
            window, layer = cached
            window.write(layer, k, v)
            attended = window.attend(layer, q, grouped)
        mixed = attended.transpose(1, 2).reshape(rows * length, c.attention_width)
        return self._output(flat, mixed).view(rows, length, c.hidden_size), (k, v)

    def _attention_inputs(
        self, flat: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: int, length: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries, keys and values ``[rows, heads, length, head_dim]`` from the per-token ops (eager or compiled)."""
        angles = (t.transpose(1, 2).reshape(rows * length, 1, -1) for t in (cos, sin))
        return self.token_attention_inputs(flat, *angles, rows, length)

    def token_attention_inputs(
        self, flat: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: int, length: int, eager: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries, keys and values ``[rows, heads, length, head_dim]`` of ``rows x length`` tokens.

        Args:
            flat: ``[rows * length, hidden]`` the tokens' input stream.
            cos: ``[rows * length, 1, rotary_dim]`` each token's rotary cosines.
            sin: ``[rows * length, 1, rotary_dim]`` each token's rotary sines.
            rows: the rows the tokens come from.
            length: tokens per row.
            eager: run the per-token ops as written (the layerwise path, any count of tokens), not
                through ``self.ops`` (eager, or compiled per bucket).
        """
        c = self.config
        ops = token_ops if eager else self.ops
        q, k, v = ops.attention_inputs(
            flat,
            cos,
            sin,
            self.attn_norm.weight,
            self.attn_norm.eps,
            self.q_proj.weight,
            self.q_proj.bias,
            self.k_proj.weight,
            self.k_proj.bias,
            self.v_proj.weight,
            self.v_proj.bias,
            c.num_heads,
            c.num_kv_heads,
            c.rope_in_float32,
            None if self.q_norm is None else self.q_norm.weight,
            None if self.k_norm is None else self.k_norm.weight,
        )
        return tuple(t.view(rows, length, -1, c.head_dim).transpose(1, 2) for t in (q, k, v))

    def _output(self, flat: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """The block's output ``[tokens, hidden]``: output projection, residual and (dense or mixture-of-experts) MLP."""
        dense = (
            self.o_proj.weight,
            self.mlp_norm.weight,
            self.mlp_norm.eps,
            self.gate_proj.weight,
            self.up_proj.weight,
            self.down_proj.weight,
            self.config.activation,
        )
        if self.moe is None:
            return self.ops.block_output(flat, mixed, *dense, self.reduce)
        return token_ops.moe_block_output(flat, mixed, *dense, self._routed(), self.reduce)

    def _routed(self) -> dict[str, Any]:
        """The routed experts' weights and routing settings, as :func:`token_ops.moe_block_output` takes them."""
        return {
            "router": self.router,
            "expert_bias": self.expert_bias,
            "gate": self.expert_gate,
            "up": self.expert_up,
            "down": self.expert_down,
            "top_k": self.moe.top_k,
            "groups": self.moe.groups,
            "top_groups": self.moe.top_groups,
            "scaling": self.moe.scaling,
            "first_expert": self.first_expert,
        }


class BidirectionalTransformer(nn.Module):
    """Token ids ``[rows, length]`` (left-padded, with a padding mask) to logits ``[rows, length, vocab]``."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config, index) for index in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = None if config.tie_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    # logits of the generation region only; keys and values kept between calls (cache policies);
    # an explicit attention mask and positions (WINO's shadow block); compiled per-token work
    features = ModuleFeatures(kv_cache=True, explicit_attention=True, logits_from=True, compiles=True, layerwise=True)

    def compile_blocks(self) -> None:
        """Run every block's per-token work compiled (fused norms, rotation and MLP), one graph
        per token-count bucket shared by all layers (:mod:`~dlmsearch.models.token_ops`). Never on a
        tensor-parallel model (its all-reduce would sit inside the graphs): the decode plan refuses that."""
        if not isinstance(self.blocks[0].ops, EagerOps):
            return
        fused = CompiledOps(
            Bucketed(token_ops.attention_inputs, per_token=3), Bucketed(token_ops.block_output, per_token=2)
        )
        for block in self.blocks:
            block.ops = fused

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, logits_from: int = 0
    ) -> torch.Tensor:
        """Logits of columns ``logits_from:``. ``attention_mask`` marks real tokens; padded keys are
        ignored and positions count real tokens only."""
        return self.run(input_ids, attention_mask, logits_from)[0]

    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        logits_from: int = 0,
        attention: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[KeyValues]]:
        """Logits of the canvas's columns from ``logits_from`` on, and each layer's keys and values.

        ``attention`` (``[rows, length, length]`` bool: query may attend to key) with
        ``positions`` (``[rows, length]``) replaces the padding mask for rows laid out by the
        caller (WINO's shadow block, appended after the canvas's last column). A block-diffusion
        model (``config.block_size``) attends block-causally over the real tokens, its blocks
        counted from each row's first real token (:func:`~dlmsearch.core.attention.block_causal`).
        """
        length = input_ids.shape[1]
        if attention is None and self.config.block_size is not None:
            real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
            attention, positions = pattern.block_causal(real, self.config.block_size), pattern.positions(real)
        if attention is not None:
            if positions is None:
                raise ValueError("an explicit attention mask needs explicit positions")
            key_mask = attention.bool()[:, None]
        elif attention_mask is None:
            positions = torch.arange(length, device=input_ids.device).expand(input_ids.shape[0], length)
            key_mask = None
        else:
            positions = pattern.positions(attention_mask)
            key_mask = pattern.padding_mask(attention_mask)  # callers pass a mask only where rows are padded
        return self._layers(input_ids, positions, key_mask, None, logits_from)

    def run_cached(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        window: CachedWindow,
        logits_from: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[rows, length, vocab]`` of each row's own columns (``input_ids`` at
        ``positions``), attending to its slot's cached keys and values as ``window`` lays out.
        ``logits_from [rows]``: the head runs only from each row's query ``logits_from[r]`` on
        (left-aligned, ``length - min(logits_from)`` wide): columns forwarded only to be written
        into the cache (a finished block) cost no vocabulary-sized work."""
        return self._layers(input_ids, positions, None, window, 0 if logits_from is None else logits_from)[0]

    def _layers(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        key_mask: torch.Tensor | None,
        window: CachedWindow | None,
        logits_from: int | torch.Tensor,
    ) -> tuple[torch.Tensor, list[KeyValues]]:
        cos, sin = self.rotary(positions)
        x = self.embed(input_ids)
        kv = []
        for index, block in enumerate(self.blocks):
            x, fresh = block(x, cos, sin, key_mask, None if window is None else (window, index))
            kv.append(fresh)
        if isinstance(logits_from, torch.Tensor):  # per row: gather each row's columns from its own start
            length = x.shape[1]
            start = logits_from.to(x.device)
            index = (start[:, None] + torch.arange(length - int(start.min()), device=x.device)[None, :]).clamp(
                max=length - 1
            )
            x = x.gather(1, index[..., None].expand(-1, -1, x.shape[2]))
        else:
            x = x[:, logits_from:]
        return self.logits_of(x), kv

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` ``[rows, 1, length, rotary_dim]`` of these positions."""
        return rotary_tables(positions, self.config.rotary_dim or self.config.head_dim, self.config.rope_theta)

    def logits_of(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and the vocabulary head over the last layer's stream ``x``."""
        x = self.norm(x)
        return F.linear(x, self.embed.weight) if self.head is None else self.head(x)
