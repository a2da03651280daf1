"""Parity of the newer monotone rules with their authors' licensed code (``../shared/upstream``)."""

from __future__ import annotations

import pytest
import torch
from conftest import stable_topk, text_decoder
from tiny_checkpoints import requires_upstream
from upstream import UPSTREAM, pc_sampler_module

from dlmsearch.models.loading import load_text_model
from dlmsearch.search.components.position_calibrated import load_token_frequencies
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.rollout import RolloutEngine

pytestmark = requires_upstream

PC_FREQUENCIES = UPSTREAM.parent / "pc-sampler" / "data" / "reference_corpus_llada.json"


@pytest.mark.parametrize("decay,gen_length,block_length", [(0.25, 16, 16), (1.0, 16, 8), (0.0, 24, 8)])
def test_pc_sampler_matches_generate_with_pc_sampler(
    checkpoints, monkeypatch, decay: float, gen_length: int, block_length: int
) -> None:
    """PC-Sampler's own loop (MIT) with its LLaDA frequency table, one prompt at a time, against
    the ``pc_sampler`` preset on a mixed-length batch: identical tokens. The clamp at ``alpha``
    makes scores tie (exactly, at decay 0); upstream's ``torch.topk`` orders ties in an unspecified
    way and dlmsearch takes the lowest column, so upstream runs with a stable top-k."""
    if not PC_FREQUENCIES.is_file():
        pytest.skip(f"PC-Sampler's frequency table is not at {PC_FREQUENCIES}")
    spec = checkpoints["llada"]
    module = pc_sampler_module()
    prior, unseen = load_token_frequencies(str(PC_FREQUENCIES))
    table = torch.full((spec.vocab_size,), unseen)
    table[: len(prior)] = prior[: spec.vocab_size]
    monkeypatch.setattr(
        module, "BASE_LINE", table
    )  # what its load_baseline builds (its loader's own module is not shipped)
    monkeypatch.setattr(torch, "topk", stable_topk)
    generator = torch.Generator().manual_seed(8)
    requests = [
        DecodeRequest(
            uid=i,
            prompt=torch.randint(0, 1000, (n,), generator=generator),
            generation=torch.full((gen_length,), spec.mask_id),
        )
        for i, n in enumerate([5, 11, 8])
    ]
    decoder = text_decoder(
        "pc_sampler",
        f"decoder.commit.decay={decay}",
        f"+decoder.commit.frequencies={PC_FREQUENCIES}",
        gen_length=gen_length,
    )
    adapter = load_text_model(
        str(spec.directory), "llada", spec.mask_id, spec.vocab_size, spec.stop_ids, device="cpu", dtype="float32"
    )
    results = decoder.decode(RolloutEngine(adapter=adapter), requests, block_length)
    for request, result in zip(requests, results):
        x = module.generate_with_pc_sampler(
            spec.upstream,
            request.prompt[None],
            steps=gen_length,
            gen_length=gen_length,
            block_length=block_length,
            lambd=decay,
            alpha=10.0,
            temperature=0.0,
            mask_id=spec.mask_id,
        )
        assert torch.equal(result.tokens, x[0, len(request.prompt) :].cpu()), f"prompt length {len(request.prompt)}"
        assert result.steps == gen_length


@pytest.mark.parametrize("confidence,kl,block_length", [(0.6, 0.015, 8), (0.9, 0.01, 16), (0.3, 1.0, 8)])
def test_klass_matches_stable_confident_decode(checkpoints, confidence: float, kl: float, block_length: int) -> None:
    """KLASS's LLaDA loop (MIT, ``unmask_strategy='all'``), one prompt at a time, against the
    ``klass`` preset on a mixed-length batch: identical tokens and model calls."""
    from upstream import klass_module

    spec, gen_length = checkpoints["llada"], 16
    module = klass_module()
    generator = torch.Generator().manual_seed(9)
    requests = [
        DecodeRequest(
            uid=i,
            prompt=torch.randint(0, 1000, (n,), generator=generator),
            generation=torch.full((gen_length,), spec.mask_id),
        )
        for i, n in enumerate([5, 11, 8])
    ]
    decoder = text_decoder(
        "klass", f"decoder.commit.confidence={confidence}", f"decoder.commit.kl={kl}", gen_length=gen_length
    )
    adapter = load_text_model(
        str(spec.directory), "llada", spec.mask_id, spec.vocab_size, spec.stop_ids, device="cpu", dtype="float32"
    )
    results = decoder.decode(RolloutEngine(adapter=adapter), requests, block_length)
    for request, result in zip(requests, results):
        calls = [0]
        handle = spec.upstream.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            x, used_steps = module.stable_confident_decode(
                spec.upstream,
                None,
                request.prompt[None],
                gen_length=gen_length,
                steps=gen_length,
                block_length=block_length,
                conf_threshold=confidence,
                kl_threshold=kl,
                kl_history_length=2,
                alg="klass",
                unmask_strategy="all",
            )
        finally:
            handle.remove()
        assert torch.equal(result.tokens, x[0, len(request.prompt) :].cpu()), f"prompt length {len(request.prompt)}"
        assert result.steps == calls[0] == used_steps
