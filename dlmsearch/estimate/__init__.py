"""Memory per rank under tensor parallelism: weights (split and replicated) and KV cache, from a config.

``python -m dlmsearch.estimate --preset llada2-flash --tp 1 2 4 8`` (or ``--config DIR/config.json``)
prints one markdown table per model. The parameters are counted exactly from the shapes the config
implies: for LLaDA, Dream, SDAR and LLaDA2.x through the family's own ``read_config``
(:mod:`dlmsearch.models.families`) and the tensors :class:`~dlmsearch.models.transformer.BidirectionalTransformer`
builds from it; for DiffusionGemma from transformers' ``DiffusionGemmaConfig`` and the tensors
``DiffusionGemmaForBlockDiffusion`` builds (encoder and decoder share every text weight, the head
is the embedding), its vision tower counted by building transformers' own module on the meta
device. ``tests/test_estimate.py`` checks each count against ``sum(p.numel())`` of a built model.

How a rank's share is counted (tensor parallelism over ``N`` ranks, expert parallelism for the
routed experts):

* **split by N**: attention q/k/v/o (by heads: q and o column/row-wise over query heads, k and v
  over key/value heads), dense MLPs, shared experts, DiffusionGemma's self-conditioning MLP;
* **routed experts**: each rank holds ``num_experts / N`` whole experts;
* **replicated**: token embeddings, the vocabulary head, every norm, the routers, a vision tower;
* **KV cache per rank**: ``layers x 2 x batch x cached positions x kv_heads/N x head_dim x
  dtype bytes`` (DiffusionGemma: per layer, its own heads and head_dim; a sliding layer caches at
  most ``sliding_window - 1`` positions, as transformers' ``DynamicSlidingWindowLayer`` keeps).

``N`` must divide the query heads and the routed experts. Key/value heads: ``N`` divides them, or
(fewer key/value heads than ranks) they divide ``N`` and each rank holds one whole key/value
head, ``N / kv_heads`` ranks sharing it, as vLLM does; the table says so under it. Anything else
is an :class:`EstimateError` naming the count ``N`` fails.
"""

from __future__ import annotations

from typing import Any

import attrs

from dlmsearch.models.families import LLADA2, UnsupportedCheckpoint, family_of
from dlmsearch.models.transformer import TransformerConfig

GIB = 2**30
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
CAPACITIES_GB = (80, 141)  # H100 / A100 80 GB, H200 141 GB: decimal gigabytes, as the cards are sold
# configs in the llada2_moe layout under other names: Ling 2.0 (the base LLaDA2 is trained from), dFactory's copy
LLADA2_ALIASES = ("bailing_moe", "llada2_moe_veomni")


HEADER = (
    "| N | weights per rank (GiB) | of which replicated (GiB) | KV cache per rank (GiB) "
    "| total per rank (GiB) | fits 80 GB / 141 GB? |"
)
FITS_LEGEND = (
    "Fits: total per rank within 80e9 / 141e9 bytes (74.5 / 131.3 GiB); activations, logits, workspace "
    "and the CUDA context come on top."
)


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


@attrs.frozen
class RankMemory:
    """One rank's bytes at one parallel degree."""

    ranks: int
    weights: int
    replicated: int
    kv_cache: int
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache


# ---------------------------------------------------------------------------------------------
# Architectures from config.json
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Per rank
# ---------------------------------------------------------------------------------------------


def kv_heads_per_rank(kv_heads: int, ranks: int, where: str) -> int:
    """Key/value heads one rank holds: ``kv_heads / ranks``, or 1 (replicated) where ``ranks`` is a
    multiple of ``kv_heads``; else an :class:`EstimateError`."""
    if kv_heads % ranks == 0:
        return kv_heads // ranks
    if ranks % kv_heads == 0:
        return 1
    raise EstimateError(
        f"{where}: N={ranks} does not divide num_key_value_heads={kv_heads} (nor is it a multiple of it)"
    )


def rank_memory(
    arch: Architecture, ranks: int, dtype: str, batch: int, length: int, cache: str = "prefix"
) -> RankMemory:
    """One rank's weights, replicated weights and KV cache at ``ranks``-way parallelism.

    Args:
        arch: the model.
        ranks: N, the tensor (and expert) parallel degree.
        dtype: ``bfloat16`` or ``float32`` (weights and cache).
        batch: rows decoded together.
        length: tokens per row, prompt included.
        cache: ``prefix`` (keys and values of every position are kept) or ``none``.
    """
    if ranks < 1:
        raise EstimateError(f"{arch.name}: N={ranks}: the parallel degree must be at least 1")
    heads = {a.heads for a in arch.attention}
    for count in sorted(heads):
        if count % ranks:
            raise EstimateError(f"{arch.name}: N={ranks} does not divide num_attention_heads={count}")
    if arch.num_experts and arch.num_experts % ranks:
        raise EstimateError(f"{arch.name}: N={ranks} does not divide num_experts={arch.num_experts}")
    size = DTYPE_BYTES[dtype]
    split = arch.mlp / ranks + arch.experts / ranks
    kv_bytes, notes = 0, set()
    for a in arch.attention:
        held = kv_heads_per_rank(a.kv_heads, ranks, arch.name)
        if held * ranks > a.kv_heads:
            notes.add(
                f"N={ranks}: layers with {a.kv_heads} key/value heads hold one whole head per rank "
                f"({ranks // a.kv_heads} ranks share each; its k/v weights and cache are not split further)"
            )
        split += a.query_params() / ranks + a.kv_params(held)
        positions = length if a.window is None else min(length, a.window)
        kv_bytes += 2 * batch * positions * held * a.head_dim * size if cache == "prefix" else 0
    replicated = arch.replicated * size
    return RankMemory(ranks, round(split * size) + replicated, replicated, kv_bytes, tuple(sorted(notes)))


def fits(total: int) -> str:
    """``yes``/``no`` per capacity in :data:`CAPACITIES_GB`, joined by `` / ``."""
    return " / ".join("yes" if total <= gb * 10**9 else "no" for gb in CAPACITIES_GB)


def memory_table(arch: Architecture, tp: list[int], dtype: str, batch: int, length: int, cache: str = "prefix") -> str:
    """The markdown block for one model: a heading line, the table, its legend and notes.

    Args:
        arch: the model.
        tp: the parallel degrees, one row each.
        dtype: ``bfloat16`` or ``float32``.
        batch: rows decoded together.
        length: tokens per row, prompt included.
        cache: ``prefix`` or ``none``.
    """
    rows = [rank_memory(arch, n, dtype, batch, length, cache) for n in tp]
    experts = f", {arch.num_experts} routed experts per MoE layer" if arch.num_experts else ""
    lines = [
        f"### {arch.name}: {arch.description}",
        "",
        f"{arch.total / 1e9:.2f}B parameters{experts}; {dtype}, batch {batch} x {length} tokens, KV cache: {cache}",
        "",
        HEADER,
        "|---:|---:|---:|---:|---:|:---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.ranks} | {row.weights / GIB:.2f} | {row.replicated / GIB:.2f} | {row.kv_cache / GIB:.2f} "
            f"| {row.total / GIB:.2f} | {fits(row.total)} |"
        )
    lines += [
        "",
        f"Replicated on every rank: {arch.replicated_parts}. {FITS_LEGEND}",
    ]
    lines += [f"Note: {note}." for row in rows for note in row.notes]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Presets: public shapes, each with where its numbers come from
# ---------------------------------------------------------------------------------------------

# LLaDA2.0-flash / LLaDA2.1-flash (100B total, 6.1B active). Source: inclusionAI/dFactory,
# configs/model_configs/llada2_flash/config.json (LLaDA2's training framework's copy of the
# checkpoint's config; its model_type there is "llada2_moe_veomni", the checkpoint's "llada2_moe").
# The Hugging Face config.json of LLaDA2.0-flash / 2.1-flash itself could not be opened here.
# Cross-check: these shapes give 102.89B parameters, and the Hugging Face API lists the base it is
# trained from, inclusionAI/Ling-flash-2.0, at 102,889,705,216 safetensors parameters.
_LLADA2_COMMON = {
    "model_type": "llada2_moe",
    "hidden_act": "silu",
    "head_dim": 128,
    "num_key_value_heads": 4,
    "num_experts": 256,
    "num_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "partial_rotary_factor": 0.5,
    "rope_theta": 600000,
    "rope_scaling": None,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "use_bias": False,
    "use_qkv_bias": False,
    "use_qk_norm": True,
    "norm_head": False,
    "use_sliding_window": False,
    "vocab_size": 157184,
    "max_position_embeddings": 16384,
}
LLADA2_FLASH = {
    **_LLADA2_COMMON,
    "hidden_size": 4096,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
}

# LLaDA2.0-mini / LLaDA2.1-mini (16B). Source: huggingface.co/inclusionAI/LLaDA2.1-mini config.json
# (as the docs search shows it; its vocab_size line was cut off there) and inclusionAI/dFactory's
# configs/model_configs/llada2_mini/config.json (vocab_size 157184). 16.26B, Ling-mini-2.0's stated total.
LLADA2_MINI = {
    **_LLADA2_COMMON,
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "moe_intermediate_size": 512,
    "num_attention_heads": 16,
    "num_hidden_layers": 20,
    "max_position_embeddings": 32768,
}

# LLaDA-8B (Base / Instruct). Source: the LLaDA-8B-Instruct config.json as a fine-tune copies it
# (huggingface.co/Proximile/LLaDA-8B-Tools, auto_map pointing at GSAI-ML/LLaDA-8B-Instruct):
# d_model 4096, 32 layers, 32 heads, 32 kv heads, mlp_hidden_size 12288, embedding_size 126464;
# weight_tying false and rope_theta 5e5 as ../shared/upstream/README.md records for LLaDA-8B.
LLADA_8B = {
    "model_type": "llada",
    "d_model": 4096,
    "n_layers": 32,
    "n_heads": 32,
    "n_kv_heads": 32,
    "mlp_hidden_size": 12288,
    "embedding_size": 126464,
    "vocab_size": 126464,
    "max_sequence_length": 4096,
    "rope_theta": 500000.0,
    "weight_tying": False,
    "include_qkv_bias": False,
    "activation_type": "silu",
    "block_type": "llama",
    "layer_norm_type": "rms",
}

# Dream-v0-Instruct-7B / Base-7B (Qwen2.5-7B's shape). Source: the Dream-architecture config.json of
# apple/DiffuCoder-7B-Instruct (model_type "Dream", same Qwen2.5-7B shape) and this repository's
# experiments/bench/random_model.py ("dream_7b"); Dream-org's own config.json was not opened here.
DREAM_7B = {
    "model_type": "Dream",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

# DiffusionGemma 26B-A4B (google/diffusiongemma-26B-A4B-it, Gemma 4 26B-A4B's MoE). The Google
# config.json itself could not be opened here. text_config: a public test fixture that reproduces
# the checkpoint's ("test_summarize_diffusion_gemma_nested_text_config", found by the code index),
# consistent with Ollama's GGUF metadata of gemma4:26b (30 blocks, width 2816, 16 heads, 8 kv heads
# of 256 on sliding layers, 512 on full ones, window 1024, 128 experts of 704, top 8, dense MLP
# 2112) and with transformers' EP plan comment "num_global_key_value_heads=2". tie_word_embeddings:
# transformers' default (True), which ties the head to the embedding. vision_config: 27 layers,
# 16 heads (Ollama's gemma4 vision metadata), width 1152, head_dim 72, 16 kv heads, standardize
# (a public fixture of the >= 2816-wide Gemma 4 models); intermediate_size 4304 is NOT verified
# (SigLIP-so400m's, Gemma 3's tower): the tower is then 0.57B, against "~550M" published for
# Gemma 4 26B-A4B's ViT, and the model 25.82B, as whatmodel.sh lists DiffusionGemma 26B-A4B.
DIFFUSION_GEMMA_26B_A4B = {
    "model_type": "diffusion_gemma",
    "architectures": ["DiffusionGemmaForBlockDiffusion"],
    "canvas_length": 256,
    "tie_word_embeddings": True,
    "text_config": {
        "model_type": "diffusion_gemma_text",
        "hidden_size": 2816,
        "intermediate_size": 2112,
        "num_hidden_layers": 30,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "global_head_dim": 512,
        "num_global_key_value_heads": 2,
        "vocab_size": 262144,
        "max_position_embeddings": 262144,
        "num_experts": 128,
        "top_k_experts": 8,
        "moe_intermediate_size": 704,
        "sliding_window": 1024,
    },
    "vision_config": {
        "model_type": "gemma4_vision",
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 72,
        "standardize": True,
    },
}

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "llada2-flash": ("LLaDA2.0-flash / LLaDA2.1-flash (llada2_moe, 100B-A6B)", LLADA2_FLASH),
    "llada2-mini": ("LLaDA2.0-mini / LLaDA2.1-mini (llada2_moe, 16B-A1.4B)", LLADA2_MINI),
    "llada-8b": ("LLaDA-8B Base / Instruct (llada)", LLADA_8B),
    "dream-7b": ("Dream-v0 7B Base / Instruct (Dream)", DREAM_7B),
    "diffusion-gemma-26b-a4b": ("DiffusionGemma 26B-A4B (diffusion_gemma)", DIFFUSION_GEMMA_26B_A4B),
}


def preset(name: str) -> Architecture:
    """A :data:`PRESETS` model's :class:`Architecture`, or an :class:`EstimateError` naming the known ones."""
    if name not in PRESETS:
        raise EstimateError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    description, config = PRESETS[name]
    return architecture(config, name, description)


__all__ = [
    "PRESETS",
    "Architecture",
    "Attention",
    "EstimateError",
    "RankMemory",
    "architecture",
    "memory_table",
    "native_config",
    "preset",
    "rank_memory",
]
