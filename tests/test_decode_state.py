"""The decode loop's state: a step reads the plan and nothing else of the decoder, and a state
older than its slots' stores is refused in one line instead of reading stores written for another."""

from __future__ import annotations

import pytest
import torch
from conftest import MASK_ID, VOCAB, make_requests, record, text_decoder, tiny_denoiser

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.driver import step
from dlmsearch.search.engine.rollout import RolloutEngine

torch.set_num_threads(1)


def _engine() -> RolloutEngine:
    return RolloutEngine(adapter=ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB))


class Refuses:
    """Stands in for every component after the plan is made: any use of it fails the test."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"step read the decoder's own {name} instead of the plan's")


@pytest.mark.parametrize("preset", ["adalook", "smc", "remdm"])
def test_a_step_reads_only_the_plan(preset: str) -> None:
    engine, requests = _engine(), make_requests([5, 7], 16)
    expected = [record(r) for r in text_decoder(preset).decode(engine, requests, 8)]
    decoder = text_decoder(preset)
    state = decoder.start(engine, requests, 8)
    for part in ("commit", "trigger", "candidates", "scorer", "expansion", "selector", "population", "revision"):
        setattr(decoder, part, Refuses())
    while not state.finished:
        state = step(engine, state)
    assert [record(r) for r in decoder.finish(engine, state)] == expected


def test_stepping_an_older_state_is_refused() -> None:
    engine, decoder = _engine(), text_decoder("llada")
    first = decoder.start(engine, make_requests([5, 7], 16), 8)
    second = step(engine, first)
    with pytest.raises(ValueError, match=r"stale: its slots' stores moved on to version 1 \(the state was made at 0\)"):
        step(engine, first)
    with pytest.raises(ValueError, match="stale"):
        decoder.finish(engine, first)
    third = step(engine, second)  # the latest state steps on
    assert third.round_index == 2
