"""Decoders that take commits back (RCR, ReMDM) and the monotone EB-Sampler, in the one loop."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import MASK_ID, cached_adapter, make_requests, text_decoder
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import build, compose, decoder_presets
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.state import Layout

REVISING = ("rcr", "remdm", "saber", "wino")
NEW = (*REVISING, "eb_sampler", "pc_sampler", "klass")


def decode(decoder, adapter: ModelAdapter, requests, block_length: int = 8, on_round=None, **engine):
    return decoder.decode(RolloutEngine(adapter=adapter, **engine), requests, block_length, on_round=on_round)


def test_the_presets_exist_and_old_ones_never_revise(adapter: ModelAdapter) -> None:
    assert set(NEW) <= set(decoder_presets())
    requests = make_requests([2, 5], 16, seed=3)
    tested_elsewhere = {
        "llada2",
        "llada21",
    }  # stop at EOS (the tiny model has no stop ids); LLaDA2.1 edits: tests/test_block_diffusion*.py
    tested_elsewhere |= {"daedal", "rho_eos"}  # read the end token's confidence (tests/test_length_policy.py)
    for preset in sorted(
        set(decoder_presets("mask")) - set(REVISING) - {"verified_best_of_n", "mcts_verified"} - tested_elsewhere
    ):
        for result in decode(text_decoder(preset), adapter, requests):
            assert int(result.revisions.sum()) == 0, preset


@settings(max_examples=25, deadline=None)
@given(
    preset=st.sampled_from(NEW),
    prompts=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    seed=st.integers(0, 400),
    fixed=st.integers(0, 4),
    temperature=st.sampled_from([0.0, 0.7]),
)
def test_revising_decoders_terminate_keep_given_tokens_and_ignore_the_batch(
    adapter: ModelAdapter,
    preset: str,
    prompts: list[int],
    seed: int,
    fixed: int,
    temperature: float,
) -> None:
    """Termination within the stated bound, given tokens never revised, the same result alone or
    batched and for the same seed, and one row per step (counters count every forward)."""
    requests = make_requests(prompts, 16, seed=seed, fixed=fixed)
    decoder = text_decoder(preset)
    together = decode(decoder, adapter, requests, seed=seed, temperature=temperature)
    again = decode(decoder, adapter, requests, seed=seed, temperature=temperature)
    for request, result, repeat in zip(requests, together, again):
        alone = decode(decoder, adapter, [request], seed=seed, temperature=temperature)[0]
        assert torch.equal(result.tokens, alone.tokens) and torch.equal(result.revisions, alone.revisions)
        assert torch.equal(result.tokens, repeat.tokens) and result.steps == alone.steps == repeat.steps
        given_cells = request.generation != MASK_ID
        assert torch.equal(result.tokens[given_cells], request.generation[given_cells])
        assert int(result.revisions[given_cells].sum()) == 0 and bool((result.commit_call[given_cells] == -1).all())
        assert not bool((result.tokens == MASK_ID).any())
        plan = decoder.plan(RolloutEngine(adapter=adapter), 16, 8)
        layout = Layout(
            gen_start=0, gen_length=16, block_length=plan.block_length
        )  # WINO: one block of the whole generation, as published
        bound = 16 + 1 + (plan.block_budget or 0) * layout.num_blocks + plan.revision.extra_rounds(layout)
        assert (
            result.steps <= bound == plan.max_rounds()
        )  # the stated bound: gen_length + 1 + budget * blocks + the revision's extra rounds
        assert result.row_forwards == result.steps
        if preset not in REVISING:  # monotone: every position committed once
            assert int(result.revisions.sum()) == 0


def test_rcr_keeps_the_schedule_after_every_step(adapter: ModelAdapter) -> None:
    """After step t of S, N·g((t+1)/S) of the block's N positions are masked again (linear g):
    RCR keeps LLaDA's count of commits, not its choice of which."""
    requests = make_requests([4], 16, seed=1)
    masked_after: list[int] = []
    decoder = text_decoder(
        "rcr", "decoder.commit.steps=8", "decoder.revision.pool=paper"
    )  # S = 4 steps per block of 8; the paper's full schedule
    result = decode(
        decoder, adapter, requests, on_round=lambda canvas, source: masked_after.append(int(canvas.masked[0, 4:].sum()))
    )[0]
    per_block = [8 - math.floor(8 * (1 - (t + 1) / 4)) for t in range(4)]  # K_t kept
    expected = [8 + 8 - k for k in per_block] + [
        8 - k for k in per_block
    ]  # during the first block the second's 8 are masked too
    assert masked_after == expected and result.steps == 8
    assert int(result.revisions.sum()) == sum(8 - k for k in per_block[:-1]) * 2


def test_remdm_spends_twice_the_calls_and_revises_k_per_loop_step(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 6], 16, seed=2) + make_requests(
        [4], 16, seed=9, fixed=5
    )  # given cells do not shift the loop
    for k in (1, 2):
        results = decode(text_decoder("remdm", "decoder.commit.steps=16", f"decoder.commit.k={k}"), adapter, requests)
        for request, result in zip(requests, results):  # blocks of 8: 8 plain steps and 8 loop steps each
            given = bool((request.generation != MASK_ID).any())
            assert (result.steps <= 32 if given else result.steps == 32) and int(result.revisions.sum()) == 2 * 8 * k


def test_eb_sampler_commits_what_the_entropy_budget_allows(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 6], 16, seed=4)
    one_at_a_time = decode(text_decoder("eb_sampler", "decoder.commit.gamma=0"), adapter, requests)
    everything = decode(text_decoder("eb_sampler", "decoder.commit.gamma=1e9"), adapter, requests)
    middle = decode(text_decoder("eb_sampler", "decoder.commit.gamma=1.0"), adapter, requests)
    assert all(r.steps == 16 for r in one_at_a_time) and all(r.steps == 2 for r in everything)
    assert all(2 <= r.steps <= 16 for r in middle) and any(2 < r.steps < 16 for r in middle)


def test_refused_combinations_fail_clearly() -> None:
    explores = build(compose(["+decoder=rcr", "decoder/trigger=always"]), "decoder")
    with pytest.raises(ValueError, match="revises commits .* and explores"):  # the plan's rule 16, before any forward
        explores.plan(
            RolloutEngine(adapter=ModelAdapter(module=torch.nn.Identity(), mask_id=MASK_ID, vocab_size=24)), 16, 8
        )
    decoder = build(compose(["+decoder=rcr", "decoder/commit=threshold"]), "decoder")
    with pytest.raises(ValueError, match="needs a commit rule with a fixed number of steps per block"):
        decoder.decode(
            RolloutEngine(adapter=ModelAdapter(module=torch.nn.Identity(), mask_id=MASK_ID, vocab_size=24)),
            make_requests([2], 16),
            8,
        )


def test_a_population_revises_each_particle(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 5], 16, seed=6)
    decoder = text_decoder("rcr", "+decoder/population=best_of_n")
    results = decode(decoder, adapter, requests)
    assert all(not bool((r.tokens == MASK_ID).any()) and int(r.revisions.sum()) > 0 for r in results)


def test_saber_backtracks_but_always_makes_progress(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 6, 2], 16, seed=8)
    masked: list[list[int]] = []
    results = decode(
        text_decoder("saber"),
        adapter,
        requests,
        on_round=lambda canvas, source: masked.append(canvas.masked.sum(dim=1).tolist()),
    )
    for row in range(len(requests)):
        counts = [16] + [m[row] for m in masked]
        steps = results[row].steps
        assert all(counts[i + 1] < counts[i] for i in range(steps))  # net progress of at least one position per step
    assert sum(int(r.revisions.sum()) for r in results) > 0


def test_klass_needs_the_full_distributions_and_refuses_a_cache() -> None:
    decoder = text_decoder("klass")
    with pytest.raises(ValueError, match="kl statistic .* needs cache=none"):
        decoder.decode(RolloutEngine(adapter=cached_adapter(), cache="prefix"), make_requests([2], 16), 8)
