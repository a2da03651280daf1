"""Tensor parallelism (``model.tensor_parallel=2``) on CPU with gloo: tiny sharp checkpoints of every family
decoded by two torchrun processes give the tokens and counters one process gives (temperature 0 and
sampled with seeds, with and without caches), and logits within float32 rounding; the rank layout
of tensor- and data-parallel groups; and every refusal in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tp_worker import write_checkpoint

from dlmsearch.distributed import Ranks
from dlmsearch.models.tensor_parallel import (
    RankLayout,
    TensorParallel,
    check_shardable,
    rank_layout_from_environment,
    shard_model,
)
from dlmsearch.models.transformer import BidirectionalTransformer, MixtureOfExperts, TransformerConfig

WORKER = Path(__file__).with_name("tp_worker.py")
SAMPLED = "decoder.sampling.temperature=0.8"
CASES = {  # family: (decodes [preset, cache, overrides], gen, block)
    "llada": ([["llada", "none", []], ["llada", "prefix", []], ["llada", "dual", [SAMPLED]]], 16, 8),
    "dream": ([["dream", "none", []], ["dream", "none", [SAMPLED]]], 16, 16),
    "sdar": ([["sdar_greedy", "block", []], ["sdar", "none", []]], 12, 4),
    "llada2": ([["llada2", "none", []], ["llada2", "block", [SAMPLED]]], 16, 8),
    "diffusion_gemma": ([["diffusion_gemma", "none", ["decoder.commit.max_steps=3"]]], 16, 8),
    "diffusion_gemma_moe": ([["diffusion_gemma", "none", ["decoder.commit.max_steps=3"]]], 16, 8),
}


def launch(families: list[str], checkpoints: Path, processes: int, scratch: Path) -> dict:
    """The worker's results (family -> result) under torchrun with ``processes`` ranks and tensor_parallel
    = processes: every family in one launch (a launch costs seconds of start-up on its own)."""
    spec, out = scratch / f"spec{processes}.json", scratch / f"out{processes}.pt"
    specs = [
        {
            "family": family,
            "directory": str(checkpoints / family),
            "tensor_parallel": processes,
            "decodes": CASES[family][0],
            "gen": CASES[family][1],
            "block": CASES[family][2],
        }
        for family in families
    ]
    spec.write_text(json.dumps(specs))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
    with subprocess.Popen(
        [*command, "--standalone", str(WORKER), str(spec), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends the workers too, not only torchrun
    ) as run:
        try:
            _, stderr = run.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
            pytest.fail(f"{processes} ranks did not finish within 400 s")
    assert run.returncode == 0, stderr[-3000:]
    return torch.load(out)


def check_family(family: str, one: dict, two: dict) -> None:
    """Two ranks against one process for one family: logits, tokens, counters, traffic, memory."""
    difference = (one["logits"] - two["logits"]).abs().max().item()
    print(f"{family}: max |logit(TP=2) - logit(TP=1)| = {difference:.3g}")
    assert difference < 1e-4, family
    for alone, sharded in zip(one["decodes"], two["decodes"]):
        assert alone["tokens"] == sharded["tokens"], (family, alone["case"])
        assert alone["counters"] == sharded["counters"], (family, alone["case"])
    if not family.startswith("diffusion_gemma"):  # two all-reduces of [2 rows x 12 tokens x 32] float32 per layer
        assert two["bytes_per_forward"] == 2 * 2 * 2 * 12 * 32 * 4, family
    # a rank holds less than the whole model (DiffusionGemma's decoder shares its encoder's shards, not a copy)
    print(f"{family}: parameter bytes per rank {two['parameter_bytes']} of {one['parameter_bytes']}")
    assert two["parameter_bytes"] < one["parameter_bytes"], family


def test_two_ranks_decode_what_one_process_decodes(tmp_path: Path) -> None:
    """Every family (LLaDA, Dream, SDAR, LLaDA2, DiffusionGemma dense and MoE), one launch per world size."""
    families = list(CASES)
    for family in families:
        write_checkpoint(family, tmp_path / family)
    one, two = launch(families, tmp_path, 1, tmp_path), launch(families, tmp_path, 2, tmp_path)
    for family in families:
        check_family(family, one[family], two[family])


def test_tensor_and_data_parallel_ranks() -> None:
    """4 processes with tensor_parallel=2: groups {0, 1} and {2, 3} decode shards 0 and 1; TP rank 0 writes."""
    items = list(range(7))
    ranks = [Ranks(rank, 4, size=2, local_rank=rank) for rank in range(4)]
    assert [r.dp_rank for r in ranks] == [0, 0, 1, 1]
    assert [r.dp_world for r in ranks] == [2, 2, 2, 2]
    assert [r.shard(items) for r in ranks] == [[0, 2, 4, 6], [0, 2, 4, 6], [1, 3, 5], [1, 3, 5]]
    assert [r.writes for r in ranks] == [True, False, True, False]
    assert [r.results_name for r in ranks] == ["results.rank0.jsonl"] * 2 + ["results.rank1.jsonl"] * 2
    assert [RankLayout(r, 4, 2).group_ranks(g) for g in range(2) for r in (0,)] == [[0, 1], [2, 3]]
    only_tp = Ranks(1, 2, size=2, local_rank=1)
    assert (only_tp.results_name, only_tp.shard(items), only_tp.writes) == ("results.jsonl", items, False)
    assert Ranks(3, 4).shard(items) == [3]  # without tensor parallelism: as before


def _tiny(**changes) -> TransformerConfig:
    fields = {
        "vocab_size": 16,
        "hidden_size": 16,
        "num_layers": 1,
        "num_heads": 4,
        "num_kv_heads": 2,
        "intermediate_size": 32,
        "max_length": 32,
    }
    return TransformerConfig(**{**fields, **changes})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_tiny(num_heads=3, num_kv_heads=3, hidden_size=12), "attention heads"),
        (_tiny(intermediate_size=33), "MLP width"),
        (
            _tiny(moe=MixtureOfExperts(3, 1, 1, 1, 1.0, 8, 1, 0)),
            "routed experts",
        ),
    ],
)
def test_what_two_ranks_cannot_split_is_refused(config: TransformerConfig, message: str) -> None:
    with pytest.raises(ValueError, match=f"model.tensor_parallel=2 does not divide the {message}"):
        check_shardable(config, 2)


def test_key_value_heads_are_split_or_held_whole() -> None:
    """N divides the key/value heads (a share each) or is a multiple of them (one whole head per rank,
    the one its query heads read); anything else is refused."""
    heads = [TensorParallel(rank, 4).kv_span(2, 8) for rank in range(4)]
    assert heads == [(0, 8), (0, 8), (8, 16), (8, 16)]  # queries 0-1 and 2-3 of 8 read head 0, 4-7 head 1
    assert [TensorParallel(rank, 2).kv_span(4, 8) for rank in range(2)] == [(0, 16), (16, 32)]
    with pytest.raises(ValueError, match="neither divides nor is a multiple of the key/value heads"):
        check_shardable(_tiny(num_heads=6, num_kv_heads=3, hidden_size=12), 2)


def test_launch_errors_are_one_line(monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="needs torchrun"):
        rank_layout_from_environment(2)
    with pytest.raises(ValueError, match="does not divide the 3 torchrun processes"):
        RankLayout(0, 3, 2)
    with pytest.raises(ValueError, match="positive integer"):
        RankLayout(0, 2, 0)


def test_remote_compile_and_layerwise_are_refused(monkeypatch, tmp_path: Path) -> None:
    """The remote code at load; engine.compile and a layerwise cache on a sharded model by the plan (its rules
    14 and 15, the capabilities naming the shard), once before any forward (issue 47, defect 7)."""
    from dlmsearch.config import build, compose
    from dlmsearch.models.adapter import ModelAdapter
    from dlmsearch.models.loading import load_text_model
    from dlmsearch.search.engine.rollout import RolloutEngine

    directory = write_checkpoint("llada", tmp_path / "llada")
    with pytest.raises(ValueError, match="model.impl=remote runs the checkpoint's own code"):
        load_text_model(str(directory), "llada", impl="remote", tensor_parallel=2)
    model = shard_model(BidirectionalTransformer(_tiny()), TensorParallel(0, 2, None, lambda t: t))
    assert model.config.num_heads == 2 and model.blocks[0].q_proj.weight.shape == (8, 16)
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    adapter = ModelAdapter(module=model, mask_id=15, vocab_size=16)
    assert adapter.capabilities.tensor_parallel == 2
    decoder = build(compose(["+decoder=llada", "decoding=text", "task.gen_length=8"]), "decoder")
    with pytest.raises(ValueError, match="engine.compile=true with model.tensor_parallel=2"):
        decoder.plan(RolloutEngine(adapter=adapter, compile=True), 8, 8)
    with pytest.raises(ValueError, match="cache=dllm_cache chooses what to recompute per layer"):
        decoder.plan(RolloutEngine(adapter=adapter, cache="dllm_cache"), 8, 8)
    assert forwards == []
