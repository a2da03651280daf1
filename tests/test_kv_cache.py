"""The KV cache without copies: fresh keys written in place, branches in the cache's tail, and one
forward for every cached row of a call whatever its window."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import text_decoder
from family_models import BLOCK, adapter_for, requests_for

from dlmsearch.models.kv_storage import KVStorage, lanes_of
from dlmsearch.search.engine.rollout import RolloutEngine

torch.set_num_threads(1)


def test_lanes_rank_rows_within_their_slot() -> None:
    assert lanes_of(torch.tensor([2, 0, 2, 1, 0, 2])).tolist() == [0, 0, 1, 0, 1, 2]


def reference_attention(queries, fresh_keys, fresh_values, keys, values, slot, low, high, real):
    """What a row's attention is by definition: its slot's cached keys with its own window replaced."""
    out = []
    for r in range(len(slot)):
        k, v = keys[slot[r]].clone(), values[slot[r]].clone()
        length = int(high[r] - low[r])
        k[:, low[r] : high[r]] = fresh_keys[r, :, :length]
        v[:, low[r] : high[r]] = fresh_values[r, :, :length]
        attended = F.scaled_dot_product_attention(
            queries[r : r + 1, :, :length], k[None], v[None], attn_mask=real[r][None, None, None]
        )
        out.append(attended[0])
    return out


@pytest.mark.parametrize("slot", [[0, 1, 2], [1, 1, 0, 1], [2, 0, 2]], ids=["one-row-each", "branches", "a-subset"])
def test_cached_attention_equals_the_window_spliced_into_the_cache(slot: list[int]) -> None:
    """Rows of one slot (lookahead branches) each see their own window; rows with different windows share one call."""
    torch.manual_seed(0)
    slots, heads, width, dim, length = 3, 2, 12, 4, 4
    cache = KVStorage()
    cache.reset(slots)
    stored = [(torch.randn(slots, heads, width, dim), torch.randn(slots, heads, width, dim))]
    cache.store(torch.arange(slots), 0, stored, torch.tensor([[5, 9]] * slots), width)
    keys, values = stored[0][0].clone(), stored[0][1].clone()
    slot_t = torch.tensor(slot)
    rows = len(slot)
    low = torch.tensor([5, 6, 7])[slot_t]  # rows of one slot share its window (a hit is the slot's own window)
    high = low + torch.tensor([4, 4, 2])[slot_t]  # slot 2's window is shorter: its query padding must stay invisible
    real = torch.ones(rows, width, dtype=torch.bool)
    real[0, :2] = False  # a left-padded row
    column = low[:, None] + torch.arange(length)[None, :]
    valid = column < high[:, None]
    canvas = torch.arange(width)[None, :]
    cache_visible = real & ((canvas < low[:, None]) | (canvas >= high[:, None]))
    window = cache.window(
        slot_t, torch.where(valid, column, -1), cache_visible, valid[:, None, :].expand(-1, length, -1)
    )
    queries, fresh_k, fresh_v = (torch.randn(rows, heads, length, dim) for _ in range(3))
    window.write(0, fresh_k, fresh_v)
    attended = window.attend(0, queries, grouped=False)
    expected = reference_attention(queries, fresh_k, fresh_v, keys, values, slot, low, high, real)
    for r in range(rows):
        n = int(high[r] - low[r])
        assert torch.allclose(attended[r, :, :n], expected[r], atol=1e-6), r


class WatchedStorage(KVStorage):
    """The decode's key/value storage, recording each cached forward's distinct first columns and the storage's tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.forwards: list[int] = []
        self.storage: set[int] = set()

    def window(self, slot, column, cache_visible, fresh_visible, in_place=None):
        self.forwards.append(len(torch.unique(column[:, 0])))
        made = super().window(slot, column, cache_visible, fresh_visible, in_place)
        self.storage.add(self.layers[0][0].data_ptr())
        return made


class CountingEngine(RolloutEngine):
    """Counts the cached forwards of each model call."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.kv = WatchedStorage()
        self.per_call: list[int] = []

    def memory(self, slots: int):
        memory = super().memory(slots)
        self.kv.reset(slots)
        memory.kv = self.kv
        return memory

    def evaluate(self, *args, **kwargs):
        before = len(self.kv.forwards)
        result = super().evaluate(*args, **kwargs)
        self.per_call.append(len(self.kv.forwards) - before)
        return result


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("preset", ["fast_dllm", "adalook"])
def test_mixed_windows_make_one_forward_with_unchanged_tokens(preset: str, cache: str) -> None:
    """Samples on different blocks share one cached forward per call, each row its own window,
    with the tokens and counters each sample gets alone; the cache is written in place."""
    adapter = adapter_for("llada", True)
    requests = requests_for([2, 9, 5, 12], seed=3)
    decoder = text_decoder(preset)
    engine = CountingEngine(adapter=adapter, cache=cache, row_budget=256)
    batched = decoder.decode(engine, requests, BLOCK)
    assert max(engine.per_call) == 1, "a model call made more than one cached forward"
    assert max(engine.kv.forwards) > 1, "no call mixed rows with different windows"
    assert len(engine.kv.storage) <= 2, "the cache was reallocated more than once (the tail grows at most once here)"
    for request, result in zip(requests, batched):
        alone = decoder.decode(RolloutEngine(adapter=adapter, cache=cache), [request], BLOCK)[0]
        assert torch.equal(alone.tokens, result.tokens) and (alone.steps, alone.row_forwards, alone.token_forwards) == (
            result.steps,
            result.row_forwards,
            result.token_forwards,
        )
