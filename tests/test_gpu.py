"""GPU checks (marked ``gpu``; skipped without CUDA): the native models and caches on CUDA in
float32 and bfloat16. ``scripts/gpu_check.sh`` runs them with the engine benchmark."""

from __future__ import annotations

import pytest
import torch
from conftest import text_decoder
from family_models import BLOCK, GEN, MASK_ID, VOCAB, requests_for, tiny_family_model

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.engine.rollout import RolloutEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def decode(
    family: str,
    device: str,
    dtype: str,
    cache: str,
    preset: str = "fast_dllm",
    compile_: bool = False,
    lengths=(3, 9, 6),
):
    adapter = ModelAdapter(
        module=tiny_family_model(family),
        mask_id=MASK_ID,
        vocab_size=VOCAB,
        shift_logits=family == "dream",
        device=device,
        dtype=dtype,
    )
    engine = RolloutEngine(adapter=adapter, cache=cache, compile=compile_)
    return text_decoder(preset, gen_length=GEN).decode(engine, requests_for(list(lengths), seed=0), BLOCK)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_cuda_float32_agrees_with_cpu(family: str, cache: str) -> None:
    cpu, cuda = decode(family, "cpu", "float32", cache), decode(family, "cuda", "float32", cache)
    agree = sum(int((a.tokens == b.tokens).sum()) for a, b in zip(cpu, cuda)) / (len(cpu) * GEN)
    assert agree >= 0.9


@pytest.mark.parametrize("preset", ["fast_dllm", "adalook", "llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_cuda_bfloat16_decodes(preset: str, cache: str) -> None:
    for result in decode("llada", "cuda", "bfloat16", cache, preset):
        assert not (result.tokens == MASK_ID).any() and result.steps >= 1 and result.token_forwards > 0


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_cuda_compiled_agrees_with_eager(cache: str) -> None:
    """engine.compile on CUDA (Triton kernels): float32 tokens agree with eager CUDA."""
    eager, compiled = (
        decode("llada", "cuda", "float32", cache, "adalook"),
        decode("llada", "cuda", "float32", cache, "adalook", compile_=True),
    )
    agree = sum(int((a.tokens == b.tokens).sum()) for a, b in zip(eager, compiled)) / (len(eager) * GEN)
    assert agree >= 0.9


def test_cuda_mixed_windows_are_batch_invariant() -> None:
    """One cached forward per call on CUDA: each sample decodes what it decodes alone."""
    adapter = ModelAdapter(
        module=tiny_family_model("llada"), mask_id=MASK_ID, vocab_size=VOCAB, device="cuda", dtype="float32"
    )
    decoder = text_decoder("adalook", gen_length=GEN)
    requests = requests_for([3, 9, 6], seed=0)
    batched = decoder.decode(RolloutEngine(adapter=adapter, cache="dual"), requests, BLOCK)
    for request, result in zip(requests, batched):
        alone = decoder.decode(RolloutEngine(adapter=adapter, cache="dual"), [request], BLOCK)[0]
        assert torch.equal(alone.tokens, result.tokens)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_diffusion_gemma_decodes_and_float32_agrees_with_cpu(dtype: str) -> None:
    """The uniform-noise path on CUDA: transformers' modules with the stacked prefixes; in float32
    the tokens equal the CPU decode's (sharp logits), in bfloat16 it decodes valid ids."""
    from diffusion_gemma_models import EOS, tiny_diffusion_gemma

    from dlmsearch.core.sampling import Sampling
    from dlmsearch.models.diffusion_gemma import DiffusionGemmaAdapter
    from dlmsearch.search.components.uniform_noise_steps import UniformNoiseSteps
    from dlmsearch.search.decode.intake import DecodeRequest
    from dlmsearch.search.driver import SearchDecoder

    def run(device: str, dtype: str) -> list[list[int]]:
        model = tiny_diffusion_gemma(seed=3, moe=True)
        vocab = model.config.get_text_config().vocab_size
        adapter = DiffusionGemmaAdapter(
            module=model, mask_id=None, vocab_size=vocab, stop_ids=[EOS], canvas_length=8, device=device, dtype=dtype
        )
        decoder = SearchDecoder(commit=UniformNoiseSteps(max_steps=6), sampling=Sampling(confidence="sampling"))
        requests = [
            DecodeRequest(uid=i, prompt=torch.tensor(p), generation=torch.full((16,), vocab), seed=i)
            for i, p in enumerate([[5, 6, 7], [10, 11, 12, 13, 14, 15], [3]])
        ]
        return [r.tokens.tolist() for r in decoder.decode(RolloutEngine(adapter), requests, 8)]

    found = run("cuda", dtype)
    assert all(0 <= t < 96 for row in found for t in row)
    if dtype == "float32":
        assert found == run("cpu", "float32")
