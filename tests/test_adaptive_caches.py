"""The adaptive KV caches (cache=dllm_cache|d2cache|elastic|dkv): each row makes its own selections
and refresh decisions, so a sample decodes batched, in a session or alone to the same tokens and
counters, with lookahead and with a population; selecting everything is the uncached decode; and
every input they cannot serve is refused in one line."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import NoRepeatVerifier, cached_adapter, plan_on, record, renumbered, text_decoder
from family_models import BLOCK, GEN, adapter_for, requests_for

from dlmsearch.config import build, compose
from dlmsearch.models.layer_store import LayerStore
from dlmsearch.search.engine.adaptive import ADAPTIVE_POLICIES, D2Cache, DKVCache, DLLMCache, ElasticCache
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.session import DecodeSession

torch.set_num_threads(1)

POLICIES = [policy.name for policy in ADAPTIVE_POLICIES]
# Settings that make the tiny models' 16-token generations exercise every branch of each rule: refreshes
# and adaptive updates (dLLM-Cache), partial forwards between refreshes (dKV), a selection smaller than
# the masks left plus the rollout's nucleus (d2Cache), a window smaller than the block and drift (Elastic).
SMALL = {
    "dllm_cache": DLLMCache(prompt_interval=5, response_interval=3, ratio=0.25),
    "dkv": DKVCache(refresh_interval=4),
    "d2cache": D2Cache(current_k=3, rollout_p=0.3, inflate=1),
    "elastic": ElasticCache(window=3, drift=0.99, track=1),
}


@functools.cache
def adapter(family: str):
    return adapter_for(family, True)


@pytest.mark.parametrize("preset", ["fast_dllm", "adalook", "smc"], ids=["threshold", "lookahead", "population"])
@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("policy", POLICIES)
def test_batched_equals_alone(policy: str, family: str, preset: str) -> None:
    """Rows of different prompt lengths, selection sizes and refresh decisions share each forward (chunks of 3 rows)."""
    decoder, verifier = text_decoder(preset), NoRepeatVerifier()
    requests = requests_for([2, 9, 5, 12], seed=3)
    engine = RolloutEngine(adapter=adapter(family), cache=SMALL[policy], row_budget=3)
    batched = decoder.decode(engine, requests, BLOCK, verifier=verifier)
    whole = sum(
        r.row_forwards * (len(q.prompt) + GEN) for q, r in zip(requests, batched)
    )  # every row forwarding its whole canvas
    assert sum(r.token_forwards for r in batched) < whole, "every column was recomputed: the policy never selected"
    for request, result in zip(requests, batched):
        [alone] = decoder.decode(
            RolloutEngine(adapter=adapter(family), cache=SMALL[policy]), [request], BLOCK, verifier=verifier
        )
        assert record(result) == record(alone), f"sample uid {request.uid}"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_session_admitting_and_evicting_changes_no_sample(policy: str) -> None:
    """A longer prompt joining pads every store on the left; an evicted sample's slot leaves the store."""
    engine = RolloutEngine(adapter=adapter("dream"), cache=SMALL[policy], row_budget=256)
    decoder = text_decoder("adalook")
    session = DecodeSession.open(decoder, engine, GEN, BLOCK)
    first, later = requests_for([3, 5, 4], seed=1), renumbered(requests_for([11, 2], seed=2), 100)
    session.admit(first)
    finished = {r.uid: r for r in session.step() + session.step()}
    session.admit(later)
    finished.update({r.uid: r for r in session.step()})
    victim = next(uid for uid in session.uids if uid < 100)
    session.evict([victim])
    finished.update({r.uid: r for r in session.run()})
    for request in [r for r in first + later if r.uid != victim]:
        [alone] = decoder.decode(RolloutEngine(adapter=adapter("dream"), cache=SMALL[policy]), [request], BLOCK)
        assert record(finished[request.uid]) == record(alone), f"sample uid {request.uid}"


EVERYTHING = {  # settings under which a policy recomputes every column at every layer: the uncached decode
    "dllm_cache": DLLMCache(prompt_interval=1, response_interval=100, ratio=1.0),
    "d2cache": D2Cache(current_k=64, rollout_p=1.0, inflate=64),
}


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("policy", list(EVERYTHING))
def test_selecting_every_column_is_the_uncached_decode(policy: str, family: str) -> None:
    decoder = text_decoder("fast_dllm")
    requests = requests_for([2, 9, 5, 12], seed=3)
    uncached = decoder.decode(RolloutEngine(adapter=adapter(family)), requests, BLOCK)
    cached = decoder.decode(RolloutEngine(adapter=adapter(family), cache=EVERYTHING[policy]), requests, BLOCK)
    assert [r.tokens.tolist() for r in cached] == [r.tokens.tolist() for r in uncached]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_defaults_recompute_less_than_the_uncached_decode(policy: str) -> None:
    decoder = text_decoder("fast_dllm", gen_length=32)
    requests = [requests_for([6], seed=s)[0] for s in range(2)]
    requests = [
        type(r)(uid=r.uid + i, prompt=r.prompt, generation=torch.full((32,), r.generation[0]))
        for i, r in enumerate(requests)
    ]
    uncached = decoder.decode(RolloutEngine(adapter=adapter("llada")), requests, BLOCK)
    cached = decoder.decode(RolloutEngine(adapter=adapter("llada"), cache=policy), requests, BLOCK)
    assert sum(r.token_forwards for r in cached) < sum(r.token_forwards for r in uncached)


def test_the_store_pads_widens_admits_and_reorders() -> None:
    store = LayerStore()
    store.reset(2)
    store.ensure("keys", (1, 2, 3, 4), torch.float32, "cpu", column_axis=3)
    store.ensure("clock", (), torch.long, "cpu")
    store.fields["keys"] += torch.arange(2.0)[:, None, None, None, None] + 1
    store.fields["clock"] += torch.tensor([5, 7])
    store.widen(2)
    assert store.fields["keys"].shape == (2, 1, 2, 5, 4) and bool((store.fields["keys"][:, :, :, :2] == 0).all())
    store.admit(1)
    store.reorder(torch.tensor([1, 2]))
    assert store.fields["clock"].tolist() == [7, 0] and float(store.fields["keys"][0, 0, 0, 4, 0]) == 2.0
    copies = store.take(torch.tensor([0, 0]))
    copies["clock"] += 1
    store.put(torch.tensor([0, 0]), copies, torch.tensor([False, False]))
    assert store.fields["clock"].tolist() == [7, 0], "a branch's copy was written back"


def test_a_model_that_cannot_run_the_layerwise_forward_is_refused(adapter) -> None:
    with pytest.raises(
        ValueError,
        match=r"^cache=dllm_cache runs the layerwise forward of the native LLaDA and Dream models; BidirectionalDenoiser cannot: use `cache=none`$",
    ):
        plan_on(RolloutEngine(adapter=adapter, cache="dllm_cache"))


def test_a_block_diffusion_model_is_pointed_to_its_exact_cache() -> None:
    block_model = build(compose(["model=countdown_block", "model.device=cpu", "model.dtype=float32"]), "model")
    with pytest.raises(
        ValueError,
        match=r"^cache=dkv recomputes stale keys and values of a full-attention model; this block-diffusion model .* use `cache=block`$",
    ):
        plan_on(RolloutEngine(adapter=block_model, cache="dkv"))


@pytest.mark.parametrize("preset", ["remdm", "saber", "rcr", "wino"])
def test_a_revision_is_refused(preset: str) -> None:
    engine = RolloutEngine(adapter=cached_adapter(), cache="elastic")
    with pytest.raises(ValueError, match=r"re-masks committed tokens, but cache=elastic .*: use `cache=none`"):
        DecodeSession.open(text_decoder(preset), engine, GEN, BLOCK)


def test_guidance_is_refused() -> None:
    engine = RolloutEngine(adapter=cached_adapter(), cache="d2cache")
    with pytest.raises(
        ValueError,
        match=r"^decoder.guidance.scale=1.5 needs cache=none .*got cache=d2cache: use `cache=none` \(or `decoder.guidance.scale=0`\)$",
    ):
        DecodeSession.open(text_decoder("fast_dllm", "decoder.guidance.scale=1.5"), engine, GEN, BLOCK)


@pytest.mark.parametrize(
    ("policy", "override", "message"),
    [
        ("dllm_cache", "cache.ratio=1.5", r"ratio must be within \[0.0, 1.0\], got 1.5"),
        ("dllm_cache", "cache.prompt_interval=0", r"prompt_interval must be within \[1, inf\], got 0"),
        ("dkv", "cache.refresh_interval=1", r"refresh_interval must be within \[2, inf\], got 1"),
        ("d2cache", "cache.confidence=latest", r"confidence must be one of step0, last_queried; got 'latest'"),
        ("d2cache", "cache.sigma=0", r"sigma must be within \(0.0, inf\], got 0"),
        ("elastic", "cache.window=abc", r"window must be an integer, got 'abc'"),
    ],
)
def test_out_of_range_settings_name_their_key(policy: str, override: str, message: str) -> None:
    cfg = compose(["model=countdown", f"cache={policy}", override])
    with pytest.raises((TypeError, ValueError), match=message):
        build(cfg, "cache")


def test_the_yaml_gives_the_authors_settings_per_family() -> None:
    llada = build(compose(["model=countdown", "cache=dllm_cache"]), "cache")
    dream = build(compose(["model=dream", "model.path=unused", "cache=dllm_cache"]), "cache")
    assert (llada.prompt_interval, llada.response_interval, llada.ratio) == (50, 7, 0.25)
    assert (dream.prompt_interval, dream.response_interval, dream.ratio) == (25, 2, 0.25)
    assert build(compose(["model=dream", "model.path=unused", "cache=elastic"]), "cache").window == 32
    assert build(compose(["model=countdown", "cache=dkv", "cache.refresh_interval=4"]), "cache").refresh_interval == 4
