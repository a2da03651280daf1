"""The rollout engine and model adapter: counters, randomness, chunking, clear failures."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import MASK_ID, VOCAB, CountingModule, make_requests, text_decoder, tiny_denoiser
from torch import nn

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.randomness import hashed_uniform


@pytest.mark.parametrize("preset", ["llada", "fast_dllm", "ete", "adalook"])
def test_counters_equal_model_calls(preset: str) -> None:
    counting = CountingModule(tiny_denoiser())
    engine = RolloutEngine(adapter=ModelAdapter(module=counting, mask_id=MASK_ID, vocab_size=VOCAB), row_budget=1000)
    decoder = text_decoder(preset)
    [result] = decoder.decode(engine, make_requests([4], 16), block_length=8)
    assert result.steps == len(counting.calls)
    assert result.row_forwards == sum(counting.calls)
    counting.calls.clear()
    results = decoder.decode(engine, make_requests([4, 2, 6], 16, seed=3), block_length=8)
    assert sum(r.row_forwards for r in results) == sum(counting.calls)
    assert max(r.steps for r in results) <= len(counting.calls) <= sum(r.steps for r in results)


def test_row_budget_chunks_without_changing_results(adapter: ModelAdapter) -> None:
    decoder = text_decoder("adalook")
    requests = make_requests([3, 5, 1], 16, seed=1)
    wide = decoder.decode(RolloutEngine(adapter=adapter, row_budget=512), requests, block_length=8)
    narrow = decoder.decode(RolloutEngine(adapter=adapter, row_budget=2), requests, block_length=8)
    for a, b in zip(wide, narrow):
        assert torch.equal(a.tokens, b.tokens)
        assert (a.steps, a.row_forwards) == (b.steps, b.row_forwards)


def test_sampling_is_seeded_and_batch_invariant(adapter: ModelAdapter) -> None:
    decoder = text_decoder("fast_dllm")
    requests = make_requests([3, 5, 1, 4], 16, seed=2)
    first = decoder.decode(RolloutEngine(adapter=adapter, temperature=1.0, seed=7), requests, block_length=8)
    again = decoder.decode(RolloutEngine(adapter=adapter, temperature=1.0, seed=7), requests, block_length=8)
    other = decoder.decode(RolloutEngine(adapter=adapter, temperature=1.0, seed=8), requests, block_length=8)
    greedy = decoder.decode(RolloutEngine(adapter=adapter, temperature=0.0), requests, block_length=8)
    alone = decoder.decode(RolloutEngine(adapter=adapter, temperature=1.0, seed=7), requests[2:3], block_length=8)
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(first, again))
    assert any(not torch.equal(a.tokens, b.tokens) for a, b in zip(first, other))
    assert any(not torch.equal(a.tokens, b.tokens) for a, b in zip(first, greedy))
    assert torch.equal(alone[0].tokens, first[2].tokens)


def test_hashed_uniform_is_uniform_and_keyed() -> None:
    draws = hashed_uniform([torch.tensor(0), torch.arange(200)[:, None], torch.arange(500)[None, :]])
    assert draws.shape == (200, 500)
    assert 0.0 <= float(draws.min()) and float(draws.max()) < 1.0
    assert abs(float(draws.mean()) - 0.5) < 0.01
    assert abs(float(draws.var()) - 1 / 12) < 0.005
    histogram = torch.histc(draws, bins=10, min=0, max=1) / draws.numel()
    assert float((histogram - 0.1).abs().max()) < 0.01
    same = hashed_uniform([torch.tensor(0), torch.arange(200)[:, None], torch.arange(500)[None, :]])
    other_seed = hashed_uniform([torch.tensor(1), torch.arange(200)[:, None], torch.arange(500)[None, :]])
    assert torch.equal(draws, same) and not torch.equal(draws, other_seed)


def test_proposals_never_use_the_mask_token() -> None:
    model = tiny_denoiser()
    with torch.no_grad():
        model.head.bias[MASK_ID] = 50.0  # the raw model would propose the mask everywhere
    engine = RolloutEngine(adapter=ModelAdapter(module=model, mask_id=MASK_ID, vocab_size=VOCAB))
    [result] = text_decoder("fast_dllm").decode(engine, make_requests([3], 16), block_length=8)
    assert not (result.tokens == MASK_ID).any()


def test_mask_id_outside_vocabulary_fails_clearly() -> None:
    with pytest.raises(ValueError, match=r"mask_id=24 is outside the vocabulary \[0, 24\)"):
        ModelAdapter(module=tiny_denoiser(), mask_id=24, vocab_size=VOCAB)


def test_nan_logits_fail_naming_the_sample() -> None:
    class NaNModel(nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
            logits = torch.zeros(*input_ids.shape, VOCAB)
            logits[-1, -1, 0] = math.nan
            return logits

    engine = RolloutEngine(adapter=ModelAdapter(module=NaNModel(), mask_id=MASK_ID, vocab_size=VOCAB))
    requests = make_requests([2, 2], 8)
    with pytest.raises(FloatingPointError, match=r"NaN logits for sample uid\(s\) \[1\]"):
        text_decoder("llada", gen_length=8).decode(engine, requests, block_length=8)


def test_wrong_logit_shape_fails_clearly() -> None:
    class Short(nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
            return torch.zeros(*input_ids.shape, VOCAB - 4)

    engine = RolloutEngine(adapter=ModelAdapter(module=Short(), mask_id=MASK_ID, vocab_size=VOCAB))
    with pytest.raises(ValueError, match="expected \\[rows, length, >= 24\\]"):
        text_decoder("llada", gen_length=8).decode(engine, make_requests([2], 8), block_length=8)


def test_shift_logits_moves_predictions_right(adapter: ModelAdapter) -> None:
    shifted = ModelAdapter(module=adapter.module, mask_id=MASK_ID, vocab_size=VOCAB, shift_logits=True)
    tokens = torch.randint(0, MASK_ID, (2, 9))
    attention = torch.ones_like(tokens, dtype=torch.bool)
    plain, moved = adapter.logits(tokens, attention), shifted.logits(tokens, attention)
    assert torch.equal(moved[:, 1:], plain[:, :-1]) and torch.equal(moved[:, 0], plain[:, 0])


def test_engine_rejects_bad_settings(adapter: ModelAdapter) -> None:
    with pytest.raises(ValueError, match="row_budget"):
        RolloutEngine(adapter=adapter, row_budget=0)
    with pytest.raises(TypeError, match="temperature must be a number"):
        RolloutEngine(adapter=adapter, temperature="hot")  # type: ignore[arg-type]


def test_prompt_longer_than_the_model_fails_clearly() -> None:
    adapter = ModelAdapter(module=tiny_denoiser(max_len=40), mask_id=MASK_ID, vocab_size=VOCAB, max_length=40)
    requests = make_requests([4, 30], 16)
    with pytest.raises(
        ValueError,
        match=r"canvas of sample uid 1 \(prompt 30 \+ generation 16\) is 46 tokens, longer than the model's maximum length of 40",
    ):
        text_decoder("llada").decode(RolloutEngine(adapter=adapter), requests, block_length=8)


def test_prompt_ids_outside_vocabulary_fail_clearly(adapter: ModelAdapter) -> None:
    requests = make_requests([4, 3], 16)
    requests[1].prompt[0] = 99
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 24\) in sample uid\(s\) \[1\]"):
        text_decoder("llada").decode(RolloutEngine(adapter=adapter), requests, block_length=8)


def test_text_model_path_must_be_a_local_model_directory(tmp_path) -> None:
    from dlmsearch.models.loading import load_text_model

    ids = dict(mask_id=126336, vocab_size=126464, stop_ids=[126081])
    with pytest.raises(ValueError, match="model.path is required"):
        load_text_model("???", "llada", **ids)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_text_model(str(tmp_path / "nowhere"), "llada", **ids)
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_text_model(str(tmp_path), "llada", **ids)


def test_an_automatic_row_budget_fits_the_device_and_changes_nothing(adapter) -> None:
    from dlmsearch.search.engine.row_budget import model_shape, row_bytes

    shape = model_shape(adapter.module)
    assert row_bytes(shape, 64, 32, 4, False) > row_bytes(shape, 32, 16, 4, False) and row_bytes(
        shape, 32, 16, 4, True
    ) > row_bytes(shape, 32, 16, 4, False)
    requests = make_requests([3, 6, 2], 16, seed=4)
    fixed = text_decoder("adalook").decode(RolloutEngine(adapter=adapter, row_budget=2), requests, 8)
    engine = RolloutEngine(adapter=adapter, row_budget="auto")
    auto = text_decoder("adalook").decode(engine, requests, 8)
    assert 1 <= engine.auto_budget <= 4096
    assert all(
        torch.equal(a.tokens, b.tokens) and (a.steps, a.row_forwards) == (b.steps, b.row_forwards)
        for a, b in zip(fixed, auto)
    )
    for bad in (0, "many", 2.5, True):
        with pytest.raises(ValueError, match="row_budget must be a positive integer or auto"):
            RolloutEngine(adapter=adapter, row_budget=bad)
