"""Token-for-token parity with the reference loops (and Fast-dLLM's cached loops), decoding a
mixed-length batch at once.

The references (Fast-dLLM's ``generate()`` for LLaDA, Dream's ``diffusion_generate``) run one
prompt at a time through the families' own modeling code; dlmsearch decodes all prompts of
different lengths in one batch through its native models. Tokens and model-call counts must
be equal for every prompt.
"""

from __future__ import annotations

import pytest
import torch
from conftest import engine_for, mixed_batch, text_decoder
from tiny_checkpoints import dream_generate, llada_generate, llada_generate_cached, requires_upstream

pytestmark = requires_upstream


@pytest.mark.parametrize("gen_length,block_length,steps", [(16, 8, 16), (16, 8, 8), (24, 8, 12), (16, 16, 6)])
def test_llada_schedule_matches_generate(checkpoints, gen_length: int, block_length: int, steps: int) -> None:
    spec = checkpoints["llada"]
    requests = mixed_batch(spec, gen_length)
    results = text_decoder("llada", f"decoder.commit.steps={steps}", gen_length=gen_length).decode(
        engine_for(spec, "llada"), requests, block_length
    )
    for request, result in zip(requests, results):
        expected, nfe = llada_generate(
            spec.upstream,
            request.prompt,
            steps=steps,
            gen_length=gen_length,
            block_length=block_length,
            mask_id=spec.mask_id,
        )
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
        assert result.steps == nfe


@pytest.mark.parametrize("threshold", [0.9, 0.5, 0.2])
@pytest.mark.parametrize("block_length", [8, 16])
def test_fast_dllm_threshold_matches_generate(checkpoints, threshold: float, block_length: int) -> None:
    spec, gen_length = checkpoints["llada"], 16
    requests = mixed_batch(spec, gen_length, seed=1)
    decoder = text_decoder("fast_dllm", f"decoder.commit.threshold={threshold}", gen_length=gen_length)
    results = decoder.decode(engine_for(spec, "llada"), requests, block_length)
    for request, result in zip(requests, results):
        expected, nfe = llada_generate(
            spec.upstream,
            request.prompt,
            steps=gen_length,
            gen_length=gen_length,
            block_length=block_length,
            threshold=threshold,
            mask_id=spec.mask_id,
        )
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
        assert result.steps == nfe


@pytest.mark.parametrize(
    "ordering,alg", [("confidence", "maskgit_plus"), ("margin", "topk_margin"), ("neg_entropy", "entropy")]
)
@pytest.mark.parametrize("steps", [16, 6])
def test_dream_preset_without_truncation_matches_diffusion_generate(
    checkpoints, ordering: str, alg: str, steps: int
) -> None:
    """``diffusion_generate(top_k=None, top_p=None)``: the preset with its top-k 50 turned off
    (``decoder.sampling.top_k=null``); at its own defaults, see ``test_sampling_parity``."""
    spec, gen_length = checkpoints["dream"], 16
    requests = mixed_batch(spec, gen_length, seed=2)
    decoder = text_decoder(
        "dream",
        f"decoder.commit.steps={steps}",
        f"decoder.commit.ordering={ordering}",
        "decoder.sampling.top_k=null",
        "decoder.sampling.top_p=null",
        gen_length=gen_length,
    )
    results = decoder.decode(engine_for(spec, "dream"), requests, block_length=8)  # the preset's own single block wins
    for request, result in zip(requests, results):
        expected, calls = dream_generate(
            spec.upstream, request.prompt, steps=steps, gen_length=gen_length, alg=alg, top_k=None, top_p=None
        )
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
        assert result.steps == calls == steps


def blocks_done_in_one_call(result, block_length: int) -> int:
    """Blocks whose every position was committed by a single model call."""
    calls = result.commit_call.view(-1, block_length)
    return int((calls == calls[:, :1]).all(dim=1).sum())


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize(
    "preset,setting", [("llada", 8), ("llada", 16), ("fast_dllm", 0.9), ("fast_dllm", 0.5), ("fast_dllm", 0.2)]
)
def test_cached_decoding_matches_fast_dllm_cache_loops(checkpoints, cache: str, preset: str, setting: float) -> None:
    """``engine.cache=prefix|dual`` against ``generate_with_prefix_cache`` / ``generate_with_dual_cache``.

    Tokens are identical. Fast-dLLM's cached loops always make one cached call after a block's
    refresh call, even when the refresh call already filled the block (that call commits
    nothing); dlmsearch does not, so upstream's count is ours plus the blocks done in one call.
    """
    spec, gen_length, block_length = checkpoints["llada"], 16, 8
    requests = mixed_batch(spec, gen_length, seed=3)
    override = f"decoder.commit.steps={setting}" if preset == "llada" else f"decoder.commit.threshold={setting}"
    engine = engine_for(spec, "llada", cache=cache)
    results = text_decoder(preset, override, gen_length=gen_length).decode(engine, requests, block_length)
    for request, result in zip(requests, results):
        expected, nfe = llada_generate_cached(
            spec.upstream,
            request.prompt,
            cache=cache,
            steps=setting if preset == "llada" else gen_length,
            gen_length=gen_length,
            block_length=block_length,
            threshold=None if preset == "llada" else setting,
            mask_id=spec.mask_id,
        )
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
        assert result.steps + blocks_done_in_one_call(result, block_length) == nfe
