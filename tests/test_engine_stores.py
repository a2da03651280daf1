"""The engine's per-slot stores stay exact through failures and copies (issue 47, defects 5, 9,
11, 12): a layerwise store is written only after its forward succeeded, so an out-of-memory retry
reads it as it was; a finished sample's copy of the stores shares nothing with the running decode;
a step that fails midway leaves its input state refused; and a failure names the sample's uid,
never the draws key it shares with other samples."""

from __future__ import annotations

import functools

import attrs
import pytest
import torch
from conftest import MASK_ID, VOCAB, make_requests, record, text_decoder, tiny_denoiser
from family_models import BLOCK, adapter_for, requests_for
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search import driver
from dlmsearch.search.engine import rollout
from dlmsearch.search.engine.adaptive import DKVCache, DLLMCache
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.engine.slot_memory import SlotMemory

torch.set_num_threads(1)


# --------------------------------------------------------------------------- defect 5: store after success

# dLLM-Cache's clock and dKV's step counter live in the store: a retry that reads them advanced decides otherwise
LAYERWISE = {
    "dllm_cache": DLLMCache(prompt_interval=5, response_interval=3, ratio=0.25),
    "dkv": DKVCache(refresh_interval=4),
}


class OutOfMemoryAt:
    """``summarise_logits`` (the engine's estimate of a forward's peak) running out of memory once, at its ``at``-th call."""

    def __init__(self, at: int) -> None:
        self.at, self.calls, self.real = at, 0, rollout.summarise_logits

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise torch.OutOfMemoryError("CUDA out of memory (injected in the summaries)")
        return self.real(*args, **kwargs)


@functools.cache
def _layerwise_adapter() -> ModelAdapter:
    return adapter_for("llada", True)


@pytest.mark.parametrize("policy", sorted(LAYERWISE))
def test_an_out_of_memory_in_the_summaries_changes_no_token(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    decoder, requests = text_decoder("fast_dllm"), requests_for([2, 9, 5], seed=3)

    def decode() -> list[tuple]:
        engine = RolloutEngine(adapter=_layerwise_adapter(), cache=LAYERWISE[policy], row_budget=64)
        return [record(r) for r in decoder.decode(engine, requests, BLOCK)]

    expected = decode()
    inject = OutOfMemoryAt(4)  # a later forward of all three rows: the store holds earlier steps by then
    monkeypatch.setattr(rollout, "summarise_logits", inject)
    assert decode() == expected
    assert inject.calls > inject.at, "the injected out-of-memory never happened: the test checks nothing"


# --------------------------------------------------------------------------- defect 9: messages name the uid


class NaNLogits(torch.nn.Module):
    """The tiny denoiser with every logit NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_denoiser()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return torch.full_like(self.inner(input_ids, attention_mask=attention_mask), float("nan"))


class AlwaysOutOfMemory(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")


def _served(uids: list[int]):
    """Requests as the server makes them: each its own uid, every one draws key 0."""
    return [attrs.evolve(r, uid=uid, key=0) for r, uid in zip(make_requests([3] * len(uids), 16), uids)]


@pytest.mark.parametrize(
    "module, error, message",
    [
        (NaNLogits, FloatingPointError, r"NaN logits for sample uid\(s\) \[5, 9\]$"),
        (AlwaysOutOfMemory, torch.OutOfMemoryError, r"single row of sample uid\(s\) \[5\] "),
    ],
    ids=["nan", "out_of_memory"],
)
def test_a_failure_names_the_samples_uid_not_its_draws_key(module, error: type[Exception], message: str) -> None:
    engine = RolloutEngine(adapter=ModelAdapter(module=module(), mask_id=MASK_ID, vocab_size=VOCAB))
    with pytest.raises(error, match=message):
        text_decoder("llada").decode(engine, _served([5, 9]), 8)


# --------------------------------------------------------------------------- defect 11: a copy is a copy


def _filled_memory(slots: int) -> SlotMemory:
    """Every store of ``slots`` slots holding something (keys and values, KLASS's history, a
    layerwise field, transformers' prefix caches, a uniform-noise canvas memory)."""
    from transformers import DynamicCache

    torch.manual_seed(0)
    memory, every = SlotMemory.for_slots(slots), torch.arange(slots)
    memory.kv.store(
        every, 0, [(torch.randn(slots, 2, 6, 4), torch.randn(slots, 2, 6, 4))], torch.tensor([[2, 6]] * slots), 6
    )
    _, keep = memory.history.step(torch.randn(slots, 4, 5), every, 0, torch.ones(slots, dtype=torch.bool))
    keep()  # the engine applies it once the forward succeeded
    memory.layers.ensure("clock", (3,), torch.float32, "cpu", column_axis=1)
    memory.layers.put(every, {"clock": torch.randn(slots, 3)}, torch.ones(slots, dtype=torch.bool))
    for slot in range(slots):
        cache = DynamicCache()
        cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), layer_idx=0)
        memory.prefixes.caches[slot] = cache
        memory.prefixes.end[slot] = 3
    memory.conditioning.remember(
        every,
        torch.full((slots,), 2),
        torch.zeros(slots, dtype=torch.long),
        torch.ones(slots, dtype=torch.bool),
        torch.randn(slots, 4, 5),
        torch.randint(0, 5, (slots, 4)),
    )
    return memory


def _snapshot(memory: SlotMemory) -> list[torch.Tensor]:
    """Every tensor the stores hold, copied."""
    prefixes = [t for c in memory.prefixes.caches for layer in c.layers for t in (layer.keys, layer.values)]
    tensors = [t for pair in memory.kv.layers for t in pair] + [memory.history.probs, memory.history.last]
    tensors += [*memory.layers.fields.values(), *prefixes, memory.conditioning.logits, memory.conditioning.draft]
    return [t.clone() for t in tensors]


def _write_everything(memory: SlotMemory) -> None:
    """What a decode does to its stores: tensors written in place, each prefix cache extended by an encoder call."""
    for pair in memory.kv.layers:
        for t in pair:
            t.add_(1)
    for t in (memory.history.probs, memory.history.last, *memory.layers.fields.values(), memory.conditioning.logits):
        t.add_(1)
    memory.conditioning.draft.fill_(-7)
    for cache in memory.prefixes.caches:
        cache.update(torch.ones(1, 2, 1, 4), torch.ones(1, 2, 1, 4), layer_idx=0)
        cache.layers[0].keys.add_(1)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


@settings(max_examples=15, deadline=None)
@given(taken=st.lists(st.integers(0, 3), min_size=1, max_size=4), write_copy=st.booleans())
def test_a_split_shares_nothing_with_the_running_decode(taken: list[int], write_copy: bool) -> None:
    running = _filled_memory(4)
    part = running.split(torch.tensor(taken))
    kept, written = (running, part) if write_copy else (part, running)
    before = _snapshot(kept)
    _write_everything(written)
    assert _same(_snapshot(kept), before), "writing one decode's stores changed the other's"


# --------------------------------------------------------------------------- defect 12: a failed step's state is stale


def test_a_step_that_failed_midway_leaves_its_state_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = RolloutEngine(adapter=ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB))
    decoder = text_decoder("adalook")
    state = driver.step(engine, decoder.start(engine, make_requests([5, 7], 16), 8))

    def fails(*args, **kwargs):
        raise RuntimeError("injected after the roots were evaluated")

    with monkeypatch.context() as patch:
        patch.setattr(driver, "_select_and_commit", fails)  # the roots' evaluation has written the stores by now
        with pytest.raises(RuntimeError, match="injected"):
            driver.step(engine, state)
    with pytest.raises(ValueError, match=r"^this decode state is stale: its slots' stores moved on"):
        driver.step(engine, state)
    with pytest.raises(ValueError, match="stale"):
        decoder.finish(engine, state)
