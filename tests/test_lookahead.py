"""The lookahead as a frozen record: each level is a new record, depth grows one level per call,
the variance gate's and fixed depth's records stop where they should, and expansion policies
declare what they need through ``plan`` (no probing)."""

from __future__ import annotations

import itertools

import attrs
import pytest
import torch
from conftest import make_requests, text_decoder

from dlmsearch.search.components.expansion import ConfidenceDepth, FixedDepth, VarianceGate
from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.search.driver import step
from dlmsearch.search.engine.rollout import RolloutEngine


def levels(decoder, adapter) -> list[Lookahead]:
    seen: list[Lookahead] = []
    decoder.decode(RolloutEngine(adapter=adapter), make_requests([3, 0, 5], 16, seed=2), 8, on_lookahead=seen.append)
    return seen


@pytest.mark.parametrize("depth", [1, 3])
def test_fixed_depth_records_grow_one_level_per_call(adapter, depth: int) -> None:
    decoder = attrs.evolve(text_decoder("fixed_depth", "decoder/trigger=always"), expansion=FixedDepth(depth=depth))
    seen = levels(decoder, adapter)
    assert seen, "the trigger fired nowhere"
    finished = [look for look in seen if look.done]
    assert finished and all(look.depth <= depth for look in seen)
    assert {look.depth for look in finished} <= set(range(1, depth + 1)) and max(
        look.depth for look in finished
    ) == depth
    look = seen[0]
    assert look.branches.tokens.shape[0] == len(look.slots) * look.width == look.scores.shape[0]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        look.depth = 7  # type: ignore[misc]


def test_records_are_new_objects_and_the_live_set_only_shrinks(adapter) -> None:
    decoder = text_decoder(
        "adalook", "decoder/trigger=always", "decoder.expansion.threshold=0.0", "decoder.expansion.max_depth=4"
    )
    seen = levels(decoder, adapter)
    assert len({id(look) for look in seen}) == len(seen)
    for before, after in itertools.pairwise(seen):
        if not before.done and torch.equal(before.slots, after.slots):
            assert after.depth in (before.depth, before.depth + 1)
            assert not bool((after.live & ~before.live).any())


def test_every_policy_binds_to_its_roots() -> None:
    for policy in (FixedDepth(depth=2), VarianceGate()):
        assert policy.for_roots(None, None, None) is policy  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="call its for_roots"):
        ConfidenceDepth().should_continue(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), 1)


@pytest.mark.parametrize("preset", ["llada", "adalook", "best_of_n"])
def test_the_loop_is_a_step_function_over_a_frozen_state(adapter, preset: str) -> None:
    """Driving ``step`` by hand gives what ``decode`` gives, and no step writes into its input."""
    from conftest import NoRepeatVerifier

    decoder = text_decoder(preset)
    requests = make_requests([2, 4], 16, seed=5)
    expected = decoder.decode(RolloutEngine(adapter=adapter), requests, 8, verifier=NoRepeatVerifier())
    engine = RolloutEngine(adapter=adapter)
    state = decoder.start(engine, requests, 8, NoRepeatVerifier())
    rounds = 0
    while not state.finished:
        before = state.canvas.tokens.clone()
        after = step(engine, state, NoRepeatVerifier())
        assert torch.equal(state.canvas.tokens, before) and after is not state
        state, rounds = after, rounds + 1
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        state.round_index = 0  # type: ignore[misc]
    found = decoder.finish(engine, state, NoRepeatVerifier())
    assert rounds == state.round_index + 1
    for x, y in zip(found, expected):
        assert torch.equal(x.tokens, y.tokens) and (x.steps, x.row_forwards) == (y.steps, y.row_forwards)
