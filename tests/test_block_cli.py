"""The rest of the path with block-diffusion checkpoints: the CLI on GSM8K prompts, the Python
API (the same tokens and counters as the CLI) and the lm-eval backend, with a tiny SDAR checkpoint
written by ``save_sdar`` (and the Countdown tokenizer, whose byte-level BPE encodes any text)
and, where the reference code is present, a tiny LLaDA2.0 MoE built by its own classes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from block_reference import TRANSFORMERS, missing_reason
from train_countdown import EOS_ID, EOT_ID, MASK_ID, VOCAB_SIZE, write_countdown_tokenizer

from dlmsearch.api import Decoder, Model
from dlmsearch.config import compose
from dlmsearch.models.sdar_checkpoint import save_sdar
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.run import run

SMALL = ["task=gsm8k", "task.limit=2", "task.gen_length=16", "model.device=cpu"]
COUNTERS = ("steps", "row_forwards", "token_forwards")
PROMPTS = ["What is 7 * 8?", "Tom has 3 apples and buys 4 more. How many apples does he have?"]


@pytest.fixture(scope="module")
def sdar_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_length=512,
        qk_norm=True,
        rope_in_float32=False,
        rms_norm_eps=1e-6,
        block_size=4,
    )
    model = BidirectionalTransformer(config)
    with torch.no_grad():
        model.head.weight.mul_(8.0)
    directory = tmp_path_factory.mktemp("sdar_cli") / "model"
    save_sdar(directory, model, mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
    write_countdown_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def llada2_dir(tmp_path_factory) -> Path:
    reason = missing_reason("llada2")
    if reason:
        pytest.skip(reason)
    scratch = tmp_path_factory.mktemp("llada2_cli")
    directory = scratch / "model"
    from conftest import TINY_LLADA2

    options = {
        **TINY_LLADA2,
        "vocab_size": VOCAB_SIZE,
        "mask_id": MASK_ID,
        "eos_id": EOS_ID,
        "max_position_embeddings": 512,
    }
    spec, answer = scratch / "spec.json", scratch / "answer.json"
    spec.write_text(json.dumps({"family": "llada2", "directory": str(directory), "build": options, "requests": []}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRANSFORMERS["llada2"]), str(Path(__file__).parent)])}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("block_reference.py")), str(spec), str(answer)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    write_countdown_tokenizer(directory)
    return directory


@pytest.mark.parametrize("family,preset", [("sdar", "sdar"), ("sdar", "adalook"), ("llada2", "llada2")])
def test_gsm8k_through_the_cli_and_the_api(request, family: str, preset: str, tmp_path: Path) -> None:
    directory = request.getfixturevalue(f"{family}_dir")
    out = tmp_path / "cli"
    summary = run(
        compose(
            [
                f"+decoder={preset}",
                f"model={family}",
                f"model.path={directory}",
                *SMALL,
                "cache=block",
                f"out_dir={out}",
                "trace=true",
            ]
        )
    )
    assert summary["items"] == 2 and summary["task"] == "gsm8k" and summary["accuracy"] is not None
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(isinstance(r["output"], str) and r["steps"] > 0 for r in records)

    model = Model.load(family, path=directory, device="cpu")
    assert model.adapter.capabilities.attention_block == (4 if family == "sdar" else 8)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    plain = tmp_path / "prompts"
    run(
        compose(
            [
                f"+decoder={preset}",
                f"model={family}",
                f"model.path={directory}",
                "model.device=cpu",
                "task=prompts",
                f"task.path={prompts}",
                "task.gen_length=16",
                "cache=block",
                f"out_dir={plain}",
            ]
        )
    )
    records = sorted(
        (json.loads(line) for line in (plain / "results.jsonl").read_text().splitlines()),
        key=lambda r: int(r["id"].rsplit(":", 1)[1]),
    )
    generations = Decoder.from_preset(preset).generate(model, PROMPTS, gen_length=16, cache="block")
    assert len(generations) == len(records) == 2
    for generation, record in zip(generations, records):
        assert generation.text == record["output"] and all(
            getattr(generation, key) == record[key] for key in COUNTERS
        ), (generation, record)


def test_the_lm_eval_backend_decodes_a_block_model(sdar_dir) -> None:
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (optional extra)")
    from lm_eval.api.instance import Instance

    from dlmsearch.lm_eval import DLMSearchLM

    lm = DLMSearchLM.create_from_arg_string(
        f"path={sdar_dir},family=sdar,decoder=sdar_greedy,gen_length=12,block_length=4,batch_size=2,device=cpu,cache=block",
        {},
    )
    contexts = ["What is 7 * 8?", "Add 3 and 4."]
    texts = lm.generate_until(
        [
            Instance(request_type="generate_until", doc={}, arguments=(c, {"until": []}), idx=i, metadata=("t", i, 1))
            for i, c in enumerate(contexts)
        ],
        disable_tqdm=True,
    )
    direct = Decoder.from_preset("sdar_greedy").generate(lm.model, contexts, gen_length=12, cache="block")
    assert texts == [g.text for g in direct]
