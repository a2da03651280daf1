"""WINO: the shadow block (custom attention in the native models) and its verify-and-re-mask loop."""

from __future__ import annotations

import pytest
import torch
from conftest import MASK_ID, VOCAB, make_requests, text_decoder, tiny_denoiser

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.kv_storage import CachedRows, KVStorage
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.search.engine.rollout import RolloutEngine


def native(layers: int) -> ModelAdapter:
    torch.manual_seed(layers)
    config = TransformerConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_length=64,
    )
    return ModelAdapter(module=BidirectionalTransformer(config), mask_id=MASK_ID, vocab_size=VOCAB)


def padded_rows() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, MASK_ID, (2, 14), generator=generator)
    tokens[:, 10:] = MASK_ID
    attention = torch.ones(2, 14, dtype=torch.bool)
    attention[1, :3] = False  # a left-padded row
    tokens[1, :3] = MASK_ID
    return tokens, attention


@pytest.mark.parametrize("model", ["native", "denoiser"])
def test_the_canvas_never_sees_its_shadow(model: str, adapter: ModelAdapter) -> None:
    if model == "native":
        adapter = native(2)  # else conftest's tiny denoiser
    tokens, attention = padded_rows()
    plain, _ = adapter.window_logits(tokens, attention, 6, 14)
    canvas, shadow, _ = adapter.shadow_logits(tokens, attention, 6, 14, torch.tensor([6, 6]), 4)
    assert torch.allclose(canvas, plain, atol=1e-5) and shadow.shape == (2, 4, VOCAB)


def test_the_shadow_runs_against_a_prefix_cache() -> None:
    """Against a cache of the same canvas, the window and shadow forwarded alone give what the full
    forward gives, for rows with different windows in one forward."""
    adapter = native(2)
    tokens, attention = padded_rows()
    start = torch.tensor([6, 7])
    canvas, shadow, kv = adapter.shadow_logits(tokens, attention, 6, 14, start, 4)
    storage = KVStorage()
    storage.reset(2)
    storage.store(torch.arange(2), 0, kv, torch.tensor([[6, 14], [6, 14]]), 14)
    low = torch.tensor([6, 7])  # the second row's window starts a column later
    cached_canvas, cached_shadow, _ = adapter.shadow_logits(
        tokens, attention, low, 14, start, 4, cached=CachedRows(storage, torch.arange(2))
    )
    assert torch.allclose(cached_canvas[0], canvas[0], atol=1e-5) and torch.allclose(
        cached_canvas[1, :7], canvas[1, 1:], atol=1e-5
    )
    assert torch.allclose(cached_shadow, shadow, atol=1e-5)
    _plain, plain_kv = adapter.window_logits(tokens, attention, 6, 14)
    assert all(
        torch.allclose(k, pk, atol=1e-5) for (k, _), (pk, _) in zip(kv, plain_kv)
    )  # what a refresh stores: the canvas's own


def test_a_shadow_slot_sees_everything_but_its_mirror() -> None:
    """With one layer a shadow slot's output is attention over its visible keys only, so it equals a
    plain forward of exactly those tokens (the canvas without the mirror column, then the shadow)."""
    adapter = native(1)
    tokens, attention = padded_rows()
    start, length = torch.tensor([6, 7]), 4
    _, shadow, _ = adapter.shadow_logits(tokens, attention, 6, 14, start, length)
    module = adapter.module
    for row in range(2):
        real = attention[row].nonzero().squeeze(1)
        positions = torch.arange(len(real))
        column_position = dict(zip(real.tolist(), positions.tolist()))
        for j in range(length):
            mirror = int(start[row]) + j
            keep = [c for c in real.tolist() if c != mirror]
            ids = torch.cat([tokens[row, keep], torch.full((length,), MASK_ID)])[None]
            pos = torch.tensor(
                [column_position[c] for c in keep] + [column_position[int(start[row]) + i] for i in range(length)]
            )[None]
            everything = torch.ones(1, len(pos[0]), len(pos[0]), dtype=torch.bool)
            logits, _ = module.run(ids, None, 0, attention=everything, positions=pos)
            assert torch.allclose(shadow[row, j], logits[0, len(keep) + j], atol=1e-5), (row, j)


def test_wino_verifies_and_remasks_counting_rows_not_steps(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 6], 16, seed=2)
    decoder = text_decoder("wino", "decoder.commit.tau1=0.05", "decoder.revision.tau2=0.999")
    results = decoder.decode(RolloutEngine(adapter=adapter), requests, 8)
    assert sum(int(r.revisions.sum()) for r in results) > 0
    for request, result in zip(requests, results):
        assert not bool((result.tokens == MASK_ID).any())
        assert result.row_forwards == result.steps  # the shadow rides in its row: one row per step
        assert result.token_forwards == result.steps * (
            len(request.prompt) + 16 + 16
        )  # canvas + the shadow of its one block of 16
    alone = [decoder.decode(RolloutEngine(adapter=adapter), [r], 8)[0] for r in requests]
    assert all(torch.equal(a.tokens, b.tokens) and a.steps == b.steps for a, b in zip(alone, results))


def test_wino_decodes_one_block_as_published_unless_told_the_tasks(adapter: ModelAdapter) -> None:
    """The preset's block is the whole generation (every published config) and its tau1 the task's
    (``decoding.wino_tau1``); ``decoder.block_length=null`` decodes the task's blocks of 8."""
    requests = make_requests([3], 16, seed=2)
    assert text_decoder("wino").commit.tau1 == 0.6 and text_decoder("wino", "decoding=countdown").commit.tau1 == 0.5
    for override, shadow in (([], 16), (["decoder.block_length=null"], 8)):
        [result] = text_decoder("wino", *override).decode(RolloutEngine(adapter=adapter), requests, 8)
        assert result.token_forwards == result.steps * (3 + 16 + shadow)


def test_wino_is_refused_where_no_shadow_can_run(adapter: ModelAdapter) -> None:
    from conftest import cached_adapter

    with pytest.raises(ValueError, match="needs cache=none or prefix"):
        text_decoder("wino").decode(RolloutEngine(adapter=cached_adapter(), cache="dual"), make_requests([2], 16), 8)
    shifted = ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB, shift_logits=True)
    with pytest.raises(ValueError, match="needs a model that takes an explicit attention mask"):
        text_decoder("wino").decode(RolloutEngine(adapter=shifted), make_requests([2], 16), 8)
