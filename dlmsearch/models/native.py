"""Loading a LLaDA or Dream checkpoint directory into the native transformer.

Reads ``config.json`` and safetensors weights (one file, or shards listed in
``model.safetensors.index.json``), renames parameters through the family, and assigns them
without a random initialisation first (an 8B model never exists twice in memory).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dlmsearch.models.families import Family, UnsupportedCheckpoint, family_of
from dlmsearch.models.tensor_parallel import TensorParallel, read_slice, shard_model
from dlmsearch.models.transformer import BidirectionalTransformer

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # non-persistent buffers some exports keep


def read_config(directory: Path) -> dict[str, Any]:
    """``config.json`` of a model directory, failing with the directory's name."""
    if not directory.is_dir():
        raise FileNotFoundError(f"model.path={directory} is not a directory")
    path = directory / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"model.path={directory} has no config.json; point it at a local model directory")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint (sharded or not)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that are missing: {', '.join(missing)}")
        return [directory / s for s in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"model.path={directory} has no safetensors weights (model.safetensors or a sharded index)"
        )
    return files


def checkpoint_family(directory: Path, config: dict[str, Any], expected: str) -> Family:
    """The family of the checkpoint, which must be the one the user chose."""
    found = family_of(config, str(directory / "config.json"))
    if found.name != expected:
        raise UnsupportedCheckpoint(f"model.path={directory} holds a {found.name} checkpoint; use model={found.name}")
    return found


def load_native(
    directory: Path,
    config: dict[str, Any],
    family: Family,
    device: str,
    dtype: torch.dtype,
    tensor_parallel: TensorParallel | None = None,
) -> BidirectionalTransformer:
    """The checkpoint in ``directory`` (its ``config.json`` already read) as a native transformer;
    with ``tensor_parallel``, this rank's shard of it, reading only its slices of the weights
    (:mod:`~dlmsearch.models.tensor_parallel`).

    Args:
        directory: the checkpoint's directory.
        config: its ``config.json``.
        family: the checkpoint's family (names, config reader, regrouping).
        device: where the weights go.
        dtype: the weights' dtype.
        tensor_parallel: this rank's tensor-parallel group, or None (the whole model).
    """
    from safetensors import safe_open

    with torch.device("meta"):
        module = BidirectionalTransformer(family.read_config(config))
    whole = module.config
    shard_model(module, tensor_parallel)
    state: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    for file in weight_files(directory):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118  a safe_open handle is not iterable
                native = family.native_name(name)
                if native is None:
                    if not name.endswith(IGNORED_SUFFIXES):
                        unknown.append(name)
                    continue
                part = (
                    handle.get_tensor(name)
                    if tensor_parallel is None
                    else read_slice(native, handle.get_slice(name), whole, tensor_parallel)
                )
                if part is not None:
                    state[native] = part.to(device=device, dtype=dtype)
    if unknown:
        raise UnsupportedCheckpoint(
            f"{directory}: weights the native {family.name} model has no place for: {', '.join(unknown[:5])}"
        )
    if family.regroup is not None:
        state = family.regroup(state, module.config)
    expected = set(module.state_dict())
    missing = sorted(expected - set(state))
    if missing:
        raise UnsupportedCheckpoint(
            f"{directory}: the weights lack {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
        )
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as error:
        raise UnsupportedCheckpoint(
            f"{directory}: weights do not fit config.json: {str(error).splitlines()[-1].strip()}"
        ) from error
    return module.eval()
