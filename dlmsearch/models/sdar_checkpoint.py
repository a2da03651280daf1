"""Writing a native transformer as an SDAR checkpoint directory (the project's block-diffusion models ship so).

``config.json`` with SDAR's ``SDARConfig`` fields and ``model_type: "sdar"`` (plus ``block_size``, which
SDAR's own config does not carry, and ``mask_token_id``), ``generation_config.json`` with the stop
ids, and ``model.safetensors`` with SDAR's (Qwen3's) parameter names, the inverse of
:data:`dlmsearch.models.families.SDAR`'s renames. It loads through ``model=sdar model.path=DIR``;
SDAR's modeling code is not shipped (``model.impl=native``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlmsearch.models.families import SDAR
from dlmsearch.models.llada_checkpoint import save_as
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig


def sdar_config(config: TransformerConfig, *, mask_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
    """``SDARConfig``'s fields for ``config`` (which must be SDAR's architecture: q/k norm, no biases, a block
    size): what the family's reader reads, turned around (:meth:`~dlmsearch.models.families.ConfigReader.written`),
    then the rest."""
    if config.qkv_bias or not config.qk_norm or config.block_size is None or config.activation != "silu":
        raise ValueError("an SDAR checkpoint needs q/k norm, no q/k/v bias, SiLU and a block size")
    return {
        "model_type": "sdar",
        "architectures": ["SDARForCausalLM"],
        **SDAR.read_config.written(config),
        "head_dim": config.head_dim,
        "initializer_range": 0.02,
        "use_cache": True,
        "sliding_window": 4096,
        "max_window_layers": config.num_layers,
        "attention_dropout": 0.0,
        "fuse_cross_entropy": False,
        "block_size": config.block_size,
        "mask_token_id": mask_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
    }


def save_sdar(directory: Path, module: BidirectionalTransformer, *, mask_id: int, eos_id: int, eot_id: int) -> None:
    """Write ``module`` (float32) as an SDAR checkpoint into ``directory`` (files replaced atomically)."""
    config = sdar_config(module.config, mask_id=mask_id, eos_id=eos_id, pad_id=eos_id)
    save_as(directory, module, SDAR, config, eos_id=eos_id, eot_id=eot_id)
