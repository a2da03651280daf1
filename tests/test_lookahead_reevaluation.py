"""Metamorphic: a lookahead's adopted branch, evaluated again as its slot's root, gives the
evaluation the lookahead adopted with it (issue 47), on every paradigm and every cache policy.

The driver adopts a branch *together with the evaluation it already has* and commits on it; that is
only right if a branch's evaluation is what its slot's root would compute for the same canvas
right then (same model state, same stores). Each lookahead here is followed by that evaluation
from the root (``calls.evaluate`` with the root's key, before the round goes on), and the two
must agree: the tokens proposed and their confidences. Decodes are deterministic (temperature 0;
top-1 on uniform noise), so neither key's draws matter.

* masked (LLaDA-style native model): every cache policy it can run, layerwise ones included;
* block diffusion (SDAR-style, attention in blocks of 4): no cache and the exact block cache;
* uniform noise (DiffusionGemma through transformers): one-step lookahead (a deeper branch reads
  its own self-conditioning memory, which its slot takes only once adopted). A branch that would
  cross into the next canvas read its slot's prefix without the finished canvas (defect 1).
"""

from __future__ import annotations

import pytest
import torch
from conftest import text_decoder
from diffusion_gemma_models import tiny_adapter, tiny_diffusion_gemma
from family_models import GEN, MASK_ID, adapter_for, requests_for
from test_block_diffusion import BLOCK, tiny_sdar

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search import driver
from dlmsearch.search.decode import calls
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.rollout import RolloutEngine

MASKED_CACHES = ("none", "prefix", "dual", "d2cache", "dkv", "dllm_cache", "elastic")
ALWAYS = "decoder/trigger=always"


def _reevaluated(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Every lookahead from now on: its adopted branches evaluated again from their roots; the
    (field, adopted, again) pairs."""
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    lookahead = driver.lookahead

    def checked(engine, state, root, evaluation, exploring, on_lookahead):
        adopted, adopted_eval, restart, usage, best = lookahead(
            engine, state, root, evaluation, exploring, on_lookahead
        )
        again, _ = calls.evaluate(engine, state, usage, adopted, exploring, torch.zeros_like(exploring))
        at = adopted.masked | adopted.held[:, None]  # what the base rule decides next
        for field in ("token", "confidence"):
            pairs.append((field, getattr(adopted_eval, field)[at], getattr(again, field)[at]))
        return adopted, adopted_eval, restart, usage, best

    monkeypatch.setattr(driver, "lookahead", checked)
    return pairs


def _check(pairs: list[tuple[str, torch.Tensor, torch.Tensor]], what: str) -> None:
    assert pairs, f"{what}: no lookahead ran"
    for field, adopted, again in pairs:
        assert torch.equal(adopted, again), f"{what}: the adopted branch's {field} differs from the root's"


@pytest.mark.parametrize("cache", MASKED_CACHES)
def test_masked_lookahead_branches_are_evaluated_as_their_roots_would(monkeypatch, cache: str) -> None:
    pairs = _reevaluated(monkeypatch)
    decoder = text_decoder("fixed_depth", ALWAYS, gen_length=GEN)
    engine = RolloutEngine(adapter=adapter_for("llada", honours_padding=True), cache=cache)
    decoder.decode(engine, requests_for([3, 7], seed=1), 8)
    _check(pairs, f"masked, cache={cache}")


@pytest.mark.parametrize("cache", ["none", "block"])
def test_block_diffusion_lookahead_branches_are_evaluated_as_their_roots_would(monkeypatch, cache: str) -> None:
    pairs = _reevaluated(monkeypatch)
    adapter = ModelAdapter(module=tiny_sdar(), mask_id=MASK_ID, vocab_size=64, attention_block=BLOCK)
    decoder = text_decoder("fixed_depth", ALWAYS, f"task.block_length={BLOCK}", gen_length=12)
    generator = torch.Generator().manual_seed(2)
    requests = [
        DecodeRequest(uid=u, prompt=torch.randint(0, 60, (n,), generator=generator), generation=torch.full((12,), 63))
        for u, n in enumerate([5, 2])
    ]
    decoder.decode(RolloutEngine(adapter=adapter, cache=cache), requests, BLOCK)
    _check(pairs, f"block diffusion, cache={cache}")


def test_uniform_noise_lookahead_branches_are_evaluated_as_their_roots_would(monkeypatch) -> None:
    """Top-1 keeps a whole canvas each step (nothing is re-noised, so no noise draw differs by
    key), and a canvas may finish at its second step: a root whose step finishes its canvas once
    sent every branch into the next one."""
    pairs = _reevaluated(monkeypatch)
    adapter = tiny_adapter(tiny_diffusion_gemma(seed=3, moe=True))
    overrides = ["+decoder=ete", "decoder/commit=uniform_noise", "decoder.sampling.confidence=sampling", ALWAYS]
    overrides += ["decoder.scorer.threshold=0.9"]
    decoder = build(compose([*overrides, "decoder.commit.max_steps=3"]), "decoder")
    requests = [
        DecodeRequest(uid=u, prompt=torch.tensor(p), generation=torch.full((24,), 96))
        for u, p in enumerate([[5, 6, 7, 8, 9], [10, 11], [3, 4, 30]])
    ]
    engine = RolloutEngine(adapter, top_k=1)
    decoder.decode(engine, requests, adapter.canvas_length)
    _check(pairs, "uniform noise")
