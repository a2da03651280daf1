"""A forward's writes to its slots' stores wait until the whole forward succeeded (issue 47, the
class of defect 5): a uniform-noise canvas memory (self-conditioning input, drafts, repeats) and
KLASS's history are written by code that runs before later out-of-memory sites of the same forward
(the device-to-host transfer; in a tensor-parallel group, any rank's failure). A forward retried
after running out of memory must read every store as it was, so an injected out-of-memory in any
later forward changes no record: tokens, commit order, counters."""

from __future__ import annotations

import functools

import paradigm_models
import pytest
import torch
from conftest import record, text_decoder
from family_models import BLOCK, requests_for
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.search.engine.rollout import RolloutEngine

torch.set_num_threads(1)


class OutOfMemoryAt:
    """``RolloutEngine._to_host`` (each forward's one device-to-host transfer, after every store
    write its summaries compute) running out of memory once, at its ``at``-th call."""

    def __init__(self, at: int) -> None:
        self.at, self.calls, self.real = at, 0, RolloutEngine._to_host

    def __call__(self, engine: RolloutEngine, *args, **kwargs) -> dict:
        self.calls += 1
        if self.calls == self.at:
            raise torch.OutOfMemoryError("CUDA out of memory (injected in the transfer to the host)")
        return self.real(engine, *args, **kwargs)


def _injected(decode, at: int, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """``decode()`` with one out-of-memory injected at the ``at``-th transfer; it must have happened."""
    inject = OutOfMemoryAt(at)
    with monkeypatch.context() as patch:
        patch.setattr(RolloutEngine, "_to_host", lambda engine, *a, **k: inject(engine, *a, **k))
        records = decode()
    assert inject.calls > at, "the injected out-of-memory never happened: the test checks nothing"
    return records


def _klass() -> list[tuple]:
    engine = RolloutEngine(adapter=paradigm_models.adapter("masked"), row_budget=64)
    return [record(r) for r in text_decoder("klass").decode(engine, requests_for([2, 9, 5], seed=3), BLOCK)]


@functools.cache
def _klass_expected() -> list[tuple]:
    return _klass()


@pytest.mark.parametrize("at", [2, 3, 4])  # while divergences still decide (later ones sit far below the bound)
def test_klass_history_is_kept_only_after_its_forward_succeeded(at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry must measure each position's divergence against the previous step, not this one."""
    assert _injected(_klass, at, monkeypatch) == _klass_expected()


def _uniform() -> list[tuple]:
    case = "uniform/none"
    decoder, requests = paradigm_models.decoder(case, "llada"), paradigm_models.requests(case, seed=5)
    engine = paradigm_models.engine(case, row_budget=64)
    return [record(r) for r in decoder.decode(engine, requests, paradigm_models.block_length(case))]


@functools.cache
def _uniform_expected() -> list[tuple]:
    return _uniform()


@settings(max_examples=4, deadline=None)
@given(at=st.integers(2, 8))  # any forward but the first (the decode runs about ten)
def test_uniform_noise_memory_is_kept_only_after_its_forward_succeeded(at: int) -> None:
    """The retry must condition on the previous step's logits and count this draft's repeat once."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _injected(_uniform, at, monkeypatch) == _uniform_expected()
