"""Writing a native transformer as a LLaDA checkpoint directory (what the project's own text models ship as).

The directory is what an 8B LLaDA checkpoint holds, scaled down: ``config.json`` with every
field of LLaDA's ``ModelConfig`` and ``model_type: "llada"``, ``generation_config.json`` with
the EOS/EOT ids, and ``model.safetensors`` with LLaDA's parameter names (the inverse of
:data:`dlmsearch.models.families.LLADA`'s renames). It loads through ``model=llada
model.path=DIR`` like any other LLaDA checkpoint. LLaDA's modeling code is not shipped (it is
not ours to copy), so there is no ``auto_map``: ``model.impl=native`` is the way to load it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from dlmsearch.models.families import LLADA, Family
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig

# native name pattern -> LLaDA name (checked against the family's renames on every save)
_TO_LLADA = (
    (r"embed\.weight", "model.transformer.wte.weight"),
    (r"norm\.weight", "model.transformer.ln_f.weight"),
    (r"head\.weight", "model.transformer.ff_out.weight"),
    (r"blocks\.(\d+)\.(q_proj|k_proj|v_proj|up_proj)\.weight", r"model.transformer.blocks.\1.\2.weight"),
    (r"blocks\.(\d+)\.attn_norm\.weight", r"model.transformer.blocks.\1.attn_norm.weight"),
    (r"blocks\.(\d+)\.o_proj\.weight", r"model.transformer.blocks.\1.attn_out.weight"),
    (r"blocks\.(\d+)\.mlp_norm\.weight", r"model.transformer.blocks.\1.ff_norm.weight"),
    (r"blocks\.(\d+)\.gate_proj\.weight", r"model.transformer.blocks.\1.ff_proj.weight"),
    (r"blocks\.(\d+)\.down_proj\.weight", r"model.transformer.blocks.\1.ff_out.weight"),
)


def family_name(native: str, table: tuple[tuple[str, str], ...], family: Family) -> str:
    """A checkpoint format's name for a native parameter, by ``table`` (checked: the family's renames map it back)."""
    for pattern, replacement in table:
        if re.fullmatch(pattern, native):
            name = re.sub(pattern, replacement, native)
            if family.native_name(name) != native:
                raise AssertionError(f"{native} -> {name} does not map back through the {family.name} family")
            return name
    raise ValueError(f"the {family.name} format has no place for the native parameter {native}")


def llada_name(native: str) -> str:
    """LLaDA's name for a native parameter (the family's renames map it back)."""
    return family_name(native, _TO_LLADA, LLADA)


def write_checkpoint(directory: Path, state: dict[str, torch.Tensor], files: dict[str, str]) -> None:
    """``model.safetensors`` (float32) and the given text files into ``directory``, each replaced atomically."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().to("cpu", torch.float32).contiguous() for name, tensor in state.items()}
    save_file(state, str(directory / "model.safetensors.tmp"), metadata={"format": "pt"})
    (directory / "model.safetensors.tmp").replace(directory / "model.safetensors")
    for name, text in files.items():
        (directory / f"{name}.tmp").write_text(text)
        (directory / f"{name}.tmp").replace(directory / name)


def llada_config(config: TransformerConfig, *, mask_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
    """Every field of LLaDA's ``ModelConfig``, with LLaDA-8B's choices where ``config`` is silent."""
    if config.qkv_bias:
        raise ValueError("LLaDA checkpoints have no q/k/v bias")
    return {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "d_model": config.hidden_size,
        "n_heads": config.num_heads,
        "n_kv_heads": config.num_kv_heads,
        "n_layers": config.num_layers,
        "mlp_ratio": config.intermediate_size // config.hidden_size,
        "mlp_hidden_size": config.intermediate_size,
        "activation_type": config.activation,
        "block_type": "llama",
        "block_group_size": 1,
        "alibi": False,
        "alibi_bias_max": 8.0,
        "rope": True,
        "rope_full_precision": config.rope_in_float32,
        "rope_theta": config.rope_theta,
        "flash_attention": False,
        "attention_dropout": 0.0,
        "multi_query_attention": None,
        "attention_layer_norm": False,
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "rms_norm_eps": config.rms_norm_eps,
        "attention_layer_norm_with_affine": True,
        "max_sequence_length": config.max_length,
        "train_max_sequence_length": config.max_length,
        "include_qkv_bias": False,
        "include_bias": False,
        "bias_for_layer_norm": False,
        "scale_logits": False,
        "vocab_size": config.vocab_size,
        "embedding_size": config.vocab_size,
        "weight_tying": config.tie_embeddings,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "mask_token_id": mask_id,
        "init_device": "cpu",
        "init_fn": "mitchell",
        "init_std": 0.02,
        "init_cutoff_factor": None,
        "precision": "amp_bf16",
        "use_cache": False,
        "torch_dtype": "float32",
    }


def save_llada(directory: Path, module: BidirectionalTransformer, *, mask_id: int, eos_id: int, eot_id: int) -> None:
    """Write ``module`` (float32) as a LLaDA checkpoint into ``directory`` (files replaced atomically)."""
    write_checkpoint(
        directory,
        {llada_name(name): tensor for name, tensor in module.state_dict().items()},
        {
            "config.json": json.dumps(
                llada_config(module.config, mask_id=mask_id, eos_id=eos_id, pad_id=eos_id), indent=2
            )
            + "\n",
            "generation_config.json": json.dumps({"eos_token_id": [eos_id, eot_id], "pad_token_id": eos_id}, indent=2)
            + "\n",
        },
    )
