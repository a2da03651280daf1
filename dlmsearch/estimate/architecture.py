"""A model's parameters by placement, counted exactly from its ``config.json``.

LLaDA, Dream, SDAR and LLaDA2.x through the family's own ``read_config``
(:mod:`dlmsearch.models.families`) and the tensors :class:`~dlmsearch.models.transformer.BidirectionalTransformer`
builds from it; DiffusionGemma from transformers' ``DiffusionGemmaConfig`` and the tensors
``DiffusionGemmaForBlockDiffusion`` builds (encoder and decoder share every text weight, the head
is the embedding), its vision tower counted by building transformers' own module on the meta
device. ``tests/test_estimate.py`` checks each count against ``sum(p.numel())`` of a built model.
"""

from __future__ import annotations

from typing import Any

import attrs

from dlmsearch.models.families import LLADA2, UnsupportedCheckpoint, family_of
from dlmsearch.models.transformer import TransformerConfig

# configs in the llada2_moe layout under other names: Ling 2.0 (the base LLaDA2 is trained from), dFactory's copy
LLADA2_ALIASES = ("bailing_moe", "llada2_moe_veomni")


class EstimateError(ValueError):
    """A configuration or a parallel degree the estimate cannot lay out (one line)."""


@attrs.frozen
class Attention:
    """One layer's attention, as a rank's share and its KV cache depend on it."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    bias: bool = False  # q/k/v biases (Dream); DiffusionGemma's attention_bias also gives o a bias
    o_bias: bool = False
    separate_v: bool = True  # False: values are the keys' projection (DiffusionGemma's full layers)
    window: int | None = None  # cached positions at most (a sliding layer's sliding_window - 1)
    bias_copies: int = 1  # DiffusionGemma's encoder and decoder tie their weights, not their biases: 2

    def query_params(self) -> int:
        """q and o (with biases): split over the query heads."""
        width = self.heads * self.head_dim
        biases = (width if self.bias else 0) + (self.hidden if self.o_bias else 0)
        return 2 * width * self.hidden + self.bias_copies * biases

    def kv_params(self, kv_heads: int) -> int:
        """k (and v) for ``kv_heads`` key/value heads, with biases."""
        width = kv_heads * self.head_dim
        return (2 if self.separate_v else 1) * (width * self.hidden + (self.bias_copies * width if self.bias else 0))


@attrs.frozen
class Architecture:
    """What decides memory per rank: per-layer attention, and the other parameters by placement."""

    name: str
    description: str
    attention: tuple[Attention, ...]  # one per layer
    mlp: int  # dense MLPs, shared experts, self-conditioning: split column/row-wise over the ranks
    num_experts: int  # routed experts per MoE layer (0: dense)
    experts: int  # all routed experts' parameters, every layer
    replicated: int  # embeddings, vocabulary head, norms, routers, vision tower
    replicated_parts: str = "embeddings, vocabulary head, norms, routers"

    @property
    def total(self) -> int:
        """Every parameter (tied ones once)."""
        attention = sum(a.query_params() + a.kv_params(a.kv_heads) for a in self.attention)
        return attention + self.mlp + self.experts + self.replicated


def native_architecture(config: TransformerConfig, name: str, description: str = "") -> Architecture:
    """The parameters :class:`~dlmsearch.models.transformer.BidirectionalTransformer` builds from ``config``."""
    c = config
    attention = tuple(
        Attention(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, bias=c.qkv_bias) for _ in range(c.num_layers)
    )
    moe_layers = [i for i in range(c.num_layers) if c.is_moe_layer(i)]
    widths = [
        c.moe.intermediate_size * c.moe.shared_experts if c.is_moe_layer(i) else c.intermediate_size
        for i in range(c.num_layers)
    ]
    norms = c.hidden_size * (2 * c.num_layers + 1) + (2 * c.head_dim * c.num_layers if c.qk_norm else 0)
    embeddings = c.vocab_size * c.hidden_size * (1 if c.tie_embeddings else 2)
    experts = c.moe.num_experts if c.moe is not None else 0
    routers = len(moe_layers) * experts * c.hidden_size
    return Architecture(
        name=name,
        description=description,
        attention=attention,
        mlp=sum(3 * c.hidden_size * width for width in widths),
        num_experts=experts,
        experts=len(moe_layers) * 3 * experts * (c.moe.intermediate_size if c.moe else 0) * c.hidden_size,
        replicated=embeddings + norms + routers,
    )


def diffusion_gemma_architecture(config: dict[str, Any], name: str, description: str = "") -> Architecture:
    """The parameters ``DiffusionGemmaForBlockDiffusion`` builds from a ``diffusion_gemma`` config.json."""
    from transformers import DiffusionGemmaConfig

    try:
        parsed = DiffusionGemmaConfig.from_dict(config)
    except Exception as error:  # transformers' own validation: one line, whatever it raised
        raise EstimateError(f"{name}: transformers cannot read this DiffusionGemma config: {error}") from error
    t = parsed.text_config
    hidden, layers = t.hidden_size, t.num_hidden_layers
    copies = 1 if parsed.tie_word_embeddings else 2  # untied: encoder and decoder each hold the text stack
    attention = []
    for index, kind in enumerate(t.layer_types[:layers]):
        layer = t.per_layer_config[index]
        sliding = kind == "sliding_attention"
        window = t.sliding_window - 1 if sliding else None
        attention.append(
            Attention(hidden, t.num_attention_heads, layer.num_key_value_heads, layer.head_dim, bias=t.attention_bias,
                      o_bias=t.attention_bias, separate_v=sliding, window=window, bias_copies=3 - copies)
        )  # fmt: skip
    experts = t.num_experts or 0
    norms = sum(7 * hidden + 2 * a.head_dim for a in attention)  # 7 per layer, q/k norms (v_norm has no scale)
    routers = layers * (experts * hidden + hidden + experts)  # proj, scale, per_expert_scale
    stack_attention = tuple(attention) * copies
    vision = _vision_parameters(parsed)
    text_replicated = copies * (t.vocab_size * hidden + norms + routers + hidden)  # + the final norm
    head = 0 if parsed.tie_word_embeddings else t.vocab_size * hidden
    self_conditioning = 3 * hidden * t.intermediate_size
    return Architecture(
        name=name,
        description=description,
        attention=stack_attention,
        mlp=copies * layers * 3 * hidden * t.intermediate_size + self_conditioning,
        num_experts=experts,
        experts=copies * layers * 3 * experts * (t.moe_intermediate_size or 0) * hidden,
        replicated=text_replicated + head + hidden + vision,  # + self-conditioning's pre-norm
        replicated_parts=("embeddings (= vocabulary head)" if head == 0 else "embeddings, vocabulary head")
        + ", norms, routers"
        + (f", vision tower ({vision / 1e9:.2f}B)" if vision else ""),
    )


def _vision_parameters(parsed: Any) -> int:
    """The vision tower and its projection into the text width, built on the meta device (no memory)."""
    import torch
    from transformers import AutoModel
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaMultimodalEmbedder

    if parsed.vision_config is None:
        return 0
    with torch.device("meta"):
        tower = AutoModel.from_config(parsed.vision_config)
        projection = DiffusionGemmaMultimodalEmbedder(parsed.vision_config, parsed.text_config)
    return sum(p.numel() for module in (tower, projection) for p in module.parameters())


def architecture(config: dict[str, Any], name: str, description: str = "") -> Architecture:
    """A config.json's :class:`Architecture`: LLaDA, Dream, SDAR, LLaDA2.x (and Ling 2.0's
    ``bailing_moe`` layout) through their families' readers, DiffusionGemma through transformers."""
    model_type = config.get("model_type")
    if model_type == "diffusion_gemma":
        return diffusion_gemma_architecture(config, name, description)
    try:
        family = LLADA2 if model_type in LLADA2_ALIASES else family_of(config, name)
        native = family.read_config(config)
    except (UnsupportedCheckpoint, KeyError, TypeError, ValueError) as error:
        missing = f"config.json has no {error}" if isinstance(error, KeyError) else str(error)
        raise EstimateError(f"{name}: {missing}") from error
    return native_architecture(native, name, description or f"{family.name} ({model_type})")


def native_config(config: dict[str, Any]) -> TransformerConfig:
    """The :class:`TransformerConfig` a native family's reader makes of ``config`` (for cross-checks)."""
    model_type = config.get("model_type")
    family = LLADA2 if model_type in LLADA2_ALIASES else family_of(config, "config")
    return family.read_config(config)
