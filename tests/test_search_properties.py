"""Invariants of the one search driver, over every preset (hypothesis drives the shapes)."""

from __future__ import annotations

import functools

import attrs
import paradigm_models
import pytest
import torch
from conftest import MASK_ID, VOCAB, NoRepeatVerifier, make_requests, record, text_decoder
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import decoder_presets
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.components.commit import DreamSchedule
from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.search.components.triggers import NeverTrigger
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.state import Canvas


class RoundLog:
    """Records every slot's canvas after every round, and what each slot continued from."""

    def __init__(self) -> None:
        self.canvases: list[Canvas] = []
        self.sources: list[torch.Tensor | None] = []

    def __call__(self, canvas: Canvas, source: torch.Tensor | None = None) -> None:
        self.canvases.append(canvas)
        self.sources.append(source)


def decode_logged(decoder: SearchDecoder, adapter: ModelAdapter, requests, block_length: int):
    log = RoundLog()
    results = decoder.decode(
        RolloutEngine(adapter=adapter), requests, block_length, on_round=log, verifier=NoRepeatVerifier()
    )
    return results, log.canvases, log.sources


@functools.cache
def monotone_presets() -> list[str]:
    """The presets that never return a committed token to the mask (WINO, RCR, Saber, ReMDM
    revise: tests/test_revision.py). Composing every preset takes seconds: done at the first
    example drawn, not at import."""
    return [
        p
        for p in decoder_presets()
        if not text_decoder(p).revision.revises
        and not text_decoder(p).stop_at_eos
        and not text_decoder(p).length.changes
    ]  # (the tiny model has no stop ids, which a length policy reads: tests/test_length_policy.py)


shapes = st.fixed_dictionaries(
    {
        "preset": st.deferred(lambda: st.sampled_from(monotone_presets())),
        "prompts": st.lists(st.integers(0, 6), min_size=1, max_size=3),
        "blocks": st.sampled_from([(8, 8), (16, 8), (16, 4), (12, 4)]),
        "fixed": st.integers(0, 3),
        "seed": st.integers(0, 1000),
    }
)


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_unmasking_is_monotonic_and_complete(adapter: ModelAdapter, shape: dict) -> None:
    gen_length, block_length = shape["blocks"]
    requests = make_requests(shape["prompts"], gen_length, seed=shape["seed"], fixed=shape["fixed"])
    decoder = text_decoder(shape["preset"], gen_length=gen_length)
    results, canvases, sources = decode_logged(decoder, adapter, requests, block_length)
    start = canvases[0].tokens.shape[1] - gen_length
    size = decoder.population.size
    previous_masked = torch.zeros(0)
    previous_tokens = None
    fixed_schedule = isinstance(decoder.commit, DreamSchedule)  # Dream's early steps may commit nothing, as upstream
    for canvas, source in zip(canvases, sources):
        if previous_tokens is not None:
            if source is not None:  # a resampled slot continues from another slot's canvas
                previous_masked, previous_tokens = previous_masked[source], previous_tokens[source]
            assert not (canvas.masked & ~previous_masked).any(), "a position was re-masked"
            committed = ~previous_masked & canvas.attention
            assert torch.equal(canvas.tokens[committed], previous_tokens[committed]), "a committed token changed"
            progressed = (previous_masked.sum(1) > canvas.masked.sum(1)) | (previous_masked.sum(1) == 0)
            # particles ended by the verifier, or of a stopped sample, no longer progress
            assert progressed.all() or fixed_schedule or size > 1, "a round committed nothing for an unfinished sample"
        previous_masked, previous_tokens = canvas.masked, canvas.tokens
    for index, (request, result) in enumerate(zip(requests, results)):
        row = canvases[-1].tokens[index * size]
        assert torch.equal(row[start - len(request.prompt) : start], request.prompt), "prompt modified"
        given_cells = request.generation != MASK_ID
        assert torch.equal(result.tokens[given_cells], request.generation[given_cells]), "a given cell changed"
        assert not (result.tokens == MASK_ID).any(), "a position was left masked"
        blanks = int((~given_cells).sum())
        assert result.tokens_committed == blanks
        max_depth = getattr(decoder.expansion, "max_depth", 0)
        recheck = (
            decoder.population.score.remask_groups if size > 1 else 0
        )  # the model's re-check of complete particles: one more step
        bound = (decoder.commit.steps if fixed_schedule else blanks * (1 + max_depth)) + int(recheck > 0)
        rows_bound = result.steps * size * (1 + getattr(decoder.candidates, "k", 0)) + recheck * size
        assert result.row_forwards <= rows_bound, "more rows than particles, branches and re-checks"
        assert 1 <= result.steps <= bound, "step bound exceeded"


@settings(max_examples=15, deadline=None)
@given(shapes)
def test_results_do_not_depend_on_batch_composition(adapter: ModelAdapter, shape: dict) -> None:
    gen_length, block_length = shape["blocks"]
    decoder = text_decoder(shape["preset"], gen_length=gen_length)
    requests = make_requests(shape["prompts"] + [7, 0], gen_length, seed=shape["seed"], fixed=shape["fixed"])
    verifier = NoRepeatVerifier()
    together = decoder.decode(RolloutEngine(adapter=adapter), requests, block_length, verifier=verifier)
    for index in (0, len(requests) - 1):
        [alone] = decoder.decode(RolloutEngine(adapter=adapter), [requests[index]], block_length, verifier=verifier)
        assert_same_result(alone, together[index], same_batches=False)


def assert_same_decode(
    a: SearchDecoder, b: SearchDecoder, adapter: ModelAdapter, gen_length: int = 16, block_length: int = 8
) -> list:
    requests = make_requests([3, 0, 5, 2], gen_length, seed=11, fixed=2)
    first = a.decode(RolloutEngine(adapter=adapter), requests, block_length)
    second = b.decode(RolloutEngine(adapter=adapter), requests, block_length)
    for x, y in zip(first, second):
        assert_same_result(x, y)
    return first


def assert_same_result(x, y, same_batches: bool = True) -> None:
    """Two decodes that must be one: the same tokens, counters and commit record, exactly.

    ``same_batches=False``: the rows were forwarded in batches of other shapes (alone vs together),
    which changes the float rounding of the confidences (measured: 4e-7) but no decision.
    """
    assert torch.equal(x.tokens, y.tokens)
    assert (x.steps, x.row_forwards, x.token_forwards, x.tokens_committed) == (
        y.steps,
        y.row_forwards,
        y.token_forwards,
        y.tokens_committed,
    )
    for field in ("commit_call", "commit_depth", "commit_branch"):
        assert torch.equal(getattr(x, field), getattr(y, field)), field
    if same_batches:
        assert torch.equal(x.commit_confidence, y.commit_confidence)
    else:
        torch.testing.assert_close(x.commit_confidence, y.commit_confidence, rtol=1e-5, atol=1e-6)


def test_adalook_with_closed_gate_is_ete(adapter: ModelAdapter) -> None:
    results = assert_same_decode(
        text_decoder("adalook", "decoder.expansion.threshold=inf"), text_decoder("ete"), adapter
    )
    assert any((r.commit_depth == 1).any() for r in results), "no lookahead happened: the test would prove nothing"


def test_ete_without_trigger_is_fast_block(adapter: ModelAdapter) -> None:
    assert_same_decode(text_decoder("ete", "decoder/trigger=never"), text_decoder("fast_block"), adapter)


@pytest.mark.parametrize("preset", ["ete", "adalook"])
@pytest.mark.parametrize("case", sorted(paradigm_models.CASES))
def test_a_lookahead_whose_trigger_never_fires_is_its_base_decoder(case: str, preset: str) -> None:
    """Every paradigm and cache policy: the trigger is asked every round (gamma 0: a mean confidence is
    never below it), so the lookahead's machinery runs, yet tokens, commit record and counters are
    those of the same decoder with no trigger at all."""
    quiet = paradigm_models.decoder(case, preset, "decoder.trigger.gamma=0")
    base = attrs.evolve(quiet, trigger=NeverTrigger())
    requests, block = paradigm_models.requests(case, seed=2), paradigm_models.block_length(case)
    got = quiet.decode(paradigm_models.engine(case), requests, block)
    expected = base.decode(paradigm_models.engine(case), requests, block)
    assert [record(r) for r in got] == [record(r) for r in expected]


def test_fixed_depth_one_is_ete(adapter: ModelAdapter) -> None:
    assert_same_decode(text_decoder("fixed_depth", "decoder.expansion.depth=1"), text_decoder("ete"), adapter)


def test_adalook_with_open_gate_and_no_reevaluation_is_fixed_depth(adapter: ModelAdapter) -> None:
    results = assert_same_decode(
        text_decoder(
            "adalook",
            "decoder.expansion.threshold=-inf",
            "decoder.expansion.max_depth=3",
            "decoder/selector=best_score",
        ),
        text_decoder("fixed_depth", "decoder.expansion.depth=3"),
        adapter,
    )
    assert any((r.commit_depth >= 2).any() for r in results)


def _live_variance(scores: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """``[S]`` population variance of each slot's live scores (0 with fewer than two)."""
    out = torch.zeros(scores.shape[0])
    for s in range(scores.shape[0]):
        values = scores[s][live[s]]
        if len(values) > 1:
            out[s] = ((values - values.mean()) ** 2).mean()
    return out


def test_adalook_gate_and_reevaluation_change_the_search(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 0, 5, 2], 16, seed=11, fixed=2)
    # gamma 0.6: some branches settle (stop triggering) after a step, so re-evaluation has work to do
    ete_levels: list[Lookahead] = []
    ada_levels: list[Lookahead] = []
    ete = text_decoder("ete", "decoder.trigger.gamma=0.6").decode(
        RolloutEngine(adapter=adapter), requests, 8, on_lookahead=ete_levels.append
    )
    ada = text_decoder("adalook", "decoder.expansion.threshold=0.0", "decoder.trigger.gamma=0.6").decode(
        RolloutEngine(adapter=adapter), requests, 8, on_lookahead=ada_levels.append
    )
    # ETE looks one step ahead: every lookahead ends at depth 1, is never restarted, commits at depth <= 1.
    assert ete_levels and all(look.depth == 1 and look.done and not look.restarted.any() for look in ete_levels)
    assert all(int(r.commit_depth.max()) <= 1 for r in ete) and any((r.commit_depth == 1).any() for r in ete)
    # Up to the first lookahead the two searches are one: the same round, slots and depth-1 scores.
    first_ete, first_ada = ete_levels[0], ada_levels[0]
    assert torch.equal(first_ete.slots, first_ada.slots) and torch.equal(first_ete.scores, first_ada.scores)
    # The open gate (threshold 0, continue while the variance is above it) goes on from depth 1
    # exactly where the live branches' scores differ and none has finished; such a slot then
    # rolls deeper or, re-evaluated with all its branches still triggering, restarts.
    grid = first_ete.scores.view(len(first_ete.slots), first_ete.width)
    finished = (~first_ete.branches.masked.any(dim=1)).view_as(grid) & first_ete.live
    gate = (_live_variance(grid, first_ete.live) > 0.0) & ~finished.any(dim=1)
    assert torch.equal(first_ada.rolling | first_ada.restarted, gate)
    # Re-evaluation: settled branches win (the live set shrinks) or the lookahead restarts.
    assert any(look.restarted.any() for look in ada_levels), "re-evaluation never restarted a lookahead"
    assert not (first_ada.live & ~first_ete.live).any()
    assert (first_ete.live & ~first_ada.live).any(), "re-evaluation pruned no branch at the first lookahead"
    assert all(1 <= look.depth <= 3 for look in ada_levels) and any(look.depth >= 2 for look in ada_levels)
    assert all(int(r.commit_depth.max()) <= 3 for r in ada)
    assert any((r.commit_depth >= 2).any() for r in ada), "the open gate never rolled deeper"


def test_threshold_rule_commits_at_least_one_per_step(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 0, 5], 16, seed=5)
    for threshold in (0.0, 0.5, 1.0):
        _, canvases, _ = decode_logged(
            text_decoder("fast_dllm", f"decoder.commit.threshold={threshold}"), adapter, requests, 8
        )
        counts = [c.masked.sum(1) for c in canvases]
        before = torch.full_like(counts[0], 16)
        for now in counts:
            assert ((before - now >= 1) | (before == 0)).all()
            before = now
        if threshold == 0.0:
            assert len(canvases) == 2  # everything in a block at once
        if threshold == 1.0:
            assert len(canvases) == 16  # one per step


@pytest.mark.parametrize("steps,fixed", [(16, 0), (8, 0), (4, 3), (12, 2)])
def test_llada_schedule_commits_exactly_its_k(adapter: ModelAdapter, steps: int, fixed: int) -> None:
    gen_length, block_length = 16, 4
    requests = make_requests([2, 4], gen_length, seed=steps, fixed=fixed)
    decoder = text_decoder("llada", f"decoder.commit.steps={steps}", gen_length=gen_length)
    _, canvases, _ = decode_logged(decoder, adapter, requests, block_length)
    per_block = steps // (gen_length // block_length)
    for row, request in enumerate(requests):
        expected = []
        for block in range(gen_length // block_length):
            cells = request.generation[block * block_length : (block + 1) * block_length]
            masks = int((cells == MASK_ID).sum())
            schedule = [masks // per_block + (1 if i < masks % per_block else 0) for i in range(per_block)]
            expected += [k for k in schedule if k]
        masked = [int(c.masked[row].sum()) for c in canvases]
        total = int((request.generation == MASK_ID).sum())
        commits = [a - b for a, b in zip([total] + masked, masked)]
        assert [c for c in commits if c] == expected


def test_adalook_counts_more_rows_than_steps(adapter: ModelAdapter) -> None:
    requests = make_requests([3], 16, seed=2, fixed=2)
    [result] = text_decoder("adalook").decode(RolloutEngine(adapter=adapter), requests, 8)
    # a lookahead evaluates its branches side by side: one step, several rows
    assert (result.commit_depth >= 1).any(), "no lookahead commit: the row count proves nothing"
    assert result.row_forwards > result.steps
    given = requests[0].generation != MASK_ID
    committed = ~given
    # the commit record: given cells were never committed; every other cell exactly once, at a
    # model call of this sample, at depth 0 (base rule, no branch) or in a lookahead branch
    assert torch.equal(result.commit_call[given], torch.full((2,), -1)) and torch.equal(
        result.commit_depth[given], torch.full((2,), -1)
    )
    assert result.tokens_committed == int(committed.sum()) == 14
    calls = result.commit_call[committed]
    assert bool(((calls >= 1) & (calls <= result.steps)).all())
    assert torch.equal(result.commit_branch[committed] >= 0, result.commit_depth[committed] >= 1)
    # a committed token's confidence is its probability, the largest of the position's (greedy
    # decoding): the vocabulary's probabilities sum to 1, so it is at least 1/VOCAB, and at most 1
    confidence = result.commit_confidence
    assert bool(((confidence[committed] >= 1.0 / VOCAB) & (confidence[committed] <= 1.0)).all()), confidence
    assert bool((confidence[given] == 0.0).all())
