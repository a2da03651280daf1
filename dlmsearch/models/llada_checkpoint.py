"""Writing a native transformer as a LLaDA checkpoint directory (what the project's own text models ship as).

The directory is what an 8B LLaDA checkpoint holds, scaled down: ``config.json`` with every
field of LLaDA's ``ModelConfig`` and ``model_type: "llada"``, ``generation_config.json`` with
the EOS/EOT ids, and ``model.safetensors`` with LLaDA's parameter names (the inverse of
:data:`dlmsearch.models.families.LLADA`'s renames). It loads through ``model=llada
model.path=DIR`` like any other LLaDA checkpoint. LLaDA's modeling code is not shipped (it is
not ours to copy), so there is no ``auto_map``: ``model.impl=native`` is the way to load it.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import torch

from dlmsearch.models.families import LLADA, Family
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig

_GROUP = re.compile(r"\\(.)|\(([^()]*)\)|([^\\()])")  # in a checkpoint pattern: an escape, a group, a plain character
_BACKREF = re.compile(r"\\(\d+)")  # in a native replacement: a group of the checkpoint pattern


@functools.cache
def _inverse(renames: tuple[tuple[str, str], ...]) -> tuple[tuple[re.Pattern[str], tuple[str | int, ...]], ...]:
    """``renames`` (checkpoint pattern -> native replacement) turned around: per rule, a pattern on the
    native name whose named groups ``gN`` are the checkpoint pattern's groups, and the checkpoint
    name's pieces (literal text, or a group's number). Only plain patterns invert (escaped or plain
    characters and unnested groups); a rule whose replacement drops one of its groups is left out."""
    inverse = []
    for pattern, replacement in renames:
        pieces: list[str | int] = []
        groups: dict[int, str] = {}
        for escaped, group, plain in _GROUP.findall(pattern):
            if group:
                groups[len(groups) + 1] = group
                pieces.append(len(groups))
            elif not escaped and plain in ".^$*+?{}[]|":
                raise ValueError(f"the rename pattern {pattern!r} is not plain enough to turn around")
            else:
                pieces.append(escaped or plain)
        if {int(n) for n in _BACKREF.findall(replacement)} != set(groups):
            continue
        literal = _BACKREF.split(replacement)  # text, group number, text, ...
        native = "".join(
            re.escape(part) if i % 2 == 0 else f"(?P<g{part}>{groups[int(part)]})" for i, part in enumerate(literal)
        )
        inverse.append((re.compile(native), tuple(pieces)))
    return tuple(inverse)


def family_name(native: str, family: Family) -> str:
    """The checkpoint's name for a native parameter, by the family's renames turned around (the
    first rule that yields it, as the renames read it; checked: the renames map it back)."""
    for pattern, pieces in _inverse(family.renames):
        match = pattern.fullmatch(native)
        if match:
            name = "".join(piece if isinstance(piece, str) else match[f"g{piece}"] for piece in pieces)
            if family.native_name(name) != native:
                raise AssertionError(f"{native} -> {name} does not map back through the {family.name} family")
            return name
    raise ValueError(f"the {family.name} format has no place for the native parameter {native}")


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
    """Every field of LLaDA's ``ModelConfig``: what the family's reader reads, turned around
    (:meth:`~dlmsearch.models.families.ConfigReader.written`), then LLaDA-8B's choices for the rest."""
    if config.qkv_bias:
        raise ValueError("LLaDA checkpoints have no q/k/v bias")
    return {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        **LLADA.read_config.written(config),
        "vocab_size": config.vocab_size,  # the reader takes embedding_size (LLaDA's padded vocabulary) first
        "mlp_ratio": config.intermediate_size // config.hidden_size,
        "mlp_hidden_size": config.intermediate_size,
        "multi_query_attention": None,
        "alibi_bias_max": 8.0,
        "flash_attention": False,
        "attention_dropout": 0.0,
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "layer_norm_with_affine": True,
        "attention_layer_norm_with_affine": True,
        "train_max_sequence_length": config.max_length,
        "bias_for_layer_norm": False,
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


def save_as(
    directory: Path,
    module: BidirectionalTransformer,
    family: Family,
    config: dict[str, Any],
    *,
    eos_id: int,
    eot_id: int,
) -> None:
    """Write ``module`` (float32) with ``family``'s parameter names, ``config`` as ``config.json`` and the
    stop ids (EOS, EOT) as ``generation_config.json`` into ``directory`` (files replaced atomically).

    Args:
        directory: the checkpoint directory (created where missing).
        module: the native transformer whose ``state_dict`` is written.
        family: whose renames, turned around, name the parameters (:func:`family_name`).
        config: the family's ``config.json`` fields for ``module.config``.
        eos_id: the end-of-text id (also the pad id).
        eot_id: the end-of-turn id.
    """
    write_checkpoint(
        directory,
        {family_name(name, family): tensor for name, tensor in module.state_dict().items()},
        {
            "config.json": json.dumps(config, indent=2) + "\n",
            "generation_config.json": json.dumps({"eos_token_id": [eos_id, eot_id], "pad_token_id": eos_id}, indent=2)
            + "\n",
        },
    )


def save_llada(directory: Path, module: BidirectionalTransformer, *, mask_id: int, eos_id: int, eot_id: int) -> None:
    """Write ``module`` (float32) as a LLaDA checkpoint into ``directory`` (files replaced atomically)."""
    config = llada_config(module.config, mask_id=mask_id, eos_id=eos_id, pad_id=eos_id)
    save_as(directory, module, LLADA, config, eos_id=eos_id, eot_id=eot_id)
