"""The one bound on a sample's rounds, met by every intake: a sample that its decoder never finishes
fails the step with ``did not finish sample uid(s) [...] within N rounds`` (N: ``plan.max_rounds()``),
in the offline loop (``SearchDecoder.decode``) and in a session (a run's, a server's) alike, before
any forward past the bound; the samples beside it that finished first are what they are decoded alone.
"""

from __future__ import annotations

import re

import attrs
import pytest
import torch
from conftest import make_requests, record, text_decoder
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.search.components.commit import ThresholdRule
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.session import DecodeSession

GEN, BLOCK = 16, 8
STALL = 22  # a prompt that starts with this id never gets a token committed (the other prompts hold none)


def stalling(select):
    """``ThresholdRule.select`` that commits nothing on a canvas whose prompt holds ``STALL``."""

    def selected(rule: ThresholdRule, canvas, evaluation, layout) -> torch.Tensor:
        stalled = (canvas.tokens[:, : layout.gen_start] == STALL).any(dim=1, keepdim=True)
        return select(rule, canvas, evaluation, layout) & ~stalled

    return selected


def requests(stalled: set[int]):
    out = make_requests([3, 5, 4], GEN, seed=3)
    out = [attrs.evolve(r, prompt=r.prompt % STALL) for r in out]
    for r in out:
        if r.uid in stalled:
            r.prompt[0] = STALL
    return out


@settings(max_examples=6, deadline=None)
@given(stalled=st.sets(st.integers(0, 2), min_size=1))
def test_a_sample_that_never_finishes_fails_naming_it(adapter, stalled: set[int]) -> None:
    engine, decoder = RolloutEngine(adapter=adapter), text_decoder("fast_dllm", gen_length=GEN)
    limit = decoder.plan(engine, GEN, BLOCK).max_rounds()
    alone = {r.uid: record(decoder.decode(engine, [r], BLOCK)[0]) for r in requests(set()) if r.uid not in stalled}
    bound = re.escape(f"decoder 'fast_dllm' did not finish sample uid(s) {sorted(stalled)} within {limit} rounds")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(ThresholdRule, "select", stalling(ThresholdRule.select))
        with pytest.raises(RuntimeError, match=bound):
            decoder.decode(engine, requests(stalled), BLOCK)
        session = DecodeSession.open(decoder, engine, GEN, BLOCK)
        session.admit(requests(stalled))
        finished = {}
        with pytest.raises(RuntimeError, match=bound):
            for _ in range(limit + 1):  # the bound's round, and one more where a session would step on
                finished |= {r.uid: record(r) for r in session.step()}
    assert finished == alone
    assert sorted(session.uids) == sorted(stalled), "the step that refused left the decode as it was"
