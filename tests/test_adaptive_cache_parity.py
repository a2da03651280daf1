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

from conftest import text_decoder
from dlmsearch.search.engine.adaptive import DLLMCache
from dlmsearch.search.engine.rollout import RolloutEngine
from test_text_parity import engine_for, mixed_batch
from tiny_checkpoints import requires_upstream
from upstream import UPSTREAM, dllm_cache_generate

pytestmark = [
    requires_upstream,
    pytest.mark.skipif(not (UPSTREAM.parent / "dllm-cache" / "dllm_cache").is_dir(), reason=f"dLLM-Cache's reference code not found beside {UPSTREAM}"),
]


@pytest.mark.parametrize(
    ("prompt_interval", "response_interval", "ratio", "gen_length", "block_length", "steps"),
    [(50, 7, 0.25, 16, 8, 16), (3, 2, 0.5, 16, 8, 8), (4, 3, 0.0, 24, 8, 12), (100, 5, 0.25, 16, 16, 16), (1, 1, 0.25, 16, 8, 16)],
    ids=["llada-instruct-defaults", "short-intervals", "no-adaptive-update", "one-block", "every-step"],
)
def test_dllm_cache_matches_its_generate(checkpoints, prompt_interval: int, response_interval: int, ratio: float, gen_length: int, block_length: int, steps: int) -> None:
    spec = checkpoints["llada"]
    adapter = engine_for(spec, "llada").adapter
    policy = DLLMCache(prompt_interval=prompt_interval, response_interval=response_interval, ratio=ratio)
    decoder = text_decoder("llada", f"decoder.commit.steps={steps}", gen_length=gen_length)
    changed = 0  # tokens the cache changes against the uncached decode: the parity must not be vacuous
    for request in mixed_batch(spec, gen_length, seed=2):
        result = decoder.decode(RolloutEngine(adapter=adapter, cache=policy), [request], block_length)[0]
        changed += int((result.tokens != decoder.decode(RolloutEngine(adapter=adapter), [request], block_length)[0].tokens).sum())
        expected = dllm_cache_generate(
            spec.upstream, request.prompt, steps=steps, gen_length=gen_length, block_length=block_length,
            prompt_interval=prompt_interval, response_interval=response_interval, ratio=ratio, mask_id=spec.mask_id,
        )
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
    every_step = prompt_interval == response_interval == 1
    assert (changed == 0) if every_step else (changed > 0), f"{changed} tokens differ from the uncached decode"
