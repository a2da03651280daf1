"""A decode session admits and evicts samples between steps without changing anyone else's
decode: every sample's tokens, commit record and counters are what it gets decoded alone."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import NoRepeatVerifier, record, renumbered, text_decoder
from family_models import BLOCK, GEN, adapter_for, requests_for

from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.session import DecodeSession

torch.set_num_threads(1)

# One preset per mechanism a session must carry across admissions: schedules (llada, dream), thresholds
# (fast_dllm), lookahead and re-evaluation (adalook, beam_adalook), populations with resampling and a
# verifier (smc, verified_best_of_n), revisions that read the previous round (saber, remdm), KLASS's history.
PRESETS = [
    "llada",
    "dream",
    "fast_dllm",
    "adalook",
    "beam_adalook",
    "smc",
    "verified_best_of_n",
    "saber",
    "remdm",
    "klass",
]


@functools.cache
def adapter(family: str):
    return adapter_for(family, True)


CASES = [(preset, "none") for preset in PRESETS] + [
    (preset, cache) for preset in ("fast_dllm", "adalook", "smc") for cache in ("prefix", "dual")
]


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "cache"), CASES)
def test_joining_and_leaving_change_no_other_sample(preset: str, cache: str) -> None:
    engine = RolloutEngine(adapter=adapter("llada"), cache=cache, row_budget=256)
    decoder, verifier = text_decoder(preset), NoRepeatVerifier()
    try:
        session = DecodeSession.open(decoder, engine, GEN, BLOCK, verifier)
    except ValueError as refused:  # klass and wino refuse some caches, once, before any forward
        assert "cache" in str(refused)
        pytest.skip(str(refused))
    first = requests_for([3, 5, 4], seed=1)
    later = renumbered(requests_for([11, 2], seed=2), 100)  # a longer prompt than any running one: the canvases widen
    session.admit(first)
    finished = {r.uid: r for r in session.step() + session.step()}
    session.admit(later)
    finished.update({r.uid: r for r in session.step()})
    running = [uid for uid in session.uids if uid < 100]
    victim = running[-1] if running else None  # a client that went away mid-decode
    session.evict([victim])
    finished.update({r.uid: r for r in session.run()})
    assert victim not in finished and session.state is None
    for request in [r for r in first + later if r.uid != victim]:
        [alone] = decoder.decode(
            RolloutEngine(adapter=adapter("llada"), cache=cache), [request], BLOCK, verifier=verifier
        )
        assert record(finished[request.uid]) == record(alone), f"{preset}/{cache}: sample uid {request.uid} changed"


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_sample_admitted_into_a_wider_cached_decode_matches_alone(family: str) -> None:
    """Dream's shifted logits and the dual cache: the stored keys and values are left-padded when a longer prompt joins."""
    engine = RolloutEngine(adapter=adapter(family), cache="dual", row_budget=256)
    decoder = text_decoder("fast_dllm")
    session = DecodeSession.open(decoder, engine, GEN, BLOCK)
    short, long_ = requests_for([2], seed=4), renumbered(requests_for([12], seed=5), 10)
    session.admit(short)
    done = session.step()
    session.admit(long_)
    done += session.run()
    by_uid = {r.uid: r for r in done}
    for request in short + long_:
        [alone] = decoder.decode(RolloutEngine(adapter=adapter(family), cache="dual"), [request], BLOCK)
        assert record(by_uid[request.uid]) == record(alone)


def test_a_uid_cannot_decode_twice() -> None:
    session = DecodeSession.open(text_decoder("fast_dllm"), RolloutEngine(adapter=adapter("llada")), GEN, BLOCK)
    session.admit(requests_for([3], seed=1))
    with pytest.raises(ValueError, match="already decoding"):
        session.admit(requests_for([4], seed=2))
