"""Requests that differ only in temperature, top-p and top-k share one forward (the settings
ride along as per-row vectors), and each decodes exactly what it decodes alone with those
settings as the engine's own: tokens, commit record and counters."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import NoRepeatVerifier, record, renumbered, text_decoder
from family_models import BLOCK, GEN, adapter_for, requests_for
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.core.sampling import Sampling
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.engine.summaries import top_k_filter, top_p_filter
from dlmsearch.search.session import DecodeSession

torch.set_num_threads(1)

# Greedy, nucleus, top-k, both, and a plain temperature: what a server's clients send side by side.
MIXED = [
    Sampling(),
    Sampling(temperature=0.7, top_p=0.9),
    Sampling(temperature=1.0, top_k=5),
    Sampling(temperature=0.5, top_p=0.8, top_k=3),
    Sampling(temperature=0.9),
    Sampling(top_k=2),
]


@functools.cache
def adapter(family: str):
    return adapter_for(family, True)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.tuples(st.floats(0.05, 1.5), st.integers(0, 12)), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_per_row_filters_equal_each_rows_own(rows: list[tuple[float, int]], seed: int) -> None:
    """Row r of the vector filters is the scalar filter at row r's setting (1 / 0: untouched)."""
    logits = torch.randn(len(rows), 3, 10, generator=torch.Generator().manual_seed(seed)) * 3
    top_p = torch.tensor([p for p, _ in rows])
    top_k = torch.tensor([k for _, k in rows])
    by_p, by_k = top_p_filter(logits, top_p), top_k_filter(logits, top_k)
    for r, (p, k) in enumerate(rows):
        assert torch.equal(by_p[r], top_p_filter(logits[r : r + 1], p)[0] if p < 1 else logits[r])
        assert torch.equal(by_k[r], top_k_filter(logits[r : r + 1], k)[0] if k > 0 else logits[r])


CASES = [
    ("llada", "llada", "none"),
    ("llada", "fast_dllm", "dual"),
    ("llada", "adalook", "none"),
    ("llada", "smc", "prefix"),
    ("dream", "dream", "none"),
]


@pytest.mark.parametrize(("family", "preset", "cache"), CASES)
def test_mixed_settings_in_one_session_equal_each_alone(family: str, preset: str, cache: str) -> None:
    decoder, verifier = text_decoder(preset), NoRepeatVerifier()
    session = DecodeSession.open(
        decoder, RolloutEngine(adapter=adapter(family), cache=cache, row_budget=256), GEN, BLOCK, verifier
    )
    first = [
        r.__class__(r.uid, r.prompt, r.generation, seed=7 + r.uid, sampling=s)
        for r, s in zip(requests_for([3, 5, 4, 6], seed=1), MIXED)
    ]
    later = [
        r.__class__(r.uid, r.prompt, r.generation, seed=3, sampling=s)
        for r, s in zip(renumbered(requests_for([9, 2], seed=2), 100), MIXED[4:])
    ]
    session.admit(first)
    finished = {r.uid: r for r in session.step()}
    session.admit(later)  # joins mid-decode, a wider canvas, other settings again
    finished.update({r.uid: r for r in session.run()})
    changed = 0  # the settings take effect: some sampled requests decode otherwise than greedily
    for request in first + later:
        own = request.sampling
        engine = RolloutEngine(
            adapter=adapter(family), cache=cache, temperature=own.temperature, top_p=own.top_p, top_k=own.top_k
        )
        plain = request.__class__(request.uid, request.prompt, request.generation, seed=request.seed)
        [alone] = decoder.decode(engine, [plain], BLOCK, verifier=verifier)
        assert record(finished[request.uid]) == record(alone), f"{preset}: uid {request.uid} at {own} changed"
        [greedy] = decoder.decode(
            RolloutEngine(adapter=adapter(family), cache=cache), [plain], BLOCK, verifier=verifier
        )
        changed += record(greedy) != record(alone)
    assert changed >= 2


# (sampling, the commit rule's threshold): per-row thresholds beside per-row sampling
WITH_THRESHOLDS = [
    (Sampling(), None),
    (Sampling(), 0.5),
    (Sampling(temperature=0.7, top_p=0.9), 0.99),
    (Sampling(temperature=1.0), 0.7),
    (Sampling(top_k=3), 0.3),
]


@pytest.mark.parametrize(
    ("preset", "cache", "pinned"),
    [("fast_dllm", "none", []), ("fast_dllm", "dual", []), ("adalook", "none", ["decoder.scorer.threshold=0.9"])],
)
def test_mixed_thresholds_in_one_session_equal_each_alone(preset: str, cache: str, pinned: list[str]) -> None:
    """Requests at their own commit threshold (and sampling) in one session: each decodes what the
    decoder built with that threshold decodes alone (the lookahead's rollouts read it too). AdaLook's
    unlock-gain score follows ``decoder.commit.threshold`` in its config: pinned here, since a row's
    own value is the commit rule's only (the server shares a session only where the plans agree)."""
    decoder, verifier = text_decoder(preset), NoRepeatVerifier()
    session = DecodeSession.open(
        decoder, RolloutEngine(adapter=adapter("llada"), cache=cache, row_budget=256), GEN, BLOCK, verifier
    )
    mine = [
        r.__class__(
            r.uid, r.prompt, r.generation, seed=5 + r.uid, sampling=s, options=None if t is None else {"threshold": t}
        )
        for r, (s, t) in zip(requests_for([3, 5, 4, 6, 2], seed=6), WITH_THRESHOLDS)
    ]
    session.admit(mine[:3])
    finished = {r.uid: r for r in session.step()}
    session.admit(mine[3:])
    finished.update({r.uid: r for r in session.run()})
    steps = set()
    for request, (own, threshold) in zip(mine, WITH_THRESHOLDS):
        own_threshold = [] if threshold is None else [f"decoder.commit.threshold={threshold}"]
        alone_decoder = text_decoder(preset, *own_threshold, *pinned)
        engine = RolloutEngine(
            adapter=adapter("llada"), cache=cache, temperature=own.temperature, top_p=own.top_p, top_k=own.top_k
        )
        plain = request.__class__(request.uid, request.prompt, request.generation, seed=request.seed)
        [alone] = alone_decoder.decode(engine, [plain], BLOCK, verifier=verifier)
        assert record(finished[request.uid]) == record(alone), f"{preset}: uid {request.uid} at {threshold} changed"
        steps.add(alone.steps)
    assert len(steps) >= 2  # the thresholds take effect: the samples take different numbers of steps


def test_an_option_the_rule_cannot_take_per_sample_is_refused() -> None:
    session = DecodeSession.open(text_decoder("llada"), RolloutEngine(adapter=adapter("llada")), GEN, BLOCK)
    [request] = requests_for([3], seed=1)
    with pytest.raises(ValueError, match="cannot take per sample"):
        session.admit([request.__class__(0, request.prompt, request.generation, options={"threshold": 0.5})])
    session = DecodeSession.open(text_decoder("fast_dllm"), RolloutEngine(adapter=adapter("llada")), GEN, BLOCK)
    with pytest.raises(ValueError, match="threshold"):
        session.admit([request.__class__(0, request.prompt, request.generation, options={"threshold": 1.5})])
