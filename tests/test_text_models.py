"""LLaDA and Dream: native models match the families' own code, padding is exact, checkpoints
load (sharded too), and bad checkpoints fail with one line.

Tiny random checkpoints are built once per session from the upstream modeling code in
``../shared/upstream/fast-dllm`` with the real vocabularies and special ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_checkpoints import requires_upstream, upstream_logits

from dlmsearch.models.families import UnsupportedCheckpoint
from dlmsearch.models.loading import load_text_model

pytestmark = requires_upstream

FAMILIES = ["llada", "dream"]


def max_difference(ours: torch.Tensor, theirs: torch.Tensor, mask_id: int) -> float:
    """Largest logit difference, the mask column aside (the test models push it to about -1e5 on
    purpose, where float32 spacing alone is 1e-2)."""
    keep = torch.ones(ours.shape[-1], dtype=torch.bool)
    keep[mask_id] = False
    return (ours[..., keep] - theirs[..., keep]).abs().max().item()


def native(checkpoints, family: str, directory: Path | None = None):
    spec = checkpoints[family]
    return load_text_model(
        str(directory or spec.directory),
        family,
        spec.mask_id,
        spec.vocab_size,
        spec.stop_ids,
        device="cpu",
        dtype="float32",
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_native_logits_match_upstream(checkpoints, family: str) -> None:
    spec = checkpoints[family]
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (2, 24), generator=generator)
    ids[:, 16:] = spec.mask_id
    ours = native(checkpoints, family).module(ids)
    theirs = upstream_logits(spec.upstream, ids)
    assert max_difference(ours, theirs, spec.mask_id) <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padding_is_exact(checkpoints, family: str) -> None:
    """A left-padded row gets the logits the upstream model gives the same row alone."""
    spec = checkpoints[family]
    generator = torch.Generator().manual_seed(2)
    long, short = torch.randint(0, 1000, (20,), generator=generator), torch.randint(0, 1000, (13,), generator=generator)
    batch = torch.full((2, 20), spec.stop_ids[0])
    batch[0], batch[1, 7:] = long, short
    attention = torch.ones(2, 20, dtype=torch.bool)
    attention[1, :7] = False
    ours = native(checkpoints, family).module(batch, attention)
    alone = upstream_logits(spec.upstream, short[None])
    assert max_difference(ours[1, 7:], alone[0], spec.mask_id) <= 1e-4
    assert max_difference(ours[0], upstream_logits(spec.upstream, long[None])[0], spec.mask_id) <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_checkpoint_loads_the_same_weights(checkpoints, family: str) -> None:
    spec = checkpoints[family]
    ids = torch.randint(0, 1000, (1, 12))
    assert torch.equal(native(checkpoints, family, spec.sharded).module(ids), native(checkpoints, family).module(ids))
    assert (spec.sharded / "model.safetensors.index.json").is_file()


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_carries_the_family_conventions(checkpoints, family: str) -> None:
    adapter = native(checkpoints, family)
    assert adapter.shift_logits == (family == "dream")
    assert adapter.honours_padding and adapter.device == "cpu" and adapter.dtype == "float32"
    assert adapter.max_length == 512


def copy_checkpoint(source: Path, target: Path, drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*drop))
    return target


def test_bad_checkpoints_fail_with_one_line(checkpoints, tmp_path: Path) -> None:
    spec = checkpoints["llada"]
    ids = (spec.mask_id, spec.vocab_size, spec.stop_ids)
    without_config = copy_checkpoint(spec.directory, tmp_path / "a", drop=("config.json",))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_text_model(str(without_config), "llada", *ids, device="cpu")
    without_weights = copy_checkpoint(spec.directory, tmp_path / "b", drop=("*.safetensors",))
    with pytest.raises(FileNotFoundError, match="has no safetensors weights"):
        load_text_model(str(without_weights), "llada", *ids, device="cpu")
    other = copy_checkpoint(spec.directory, tmp_path / "c")
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(
        UnsupportedCheckpoint,
        match="model_type='bert'.* is not a supported family; supported model_type values: llada, Dream, dream, sdar",
    ):
        load_text_model(str(other), "llada", *ids, device="cpu")
    with pytest.raises(UnsupportedCheckpoint, match="holds a llada checkpoint; use model=llada"):
        load_text_model(str(spec.directory), "dream", *ids, device="cpu")
    with pytest.raises(ValueError, match="mask_token_id=126336"):
        load_text_model(str(spec.directory), "llada", 5, spec.vocab_size, spec.stop_ids, device="cpu")
    unsupported = copy_checkpoint(spec.directory, tmp_path / "d")
    (unsupported / "config.json").write_text(json.dumps({**config, "block_type": "sequential"}))
    with pytest.raises(UnsupportedCheckpoint, match="block_type='sequential'"):
        load_text_model(str(unsupported), "llada", *ids, device="cpu")


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_runs_and_agrees_with_float32(checkpoints, family: str) -> None:
    spec = checkpoints[family]
    half = load_text_model(
        str(spec.directory), family, spec.mask_id, spec.vocab_size, spec.stop_ids, device="cpu", dtype="bfloat16"
    )
    assert next(half.module.parameters()).dtype == torch.bfloat16
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(3))
    ids[:, 16:] = spec.mask_id
    attention = torch.ones_like(ids, dtype=torch.bool)
    low, full = half.logits(ids, attention, 16), native(checkpoints, family).logits(ids, attention, 16)
    assert torch.isfinite(low).all() and low.dtype == torch.float32
    assert (low.argmax(-1) == full.argmax(-1)).float().mean() >= 0.75


def test_remote_code_failure_is_one_clear_line(checkpoints) -> None:
    spec = checkpoints["llada"]
    with pytest.raises(
        RuntimeError, match="could not load the remote code .*the default model.impl=native does not need it"
    ):
        load_text_model(
            str(spec.directory), "llada", spec.mask_id, spec.vocab_size, spec.stop_ids, impl="remote", device="cpu"
        )
