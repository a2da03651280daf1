"""Parity of the adaptive KV caches with their authors' licensed code, one prompt at a time.

dLLM-Cache (``../shared/upstream/dllm-cache``, Apache-2.0): its LLaDA ``generate()`` (LLaDA's fixed
schedule) with its hooks on the upstream LLaDA must give the tokens dlmsearch's ``llada`` preset
gives with ``cache=dllm_cache`` at the same K_p, K_r and rho. Excluded: its classifier-free
guidance branch (dlmsearch refuses guidance with a cache) and batches (its clock is one per
process and it ignores padding; dlmsearch's batching is checked against decoding alone in
tests/test_adaptive_caches.py).
"""

from __future__ import annotations

import pytest
import torch
from conftest import engine_for, mixed_batch, text_decoder
from tiny_checkpoints import requires_upstream
from upstream import UPSTREAM, dllm_cache_generate

from dlmsearch.search.engine.adaptive import DLLMCache
from dlmsearch.search.engine.rollout import RolloutEngine

pytestmark = [
    requires_upstream,
    pytest.mark.skipif(
        not (UPSTREAM.parent / "dllm-cache" / "dllm_cache").is_dir(),
        reason=f"dLLM-Cache's reference code not found beside {UPSTREAM}",
    ),
]


@pytest.mark.parametrize(
    ("prompt_interval", "response_interval", "ratio", "gen_length", "block_length", "steps"),
    [
        (50, 7, 0.25, 16, 8, 16),
        (3, 2, 0.5, 16, 8, 8),
        (4, 3, 0.0, 24, 8, 12),
        (100, 5, 0.25, 16, 16, 16),
        (1, 1, 0.25, 16, 8, 16),
    ],
    ids=["llada-instruct-defaults", "short-intervals", "no-adaptive-update", "one-block", "every-step"],
)
def test_dllm_cache_matches_its_generate(
    checkpoints,
    prompt_interval: int,
    response_interval: int,
    ratio: float,
    gen_length: int,
    block_length: int,
    steps: int,
) -> None:
    spec = checkpoints["llada"]
    adapter = engine_for(spec, "llada").adapter
    policy = DLLMCache(prompt_interval=prompt_interval, response_interval=response_interval, ratio=ratio)
    decoder = text_decoder("llada", f"decoder.commit.steps={steps}", gen_length=gen_length)
    changed = 0  # tokens the cache changes against the uncached decode: the parity must not be vacuous
    for request in mixed_batch(spec, gen_length, seed=2):
        result = decoder.decode(RolloutEngine(adapter=adapter, cache=policy), [request], block_length)[0]
        changed += int(
            (result.tokens != decoder.decode(RolloutEngine(adapter=adapter), [request], block_length)[0].tokens).sum()
        )
        expected = dllm_cache_generate(
            spec.upstream,
            request.prompt,
            steps=steps,
            gen_length=gen_length,
            block_length=block_length,
            prompt_interval=prompt_interval,
            response_interval=response_interval,
            ratio=ratio,
            mask_id=spec.mask_id,
        )
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
    every_step = prompt_interval == response_interval == 1
    assert (changed == 0) if every_step else (changed > 0), f"{changed} tokens differ from the uncached decode"


# d2Cache (../shared/upstream/d2cache, Apache-2.0). Its generate loop cannot run here: its package imports
# loguru, python-dotenv and accelerate at import (none is a dlmsearch dependency) and its models are written
# for transformers 4.52.4 (dlmsearch's tests run 5.x). Its selection's two numerical pieces are in
# src/utils/common.py, which needs torch alone: dlmsearch's must compute what they compute.
D2CACHE_COMMON = UPSTREAM.parent / "d2cache" / "src" / "utils" / "common.py"
needs_d2cache = pytest.mark.skipif(
    not D2CACHE_COMMON.is_file(), reason=f"d2Cache's reference code not found at {D2CACHE_COMMON}"
)


def d2cache_common():
    from upstream import _load_file

    return _load_file("dlmsearch_upstream_d2cache_common", D2CACHE_COMMON)


@needs_d2cache
@pytest.mark.parametrize("sigma", [10.0, 2.0, 0.7])
@pytest.mark.parametrize("length", [1, 7, 64, 256])
def test_certainty_density_matches_d2cache(sigma: float, length: int) -> None:
    from dlmsearch.search.engine.adaptive.d2cache import certainty_density

    generator = torch.Generator().manual_seed(length)
    decoded = torch.rand(5, length, generator=generator) < torch.linspace(0.0, 1.0, 5)[:, None]
    decoded[3, -1], decoded[4, -1] = False, True  # both right-boundary rules
    expected = d2cache_common().certainty_density(decoded, sigma).double()
    assert torch.allclose(certainty_density(decoded, sigma), expected, atol=1e-5)


@needs_d2cache
@pytest.mark.parametrize("top_p", [0.0, 0.1, 0.5, 1.0])
def test_rollout_nucleus_matches_d2cache(top_p: float) -> None:
    from dlmsearch.search.engine.adaptive.d2cache import nucleus

    generator = torch.Generator().manual_seed(7)
    scores = torch.rand(6, 40, generator=generator) ** 3
    allowed = torch.rand(6, 40, generator=generator) < 0.7
    expected = d2cache_common().nucleus_select(scores, top_p, mask=allowed)
    assert torch.equal(nucleus(scores.double(), top_p, allowed), expected)
