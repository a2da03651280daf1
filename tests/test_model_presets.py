"""``model=llada`` / ``model=dream`` take their token ids from the checkpoint directory.

The mask id, vocabulary size and stop ids come from the directory's ``config.json``,
``generation_config.json`` and tokenizer files; the presets' ``fallback_ids`` only where the
directory names none; an explicit id that disagrees with the directory fails with one line
naming both. ``model=llada model.path=<the shipped Countdown model>`` decodes exactly as
``model=countdown``. The tiny checkpoints are written here (native transformer, LLaDA's format
through :func:`dlmsearch.models.llada_checkpoint.save_llada`); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dlmsearch.api import Decoder, Model
from dlmsearch.config import ConfigError, build, compose
from dlmsearch.models.llada_checkpoint import save_llada
from dlmsearch.models.loading import checkpoint_ids, load_text_model
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.run import run
from dlmsearch.run_records import TIMING_FIELDS
from dlmsearch.tasks.countdown import load_countdown, shipped_countdown_path

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
SHIPPED = Path(compose(["model=countdown"]).model.path)
TEMPLATE = compose(["model=countdown", "task=countdown"]).task.template
LLADA_FALLBACK = (126336, 126464, [126081, 126348])
DREAM_FALLBACK = (151666, 152064, [151643, 151645])


def tiny_llada(
    directory: Path, *, vocab_size: int = 64, mask_id: int = 60, eos_id: int = 61, eot_id: int = 62, hidden: int = 16
) -> Path:
    """A random one-layer native transformer written as a LLaDA checkpoint (config.json names
    ``mask_id``, ``eos_id`` and ``vocab_size``; generation_config.json ``[eos_id, eot_id]``)."""
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        intermediate_size=2 * hidden,
        max_length=64,
    )
    save_llada(directory, BidirectionalTransformer(config).eval(), mask_id=mask_id, eos_id=eos_id, eot_id=eot_id)
    return directory


def edit_json(path: Path, drop: tuple[str, ...] = (), **values: Any) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    for key in drop:
        data.pop(key, None)
    path.write_text(json.dumps({**data, **values}))


def ids_of(cfg) -> tuple[int, int, list[int]]:
    return cfg.mask_id, cfg.vocab_size, list(cfg.stop_ids)


def adapter_ids(adapter) -> tuple[int, int, list[int]]:
    return adapter.mask_id, adapter.vocab_size, list(adapter.stop_ids)


def load(family: str, directory: Path, *overrides: str):
    cfg = compose([f"model={family}", f"model.path={directory}", "model.device=cpu", *overrides])
    return cfg, build(cfg, "model")


# ---------------------------------------------------------------------------------------------
# The shipped Countdown model through model=llada
# ---------------------------------------------------------------------------------------------


def test_llada_preset_reads_the_shipped_countdown_ids() -> None:
    llada = compose(["model=llada", f"model.path={SHIPPED}", "task=countdown"])
    countdown = compose(["model=countdown", "task=countdown"])
    assert ids_of(llada.model) == ids_of(countdown.model) == (1402, 1408, [1401, 1405])
    assert (llada.task.mask_id, llada.task.vocab_size, list(llada.task.stop_ids)) == (1402, 1408, [1401, 1405])


def test_llada_preset_on_the_shipped_model_decodes_as_model_countdown() -> None:
    """Tokens and every counter agree, item by item (fast_dllm: thresholds and a schedule)."""
    problems = [p for _, p in load_countdown(shipped_countdown_path("small"))][:4]
    prompts = [TEMPLATE.format(target=p.target, numbers=", ".join(map(str, p.numbers))) for p in problems]
    by_llada = Model.load("llada", path=SHIPPED, device="cpu")
    by_countdown = Model.load("countdown", device="cpu")
    fields = (
        "mask_id",
        "vocab_size",
        "stop_ids",
        "shift_logits",
        "max_length",
        "generation_defaults",
        "suppressed_ids",
        "deferred_ids",
    )
    assert {f: getattr(by_llada.adapter, f) for f in fields} == {f: getattr(by_countdown.adapter, f) for f in fields}
    decoder = Decoder.from_preset("fast_dllm")
    ours, theirs = (
        decoder.generate(m, prompts, gen_length=16, block_length=8, batch_size=4) for m in (by_llada, by_countdown)
    )
    for a, b in zip(ours, theirs):
        assert torch.equal(a.tokens, b.tokens)
        assert (a.text, a.steps, a.row_forwards, a.token_forwards, a.tokens_committed) == (
            b.text,
            b.steps,
            b.row_forwards,
            b.token_forwards,
            b.tokens_committed,
        )


def test_llada_preset_runs_the_countdown_task_as_model_countdown(tmp_path: Path) -> None:
    """What ``python -m dlmsearch`` does: the same records (output, judge, counters), with the
    prompt format, lengths and tier that the directory declares (trained_on.json; issue 36, item 7)."""
    common = ["+decoder=fast_dllm", "model.device=cpu", "task=countdown", "task.limit=4"]
    run(compose([*common, "model=llada", f"model.path={SHIPPED}", f"out_dir={tmp_path / 'llada'}"]))
    run(compose([*common, "model=countdown", f"out_dir={tmp_path / 'countdown'}"]))
    records = {}
    for name in ("llada", "countdown"):
        lines = (tmp_path / name / "results.jsonl").read_text().splitlines()
        records[name] = [{k: v for k, v in json.loads(line).items() if k not in TIMING_FIELDS} for line in lines]
    assert len(records["llada"]) == 4 and records["llada"] == records["countdown"]


def test_a_directory_declares_what_it_was_trained_on(tmp_path: Path) -> None:
    """The task's unset lengths, template and tier come from the directory's trained_on.json; a
    directory without one leaves the task's defaults, and a canvas that cannot fit names the setting."""
    declared = compose(["model=llada", f"model.path={SHIPPED}", "task=countdown"]).task
    assert (declared.gen_length, declared.block_length, declared.tier, declared.template) == (16, 8, "small", TEMPLATE)
    assert compose(["model=llada", f"model.path={SHIPPED}", "task=countdown", "task.gen_length=8"]).task.gen_length == 8
    bare = tmp_path / "bare"
    shutil.copytree(SHIPPED, bare, ignore=shutil.ignore_patterns("trained_on.json"))
    plain = compose(["model=llada", f"model.path={bare}", "task=countdown", f"task.template='{TEMPLATE}'"])
    assert (plain.task.gen_length, plain.task.block_length, plain.task.tier) == (256, 32, "d1")
    with pytest.raises(
        ValueError,
        match=r"\(prompt 24 \+ generation 256\) is 280 tokens, .*; use `task.gen_length=96` \(gen_length= in the Python API\)",
    ):
        run(compose([*plain_overrides(bare), f"task.template='{TEMPLATE}'", "task.tier=small", f"out_dir={tmp_path}"]))


def plain_overrides(directory: Path) -> list[str]:
    return ["+decoder=llada", "model=llada", f"model.path={directory}", "model.device=cpu", "task=countdown"]


def test_a_block_model_decodes_with_its_exact_cache_by_default() -> None:
    """cache=auto: the block cache for a block-diffusion model, none for a full-attention one."""
    for model, cache in (("countdown_block", "block"), ("countdown", "none")):
        cfg = compose(["+decoder=sdar_greedy", f"model={model}", "model.device=cpu", "task=countdown"])
        assert build(cfg, "engine", adapter=build(cfg, "model")).cache.name == cache


def test_plain_compose_resolves_the_checkpoint_ids() -> None:
    """A fresh process that imports only ``dlmsearch.config`` (as ``python -m dlmsearch`` does)
    can resolve ``${checkpoint:...}``: the resolver is registered there, not only by the loader."""
    code = (
        "from dlmsearch.config import compose; "
        f"cfg = compose(['model=llada', 'model.path={SHIPPED}', 'task=countdown']); "
        "print(cfg.task.mask_id, cfg.task.vocab_size, list(cfg.task.stop_ids))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1402", "1408", "[1401,", "1405]"]


@pytest.mark.slow
def test_cli_llada_preset_on_the_shipped_model(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "dlmsearch",
        "+decoder=fast_dllm",
        "model=llada",
        f"model.path={SHIPPED}",
        "task=countdown",
        "task.limit=2",
        f"out_dir={tmp_path}",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["errors"] == 0


# ---------------------------------------------------------------------------------------------
# Tiny checkpoints: ids named, ids not named, conflicts
# ---------------------------------------------------------------------------------------------


def test_a_checkpoint_naming_other_ids_loads_with_them(tmp_path: Path) -> None:
    directory = tiny_llada(tmp_path / "model")
    cfg, adapter = load("llada", directory)
    assert ids_of(cfg.model) == adapter_ids(adapter) == (60, 64, [61, 62])
    assert adapter_ids(load_text_model(str(directory), "llada", device="cpu")) == (
        60,
        64,
        [61, 62],
    )  # Python callers may leave them out
    # agreeing explicit values are fine; a stop list may add ids to the checkpoint's EOS ids
    assert adapter_ids(
        load("llada", directory, "model.mask_id=60", "model.vocab_size=64", "model.stop_ids=[61,62,7]")[1]
    ) == (60, 64, [61, 62, 7])


def test_ids_named_only_by_the_tokenizer(tmp_path: Path) -> None:
    """config.json and generation_config.json silent: the tokenizer's mask/EOS tokens and the
    family's end tokens (LLaDA <|mdm_mask|>, <|endoftext|>, <|eot_id|>) name them."""
    directory = tiny_llada(tmp_path / "model")
    edit_json(directory / "config.json", drop=("mask_token_id", "eos_token_id", "pad_token_id"))
    (directory / "generation_config.json").unlink()
    added = [
        {"id": i, "content": name, "special": True}
        for i, name in ((57, "<|mdm_mask|>"), (58, "<|endoftext|>"), (59, "<|eot_id|>"))
    ]
    edit_json(directory / "tokenizer.json", added_tokens=added)
    assert ids_of(load("llada", directory)[0].model) == adapter_ids(load("llada", directory)[1]) == (57, 64, [58, 59])
    # the tokenizer config's own mask_token / eos_token come first
    edit_json(
        directory / "tokenizer_config.json",
        mask_token="<|x|>",
        eos_token={"content": "<|y|>"},
        added_tokens_decoder={"40": {"content": "<|x|>"}, "41": {"content": "<|y|>"}},
    )
    assert adapter_ids(load("llada", directory)[1]) == (40, 64, [41, 58, 59])


def test_a_checkpoint_naming_none_falls_back_to_the_preset(tmp_path: Path) -> None:
    directory = tiny_llada(tmp_path / "model", vocab_size=LLADA_FALLBACK[1], mask_id=0, eos_id=1, eot_id=2, hidden=8)
    edit_json(
        directory / "config.json", drop=("mask_token_id", "eos_token_id", "pad_token_id", "vocab_size")
    )  # embedding_size stays
    (directory / "generation_config.json").unlink()
    assert checkpoint_ids(directory, "llada").value("mask_id") is None
    cfg, adapter = load("llada", directory)
    assert ids_of(cfg.model) == adapter_ids(adapter) == LLADA_FALLBACK
    assert ids_of(compose(["model=llada"]).model) == LLADA_FALLBACK  # no directory yet: the fallback shows
    with pytest.raises(ValueError, match="model.mask_id is not set and .* names none"):
        load_text_model(str(directory), "llada", device="cpu")  # no fallback given


def test_dream_preset_reads_the_directory_too(tmp_path: Path) -> None:
    """Dream's ids, from config files only (the preset's ids resolve before any weights are read)."""
    named, silent = tmp_path / "named", tmp_path / "silent"
    for directory in (named, silent):
        directory.mkdir()
        edit_json(directory / "config.json", model_type="Dream", architectures=["DreamModel"])
    edit_json(named / "config.json", mask_token_id=50, vocab_size=64, eos_token_id=51)
    edit_json(
        named / "generation_config.json", eos_token_id=51, mask_token_id=None
    )  # Dream's generation_config has mask_token_id: null
    edit_json(
        named / "tokenizer_config.json",
        added_tokens_decoder={"51": {"content": "<|endoftext|>"}, "52": {"content": "<|im_end|>"}},
    )
    assert ids_of(compose(["model=dream", f"model.path={named}"]).model) == (50, 64, [51, 52])
    assert ids_of(compose(["model=dream", f"model.path={silent}"]).model) == DREAM_FALLBACK
    edit_json(silent / "tokenizer_config.json", added_tokens_decoder={"60": {"content": "<|mask|>"}})
    assert compose(["model=dream", f"model.path={silent}"]).model.mask_id == 60


@pytest.mark.parametrize(
    "override, expected",
    [
        ("model.mask_id=126336", ["model.mask_id=126336", "config.json says mask_token_id=60"]),
        ("model.vocab_size=100", ["model.vocab_size=100", "config.json says vocab_size=64"]),
        ("model.stop_ids=[62]", ["model.stop_ids=[62] lacks [61]", "eos_token_id=61", "[61, 62]"]),
    ],
)
def test_an_explicit_conflicting_override_fails_with_one_line(
    tmp_path: Path, override: str, expected: list[str]
) -> None:
    directory = tiny_llada(tmp_path / "model")
    with pytest.raises(ConfigError) as caught:
        load("llada", directory, override)
    message = str(caught.value)
    assert "\n" not in message and all(part in message for part in expected), message
    key = override.split("=")[0]
    assert f"leave {key} unset" in message


def test_a_broken_id_in_the_checkpoint_fails_with_one_line(tmp_path: Path) -> None:
    directory = tiny_llada(tmp_path / "model")
    edit_json(directory / "generation_config.json", eos_token_id=["61"])
    with pytest.raises(ValueError, match=r"generation_config.json: eos_token_id must be a token id .*'61'"):
        load_text_model(str(directory), "llada", device="cpu")
