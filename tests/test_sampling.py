"""Sampling, guidance and stopping at the end of the answer, on tiny models (no upstream code)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch
from conftest import MASK_ID, VOCAB, cached_adapter, make_requests, text_decoder, tiny_denoiser
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import ConfigError, build, compose
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.loading import generation_defaults
from dlmsearch.search.components.stopping import AnswerEnd
from dlmsearch.search.engine.call_records import CallRows, CallSettings
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.engine.summaries import top_k_filter, top_p_filter
from dlmsearch.search.records.state import Layout, initial_canvas

END, EOT = 21, 22  # the tiny models' stop tokens: 21 fills the tail, 22 ends an answer too


@pytest.fixture(scope="module")
def stopping_adapter() -> ModelAdapter:
    return ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB, stop_ids=[END, EOT])


@pytest.mark.parametrize(
    "override,key",
    [
        ("engine.top_p=0", "top_p"),
        ("engine.top_p=1.5", "top_p"),
        ("engine.top_k=0", "top_k"),
        ("engine.top_k=2.5", "top_k"),
        ("engine.temperature=-0.5", "temperature"),
        ("engine.confidence=tempered", "confidence"),
    ],
)
def test_bad_engine_sampling_fails_naming_the_key(adapter: ModelAdapter, override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        build(compose(["+decoder=llada", override]), "engine", adapter=adapter)


@pytest.mark.parametrize(
    "override,key",
    [
        ("decoder.sampling.top_p=0", "top_p"),
        ("decoder.sampling.top_k=-3", "top_k"),
        ("decoder.guidance.scale=-1", "scale"),
        ("decoder.commit.alg_temp=-1", "alg_temp"),
        ("decoder.stop_at_eos=maybe", "stop_at_eos"),
    ],
)
def test_bad_decoder_sampling_fails_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        build(compose(["+decoder=dream", override]), "decoder")


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.integers(-40, 40), min_size=2, max_size=12, unique=True),
    p=st.floats(0.01, 1.0),
    k=st.integers(1, 14),
)
def test_truncation_keeps_what_its_definition_says(logits: list[int], p: float, k: int) -> None:
    """Top-p: a token is kept iff the tokens ranked above it hold at most ``p`` of the mass; top-k: the k largest."""
    x = torch.tensor(logits) / 5.0
    probs = torch.softmax(x, dim=0)
    ranked = torch.argsort(x, descending=True)
    above = torch.cat([torch.zeros(1), torch.cumsum(probs[ranked], dim=0)[:-1]])
    expected_p = torch.zeros(len(x), dtype=torch.bool)
    expected_p[ranked] = above <= p
    assert torch.equal(torch.isfinite(top_p_filter(x, p)), expected_p)
    expected_k = torch.zeros(len(x), dtype=torch.bool)
    expected_k[ranked[:k]] = True
    assert torch.equal(torch.isfinite(top_k_filter(x, k)), expected_k)


def test_the_sampling_used_is_layered_user_checkpoint_decoder(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_k": 7, "eos_token_id": 1}))
    checkpoint = generation_defaults(tmp_path)
    assert checkpoint == Sampling(temperature=0.3, top_k=7)
    adapter = ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB, generation_defaults=checkpoint)
    engine = RolloutEngine(adapter=adapter, top_k=3)
    assert engine.sampling_over(Sampling(top_k=50, top_p=1.0, confidence="sampling")) == Sampling(
        temperature=0.3, top_p=1.0, top_k=3, confidence="sampling"
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.9}))
    assert generation_defaults(tmp_path).temperature == 0.0
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 2}))
    with pytest.raises(ValueError, match="generation_config.json: top_p"):
        generation_defaults(tmp_path)
    assert generation_defaults(tmp_path / "absent") == Sampling()


def decode(decoder, adapter: ModelAdapter, requests, **engine):
    return decoder.decode(RolloutEngine(adapter=adapter, **engine), requests, 8)


SAMPLED = dict(temperature=0.9, top_p=0.8, top_k=6, confidence="sampling")


@pytest.mark.parametrize("preset", ["llada", "fast_dllm", "adalook", "best_of_n"])
def test_sampling_is_batch_invariant_and_seeded(adapter: ModelAdapter, preset: str) -> None:
    requests = make_requests([3, 7, 5], 16, seed=1)
    decoder = text_decoder(preset)
    together = decode(decoder, adapter, requests, seed=3, **SAMPLED)
    alone = [decode(decoder, adapter, [r], seed=3, **SAMPLED)[0] for r in requests]
    again = decode(decoder, adapter, requests, seed=3, **SAMPLED)
    other = decode(decoder, adapter, requests, seed=4, **SAMPLED)
    for x, y, z in zip(together, alone, again):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.tokens, z.tokens)
        assert (x.steps, x.row_forwards) == (y.steps, y.row_forwards)
    assert any(not torch.equal(x.tokens, w.tokens) for x, w in zip(together, other))


def test_truncation_changes_confidence_only_where_it_is_read(adapter: ModelAdapter) -> None:
    """At temperature 0 the proposals never change; top-k confidences are renormalised only with ``confidence: sampling``."""
    engine = RolloutEngine(adapter=adapter)
    layout = Layout(gen_start=4, gen_length=8, block_length=8)
    canvas = initial_canvas([torch.arange(4)], [torch.full((8,), MASK_ID)], layout, MASK_ID, MASK_ID)
    zero = torch.tensor([0])
    evaluations = {}
    for name, sampling in {
        "plain": Sampling(),
        "model": Sampling(top_k=3),
        "sampling": Sampling(top_k=3, confidence="sampling"),
    }.items():
        evaluations[name], _ = engine.evaluate(
            CallRows(canvas.tokens, canvas.attention, zero, zero, zero, zero, None),
            CallSettings(engine.memory(1), engine.sampling_over(sampling), frozenset({"margin", "entropy"}), 4),
        )
    plain, model, sampled = evaluations["plain"], evaluations["model"], evaluations["sampling"]
    assert torch.equal(plain.token, model.token) and torch.equal(plain.token, sampled.token)
    assert torch.equal(plain.confidence, model.confidence) and torch.equal(plain.entropy, model.entropy)
    gen = slice(4, 12)
    assert bool((sampled.confidence[:, gen] >= plain.confidence[:, gen]).all()) and bool(
        (sampled.confidence[:, gen] > plain.confidence[:, gen]).any()
    )
    assert bool((sampled.entropy[:, gen] <= torch.log(torch.tensor(3.0)) + 1e-5).all())


def test_guidance_counts_rows_not_steps_and_refuses_a_cache(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 6], 16, seed=2)
    plain = decode(text_decoder("llada", "decoder.commit.steps=8"), adapter, requests)
    guided = decode(text_decoder("llada", "decoder.commit.steps=8", "decoder.guidance.scale=1.5"), adapter, requests)
    for x, y in zip(plain, guided):
        assert (
            x.steps == y.steps == 8
            and y.row_forwards == 2 * x.row_forwards
            and y.token_forwards == 2 * x.token_forwards
        )
    assert any(not torch.equal(x.tokens, y.tokens) for x, y in zip(plain, guided))
    alone = [decode(text_decoder("adalook", "decoder.guidance.scale=1.5"), adapter, [r])[0] for r in requests]
    together = decode(text_decoder("adalook", "decoder.guidance.scale=1.5"), adapter, requests)
    assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(alone, together))
    with pytest.raises(ValueError, match="decoder.guidance.scale=1.5 needs cache=none"):
        text_decoder("llada", "decoder.guidance.scale=1.5").decode(
            RolloutEngine(adapter=cached_adapter(), cache="dual"), requests, 8
        )


def test_the_end_of_an_answer() -> None:
    layout = Layout(gen_start=2, gen_length=6, block_length=6)
    generation = torch.tensor(
        [
            [5, END, MASK_ID, MASK_ID, MASK_ID, MASK_ID],  # ended: everything before the end token is committed
            [MASK_ID, EOT, MASK_ID, 4, MASK_ID, MASK_ID],  # a position before the end is still masked
            [5, 6, MASK_ID, MASK_ID, MASK_ID, MASK_ID],  # no end token
            [5, EOT, 7, MASK_ID, END, MASK_ID],  # ended at the first end token; what follows it stays, the masks fill
        ]
    )
    canvas = initial_canvas([torch.tensor([1, 2])] * 4, list(generation), layout, MASK_ID, MASK_ID)
    stops = torch.tensor([END, EOT])
    end = AnswerEnd(stops)
    assert end.ended(canvas, layout).tolist() == [True, False, False, True]
    filled = end.fill(canvas, layout)
    assert filled.tokens[0, 2:].tolist() == [5, END, END, END, END, END] and not bool(filled.masked[0].any())
    assert filled.tokens[3, 2:].tolist() == [5, EOT, 7, END, END, END]
    assert torch.equal(filled.tokens[1:3], canvas.tokens[1:3]) and torch.equal(filled.masked[1:3], canvas.masked[1:3])
    assert torch.equal(filled.commit_call, canvas.commit_call)  # fills are not commits


@settings(max_examples=20, deadline=None)
@given(
    preset=st.sampled_from(["llada", "fast_dllm", "fast_block", "adalook", "ete", "dream", "random"]),
    prompts=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    seed=st.integers(0, 300),
    temperature=st.sampled_from([0.0, 0.8]),
)
def test_stopping_keeps_the_text_and_never_costs_more(
    stopping_adapter: ModelAdapter, preset: str, prompts: list[int], seed: int, temperature: float
) -> None:
    """Without a population the text (cut at the first end token) is the same with and without
    stopping: everything before the end is committed when it stops. The tokens are the same
    exactly where the full decode filled the tail with the fill token anyway."""
    requests = make_requests(prompts, 16, seed=seed)
    full = decode(text_decoder(preset), stopping_adapter, requests, seed=seed, temperature=temperature)
    stopped = decode(
        text_decoder(preset, "decoder.stop_at_eos=true"), stopping_adapter, requests, seed=seed, temperature=temperature
    )
    for x, y in zip(full, stopped):
        cut = next((i for i, t in enumerate(x.tokens.tolist()) if t in (END, EOT)), len(x.tokens))
        assert torch.equal(x.tokens[: cut + 1], y.tokens[: cut + 1])
        assert y.steps <= x.steps and y.row_forwards <= x.row_forwards and y.tokens_committed <= x.tokens_committed
        filled = y.commit_call < 0  # every position started masked: -1 marks the tail stopping filled
        if not bool(filled.any()):  # the end came last: the very same decode
            assert torch.equal(x.tokens, y.tokens) and (x.steps, x.row_forwards) == (y.steps, y.row_forwards)
        else:
            assert bool((y.tokens[filled] == END).all()) and int(filled.nonzero().min()) > cut
            assert torch.equal(x.tokens, y.tokens) == bool((x.tokens[filled] == END).all())


def test_stopping_needs_stop_tokens(adapter: ModelAdapter) -> None:
    with pytest.raises(ValueError, match="decoder.stop_at_eos needs the model's stop tokens"):
        decode(text_decoder("llada", "decoder.stop_at_eos=true"), adapter, make_requests([3], 16))


def test_alg_temp_draws_positions_without_replacement(adapter: ModelAdapter) -> None:
    """``alg_temp`` > 0 changes which positions a fixed-step schedule commits, seeded; 0 is the plain rule."""
    requests = make_requests([3, 5], 16, seed=5)
    plain = decode(text_decoder("llada", "decoder.commit.steps=8"), adapter, requests)
    zero = decode(text_decoder("llada", "decoder.commit.steps=8", "decoder.commit.alg_temp=0.0"), adapter, requests)
    hot = decode(
        text_decoder("llada", "decoder.commit.steps=8", "decoder.commit.alg_temp=0.5"), adapter, requests, seed=1
    )
    again = decode(
        text_decoder("llada", "decoder.commit.steps=8", "decoder.commit.alg_temp=0.5"), adapter, requests, seed=1
    )
    assert all(torch.equal(x.commit_call, y.commit_call) for x, y in zip(plain, zero))
    assert all(torch.equal(x.commit_call, y.commit_call) for x, y in zip(hot, again))
    assert any(not torch.equal(x.commit_call, y.commit_call) for x, y in zip(plain, hot))
    assert all(x.steps == 8 and int((x.commit_call >= 0).sum()) == 16 for x in hot)


def test_the_summary_records_the_sampling_used(stopping_adapter: ModelAdapter) -> None:
    engine = RolloutEngine(
        adapter=attrs.evolve(stopping_adapter, generation_defaults=Sampling(top_p=0.9)), temperature=0.5
    )
    decoder = text_decoder("dream")
    decoder.decode(engine, make_requests([3], 16), 8)
    assert decoder.plan(engine, 16, 8).sampling.as_dict() == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 50,
        "confidence": "sampling",
    }
