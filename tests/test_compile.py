"""engine.compile: the blocks' per-token work under torch.compile, bucketed so a decode compiles a
few graphs, with the tokens eager decoding gives (float32, CPU)."""

from __future__ import annotations

import conftest
import pytest
import torch
from conftest import plan_on, text_decoder, tiny_denoiser
from family_models import BLOCK, MASK_ID, VOCAB, requests_for, tiny_family_model

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.token_ops import bucket
from dlmsearch.search.engine.rollout import RolloutEngine

torch.set_num_threads(1)


def test_buckets_are_four_per_octave_from_sixteen() -> None:
    assert [bucket(n) for n in (1, 16, 17, 64, 65, 96, 320, 576, 1000)] == [16, 16, 32, 64, 80, 96, 320, 640, 1024]
    assert all(n <= bucket(n) <= n + max(15, n // 4) for n in range(1, 5000))


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, cache, preset",
    [("llada", "none", "fast_dllm"), ("llada", "dual", "adalook"), ("dream", "prefix", "fast_dllm")],
)
def test_compiled_decoding_equals_eager(family: str, cache: str, preset: str) -> None:
    def adapter() -> ModelAdapter:  # a fresh model each: compiling changes the module it is given
        return ModelAdapter(
            module=tiny_family_model(family), mask_id=MASK_ID, vocab_size=VOCAB, shift_logits=family == "dream"
        )

    requests = requests_for([3, 9, 5], seed=2)
    decoder = text_decoder(preset)
    eager = decoder.decode(RolloutEngine(adapter=adapter(), cache=cache), requests, BLOCK)
    compiled_adapter = adapter()
    compiled = decoder.decode(RolloutEngine(adapter=compiled_adapter, cache=cache, compile=True), requests, BLOCK)
    for a, b in zip(eager, compiled):
        assert torch.equal(a.tokens, b.tokens) and (a.steps, a.row_forwards, a.token_forwards) == (
            b.steps,
            b.row_forwards,
            b.token_forwards,
        )
    ops = compiled_adapter.module.blocks[0].ops.attention_inputs
    assert 1 <= len(ops.buckets) <= min(8, len(ops.token_counts)), (
        f"{len(ops.buckets)} graphs for {len(ops.token_counts)} token counts"
    )


def test_compile_needs_a_native_model() -> None:
    with pytest.raises(ValueError, match="engine.compile=true compiles the native"):
        plan_on(
            RolloutEngine(
                adapter=ModelAdapter(module=tiny_denoiser(), mask_id=conftest.MASK_ID, vocab_size=conftest.VOCAB),
                compile=True,
            )
        )
