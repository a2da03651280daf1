"""Block-diffusion models (SDAR's architecture) through the one engine, without the reference code:
every decoder gives each prompt of a mixed-length batch what it gets alone, the exact block cache
gives the tokens a full forward gives, and each thing a block model cannot do fails in one line."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from conftest import NoRepeatVerifier, admit_step_evict, plan_on, text_decoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlmsearch.config import decoder_presets
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.families import UnsupportedCheckpoint
from dlmsearch.models.loading import load_text_model
from dlmsearch.models.sdar_checkpoint import save_sdar
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.cache_policy import BlockCache
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.state import aligned_generation_length, block_aligned

VOCAB, MASK_ID, EOS, EOT, GEN, BLOCK = 64, 63, 61, 62, 12, 4


def tiny_sdar(seed: int = 0) -> BidirectionalTransformer:
    """A random model in SDAR's architecture (q/k norm, GQA, head_dim apart from hidden / heads,
    block-causal over blocks of 4), its head and q/k norms scaled so that confidences spread."""
    torch.manual_seed(seed)
    config = TransformerConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=12,
        intermediate_size=64,
        max_length=128,
        rope_theta=1e4,
        rms_norm_eps=1e-6,
        qk_norm=True,
        rope_in_float32=False,
        block_size=BLOCK,
    )
    model = BidirectionalTransformer(config)
    with torch.no_grad():
        model.head.weight.mul_(8.0)
        model.head.weight[MASK_ID] = 0.0
        for block in model.blocks:
            block.q_norm.weight.mul_(3.0)
            block.k_norm.weight.mul_(3.0)
    return model.eval()


@pytest.fixture(scope="module")
def sdar_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("sdar") / "tiny"
    save_sdar(directory, tiny_sdar(), mask_id=MASK_ID, eos_id=EOS, eot_id=EOT)
    return directory


@pytest.fixture(scope="module")
def adapter(sdar_dir) -> ModelAdapter:
    return load_text_model(str(sdar_dir), "sdar", device="cpu", dtype="float32")


@functools.cache
def decoder_for(preset: str):
    return text_decoder(preset, f"task.block_length={BLOCK}", gen_length=GEN)


def requests_for(lengths: list[int], seed: int) -> list[DecodeRequest]:
    generator = torch.Generator().manual_seed(seed)
    return [
        DecodeRequest(
            uid=uid, prompt=torch.randint(0, EOS, (n,), generator=generator), generation=torch.full((GEN,), MASK_ID)
        )
        for uid, n in enumerate(lengths)
    ]


def refusal(engine: RolloutEngine, preset: str) -> str | None:
    """The one error a preset gives on a block-diffusion model (None: it runs)."""
    if preset == "wino":  # its shadow block first: no block length would let it run here
        return "needs a model that takes an explicit attention mask"
    if preset == "dream":  # one block of the whole generation
        return "decodes blocks of 12, but this block-diffusion model attends in blocks of 4"
    if preset == "klass" and engine.cache.stores:
        return "needs cache=none"
    if preset == "saber" and engine.cache.stores:
        return "re-reads every committed position"
    if preset in ("daedal", "rho_eos"):  # a length that changes: its blocks are fixed in the canvas
        return "block-diffusion model's blocks are fixed in the canvas"
    return None


def test_the_checkpoint_loads_as_sdar_with_its_block(adapter) -> None:
    able = adapter.capabilities
    assert (able.attention_block, able.cache_policies, able.shadow, able.mask_id, able.stop_ids) == (
        BLOCK,
        ("none", "block"),
        False,
        MASK_ID,
        (EOS, EOT),
    )


def test_a_block_aligned_request_keeps_prompt_tokens_in_place() -> None:
    head, template, region = block_aligned(torch.arange(6), torch.full((5,), MASK_ID), BLOCK, MASK_ID)
    assert head.tolist() == [0, 1, 2, 3] and region == (2, 8)  # positions 4, 5 lead the first decoded block
    assert template.tolist() == [4, 5] + [MASK_ID] * 6 and len(template) == aligned_generation_length(5, BLOCK) == 8
    head, template, region = block_aligned(torch.arange(8), torch.full((4,), MASK_ID), BLOCK, MASK_ID)
    assert head.tolist() == list(range(8)) and region == (
        0,
        4,
    )  # whole prompt blocks: the longest region needs one block more
    assert template.tolist() == [MASK_ID] * 4 + [-1] * 4


@pytest.mark.parametrize("cache", ["none", "block", "block_fused"])
@pytest.mark.parametrize("preset", decoder_presets("mask"))
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 11), min_size=2, max_size=4), seed=st.integers(0, 1000))
def test_every_decoder_is_batch_invariant_on_a_block_model(
    adapter, preset: str, cache: str, lengths: list[int], seed: int
) -> None:
    """Prompts of different lengths align to blocks differently; each gets what it gets alone
    (lookahead branches and particles forward their block against the shared exact prefix)."""
    policy = BlockCache(fuse_write=True) if cache == "block_fused" else cache
    engine = RolloutEngine(adapter=adapter, row_budget=3, cache=policy)
    decoder, verifier, requests = decoder_for(preset), NoRepeatVerifier(), requests_for(lengths, seed)
    refused = refusal(engine, preset)
    if refused is not None:
        with pytest.raises(ValueError, match=refused):
            decoder.decode(engine, requests, BLOCK, verifier=verifier)
        return
    batched = decoder.decode(engine, requests, BLOCK, verifier=verifier)
    for request, together in zip(requests, batched):
        [alone] = decoder.decode(engine, [request], BLOCK, verifier=verifier)
        assert torch.equal(together.tokens, alone.tokens), f"{preset}: prompt of length {len(request.prompt)}"
        assert (together.steps, together.row_forwards, together.token_forwards) == (
            alone.steps,
            alone.row_forwards,
            alone.token_forwards,
        )
        assert len(together.tokens) == -(-(len(request.prompt) + GEN) // BLOCK) * BLOCK - len(
            request.prompt
        )  # to the end of its last block


@pytest.mark.parametrize(
    "preset",
    [
        "sdar_greedy",
        "sdar",
        "fast_dllm",
        "adalook",
        "fixed_depth",
        "beam",
        "best_of_n",
        "smc",
        "rcr",
        "remdm",
        "eb_sampler",
        "klass",
    ],
)
def test_the_block_cache_is_exact(adapter, preset: str) -> None:
    """At temperature 0 the exact cache changes no token (with lookahead, populations and revisions
    too), and computes fewer positions per row (cached rows are not merged where particles hold the
    same canvas, as full forwards are, so a population may forward more rows)."""
    requests = requests_for([3, 9, 6, 4], seed=5)
    decoder = decoder_for(preset)
    if preset == "klass":  # compares whole distributions step to step: refused with any store
        with pytest.raises(ValueError, match="needs cache=none"):
            decoder.decode(RolloutEngine(adapter=adapter, cache="block"), requests, BLOCK)
        return
    full = decoder.decode(RolloutEngine(adapter=adapter), requests, BLOCK, verifier=NoRepeatVerifier())
    sampled = (
        decoder.sampling.temperature or decoder.population.size > 1
    )  # draws are keyed by the call: separate writes shift them
    for policy in [BlockCache(fuse_write=True)] + ([] if sampled else [BlockCache()]):
        cached = decoder.decode(
            RolloutEngine(adapter=adapter, cache=policy), requests, BLOCK, verifier=NoRepeatVerifier()
        )
        for a, b in zip(full, cached):
            assert torch.equal(a.tokens, b.tokens), (preset, policy)
            assert b.token_forwards / b.row_forwards < a.token_forwards / a.row_forwards


def test_a_lookahead_branch_forwards_only_its_block(adapter) -> None:
    """K = 4 lookahead against the block cache: every branch row costs at most its block (and a
    finished block it completed), never the prompt again."""
    requests = requests_for([9], seed=1)
    plain = decoder_for("fast_dllm").decode(RolloutEngine(adapter=adapter, cache="block"), requests, BLOCK)[0]
    look = decoder_for("fixed_depth").decode(RolloutEngine(adapter=adapter, cache="block"), requests, BLOCK)[0]
    extra_rows = look.row_forwards - look.steps  # rows beyond one per call: the branches
    assert extra_rows > 0
    assert look.token_forwards - plain.token_forwards <= (look.row_forwards - plain.row_forwards) * 2 * BLOCK


def test_bad_inputs_fail_in_one_line(sdar_dir, adapter, tmp_path) -> None:
    with pytest.raises(ValueError, match="use `cache=block`"):
        plan_on(RolloutEngine(adapter=adapter, cache="prefix"))
    from conftest import cached_adapter

    with pytest.raises(ValueError, match="cache=block is the exact cache of block-diffusion models"):
        plan_on(RolloutEngine(adapter=cached_adapter(), cache="block"))
    with pytest.raises(ValueError, match="model.block_length=8 but .* has block_size=4"):
        load_text_model(str(sdar_dir), "sdar", block_length=8, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="decodes with its native transformer only"):
        load_text_model(str(sdar_dir), "sdar", impl="remote", device="cpu", dtype="float32")
    with pytest.raises(UnsupportedCheckpoint, match="holds a sdar checkpoint; use model=sdar"):
        load_text_model(str(sdar_dir), "llada", device="cpu", dtype="float32")
    engine = RolloutEngine(adapter=adapter, cache="block")
    long_prompt = DecodeRequest(
        uid=0, prompt=torch.zeros(118, dtype=torch.long), generation=torch.full((GEN,), MASK_ID)
    )
    with pytest.raises(
        ValueError, match=r"prompt 118 \+ generation 12\) is 132 tokens, longer than the model's maximum length of 128"
    ):
        decoder_for("sdar").decode(engine, [long_prompt], BLOCK)


def test_a_checkpoint_the_native_model_cannot_represent_fails_with_the_key(tmp_path) -> None:
    import json

    from dlmsearch.models.families import family_of

    base = {
        "model_type": "llada2_moe",
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "use_bias": False,
        "use_qkv_bias": False,
        "use_qk_norm": True,
        "norm_head": False,
    }
    with pytest.raises(UnsupportedCheckpoint, match="num_experts=8 but no n_group, topk_group"):
        family_of(base, "x").read_config(
            {**base, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
        )
    with pytest.raises(UnsupportedCheckpoint, match="has use_bias=True"):
        family_of(base, "x").read_config({**base, "use_bias": True})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(
        UnsupportedCheckpoint,
        match="model_type='mamba'.*supported model_type values: llada, Dream, dream, sdar, llada2_moe",
    ):
        load_text_model(str(tmp_path), "sdar", mask_id=1, vocab_size=8, stop_ids=[2], device="cpu", dtype="float32")


@pytest.mark.parametrize(
    "preset,cache", [("sdar", "block"), ("adalook", "block_fused"), ("llada21", "block"), ("smc", "block")]
)
def test_a_session_admits_and_evicts_block_aligned_samples(adapter, preset: str, cache: str) -> None:
    """Continuous batching over block-aligned canvases: a longer prompt joins (the canvases and the
    stored keys and values widen), a sample leaves; everyone else decodes what it decodes alone."""
    from dlmsearch.search.session import DecodeSession

    policy = BlockCache(fuse_write=True) if cache == "block_fused" else cache
    engine = RolloutEngine(adapter=adapter, cache=policy, row_budget=256)
    decoder, verifier = decoder_for(preset), NoRepeatVerifier()
    session = DecodeSession.open(decoder, engine, GEN, BLOCK, verifier)
    first = requests_for([3, 6, 5], seed=1)
    later = [
        DecodeRequest(uid=100 + r.uid, prompt=r.prompt, generation=r.generation) for r in requests_for([11, 2], seed=2)
    ]
    finished, victim = admit_step_evict(session, first, later)
    for request in [r for r in first + later if r.uid != victim]:
        [alone] = decoder.decode(RolloutEngine(adapter=adapter, cache=policy), [request], BLOCK, verifier=verifier)
        got = finished[request.uid]
        assert torch.equal(got.tokens, alone.tokens) and (got.steps, got.row_forwards, got.token_forwards) == (
            alone.steps,
            alone.row_forwards,
            alone.token_forwards,
        )


def test_a_canvas_at_the_ceiling_costs_only_the_blocks_decoded_up_to_the_end(tmp_path) -> None:
    """A block model's growth by whole blocks (what the length policies' refusal advises): stopping at the
    end token, a canvas of 32 gives each sample whose answer ends within 8 the tokens and the forwards of a
    canvas of 8, the block cache's stored prefix never moving (id 20, frequent here, is the end token)."""
    save_sdar(tmp_path / "tiny", tiny_sdar(), mask_id=MASK_ID, eos_id=20, eot_id=EOT)
    ends = load_text_model(str(tmp_path / "tiny"), "sdar", device="cpu", dtype="float32")
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, EOS, (n,), generator=generator) for n in (3, 5, 7, 4, 6, 2)]

    def run(gen: int) -> list[tuple]:
        decoder = text_decoder("sdar", f"task.block_length={BLOCK}", "decoder.stop_at_eos=true", gen_length=gen)
        batch = [DecodeRequest(uid=i, prompt=p, generation=torch.full((gen,), MASK_ID)) for i, p in enumerate(prompts)]
        results = decoder.decode(RolloutEngine(adapter=ends, cache="block", temperature=0.0), batch, BLOCK)
        return [(r.tokens.tolist(), r.steps, r.row_forwards, r.token_forwards) for r in results]

    short, ceiling = run(8), run(32)
    ended = [i for i, (tokens, *_) in enumerate(short) if 20 in tokens]
    assert 0 < len(ended) < len(short)  # some answers end within the short canvas, some do not
    for i in ended:
        tokens, *cost = short[i]
        assert ceiling[i] == (tokens + [20] * 24, *cost), i
