"""`llada` and `fast_dllm` reproduce the published reference loops token for token.

The references are written here as plain loops from their descriptions (batch of one, no
padding, temperature 0): LLaDA's low-confidence remasking with semi-autoregressive blocks and
steps split evenly per block (remainder to the first steps), and Fast-dLLM's per-block
threshold rule (commit c >= tau, always at least the most confident).
"""

from __future__ import annotations

import pytest
import torch
from conftest import MASK_ID, make_requests, text_decoder, tiny_denoiser

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.engine.rollout import RolloutEngine


def llada_reference(
    model, prompt: torch.Tensor, gen_length: int, block_length: int, steps: int
) -> tuple[torch.Tensor, int]:
    x = torch.cat([prompt, torch.full((gen_length,), MASK_ID)])[None].clone()
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    calls = 0
    for block in range(num_blocks):
        start = len(prompt) + block * block_length
        end = start + block_length
        masks = int((x[0, start:end] == MASK_ID).sum())
        schedule = [
            masks // steps_per_block + (1 if i < masks % steps_per_block else 0) for i in range(steps_per_block)
        ]
        for i in range(steps_per_block):
            mask_index = x == MASK_ID
            logits = model(x)
            calls += 1
            p = torch.softmax(logits.float(), dim=-1)
            x0 = logits.argmax(dim=-1)
            x0_p = p.gather(-1, x0[..., None]).squeeze(-1)
            x0_p[:, end:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-float("inf")))
            _, index = torch.topk(confidence[0], schedule[i])
            x[0, index] = x0[0, index]
    return x[0, len(prompt) :], calls


def fast_dllm_reference(
    model, prompt: torch.Tensor, gen_length: int, block_length: int, threshold: float
) -> tuple[torch.Tensor, int]:
    x = torch.cat([prompt, torch.full((gen_length,), MASK_ID)])[None].clone()
    calls = 0
    for block in range(gen_length // block_length):
        start = len(prompt) + block * block_length
        end = start + block_length
        while (x[0, start:end] == MASK_ID).any():
            logits = model(x)
            calls += 1
            p = torch.softmax(logits.float(), dim=-1)
            x0 = logits.argmax(dim=-1)[0]
            confidence = p[0].gather(-1, x0[:, None]).squeeze(-1)
            eligible = x[0] == MASK_ID
            eligible[:start] = False
            eligible[end:] = False
            confidence = torch.where(eligible, confidence, torch.tensor(-float("inf")))
            transfer = confidence >= threshold
            transfer[confidence.argmax()] = True
            x[0, transfer] = x0[transfer]
    return x[0, len(prompt) :], calls


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gen_length,block_length,steps", [(16, 8, 16), (16, 4, 8), (24, 8, 9), (32, 32, 10)])
def test_llada_matches_reference(seed: int, gen_length: int, block_length: int, steps: int) -> None:
    model = tiny_denoiser(seed=seed)
    engine = RolloutEngine(adapter=ModelAdapter(module=model, mask_id=MASK_ID, vocab_size=24))
    [request] = make_requests([3 + seed], gen_length, seed=seed)
    expected, calls = llada_reference(model, request.prompt, gen_length, block_length, steps)
    [result] = text_decoder("llada", f"decoder.commit.steps={steps}", gen_length=gen_length).decode(
        engine, [request], block_length
    )
    assert torch.equal(result.tokens, expected)
    assert result.steps == calls


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gen_length,block_length,threshold", [(16, 8, 0.9), (16, 4, 0.5), (24, 8, 0.7), (32, 32, 0.3)])
def test_fast_dllm_matches_reference(seed: int, gen_length: int, block_length: int, threshold: float) -> None:
    model = tiny_denoiser(seed=seed)
    engine = RolloutEngine(adapter=ModelAdapter(module=model, mask_id=MASK_ID, vocab_size=24))
    [request] = make_requests([2 + seed], gen_length, seed=seed + 10)
    expected, calls = fast_dllm_reference(model, request.prompt, gen_length, block_length, threshold)
    [result] = text_decoder("fast_dllm", f"decoder.commit.threshold={threshold}", gen_length=gen_length).decode(
        engine, [request], block_length
    )
    assert torch.equal(result.tokens, expected)
    assert result.steps == calls
    assert calls < gen_length or threshold == 0.9  # parallel commits happened where the threshold allows
