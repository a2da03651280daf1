"""Public model shapes (``--preset NAME``), each with where its numbers come from."""

from __future__ import annotations

from typing import Any

from dlmsearch.estimate.architecture import Architecture, EstimateError, architecture

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
# weight_tying false and rope_theta 5e5 as LLaDA's released configuration sets them for LLaDA-8B.
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
