"""Parity with the reference loops when they sample, truncate or guide.

The references draw from torch's global generator; dlmsearch's draws are counter-based. So the
tests put dlmsearch's draws into the upstream loops (their sampling calls are replaced from the
test, on the privately loaded copies; the upstream files are never edited): Dream's
``Categorical(probs).sample()`` becomes the inverse CDF of the same ``probs`` at dlmsearch's
uniform for that position, its ``torch.multinomial`` (``alg_temp``) the Gumbel-top-k of dlmsearch's
uniforms, LLaDA's float64 Gumbel noise a one-hot of dlmsearch's sample from ``softmax(logits / T)``
and its ``random`` remasking draw dlmsearch's base uniform. Ties: Dream's ``torch.topk`` orders
equal confidences in an unspecified way, and at T = 0.2 with top-p they are common (a one-token
nucleus has confidence exactly 1); dlmsearch takes the lowest column, so the upstream call runs
with a stable ``topk`` that does the same. Everything else (the processors,
where the confidence is read, the schedules, the counts) is upstream's own code against
dlmsearch's, on a mixed-length batch: tokens and call counts must be identical.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
from conftest import mixed_batch, stable_topk, text_decoder
from tiny_checkpoints import requires_upstream
from upstream import (
    _dream_package,
    dream_generate,
    llada_generate,
    llada_generate_guided,
    llada_generate_module,
    pc_sampler_module,
)

from dlmsearch.models.loading import load_text_model
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.engine.summaries import inverse_cdf
from dlmsearch.search.records.randomness import Stream, hashed_uniform

pytestmark = requires_upstream

SEED = 11


def engine_for(spec, family: str, **sampling) -> RolloutEngine:
    adapter = load_text_model(
        str(spec.directory), family, spec.mask_id, spec.vocab_size, spec.stop_ids, device="cpu", dtype="float32"
    )
    return RolloutEngine(adapter=adapter, seed=SEED, **sampling)


def uniforms(uid: int, call: int, length: int, stream: Stream | None = None) -> torch.Tensor:
    """dlmsearch's draw for a row of ``length`` positions (no padding: position = column) at this call."""
    keys = [torch.tensor(SEED), torch.tensor(uid), torch.tensor(call), torch.tensor(0), torch.arange(length)]
    return hashed_uniform(keys + ([torch.tensor(stream)] if stream is not None else []))


_TOPK = torch.topk


def gumbel_top(probs: torch.Tensor, uniform: torch.Tensor, count: int) -> torch.Tensor:
    keys = torch.log(probs) - torch.log(-torch.log(uniform.clamp(1e-12, 1 - 1e-7)))
    return _TOPK(keys, count, dim=-1).indices


class DreamDraws:
    """dlmsearch's draws inside ``diffusion_generate`` for the sample ``uid``."""

    def __init__(self, uid: int, mask_id: int) -> None:
        self.uid, self.mask_id = uid, mask_id
        self.step, self.masked, self.length = -1, torch.zeros(0, dtype=torch.long), 0

    def logits_hook(self, step, x, logits):  # called after every forward: which step, which positions are masked
        self.step, self.length = step, x.shape[1]
        self.masked = (x[0] == self.mask_id).nonzero().squeeze(1)
        return logits

    def categorical(self, probs: torch.Tensor) -> types.SimpleNamespace:
        uniform = uniforms(self.uid, self.step, self.length, Stream.TOKEN_SAMPLE)[self.masked]
        return types.SimpleNamespace(sample=lambda: inverse_cdf(probs, uniform))

    def multinomial(self, probs: torch.Tensor, num_samples: int) -> torch.Tensor:
        return gumbel_top(probs, uniforms(self.uid, self.step, probs.shape[-1])[None], num_samples)


@pytest.fixture
def legacy_dream_defaults(checkpoints, monkeypatch):
    """transformers 4.x: a model config carries the legacy generation defaults (top_k 50, top_p 1.0),
    which Dream's ``diffusion_generate`` picks up when called without them."""
    config = checkpoints["dream"].upstream.config
    monkeypatch.setattr(config, "top_k", 50, raising=False)
    monkeypatch.setattr(config, "top_p", 1.0, raising=False)


def run_dream(spec, request, monkeypatch, steps: int, gen_length: int, alg: str, **options) -> tuple[torch.Tensor, int]:
    draws = DreamDraws(request.uid, spec.mask_id)
    generation_utils = _dream_package().generation_utils
    monkeypatch.setattr(
        generation_utils, "dists", types.SimpleNamespace(Categorical=lambda probs: draws.categorical(probs))
    )
    monkeypatch.setattr(torch, "multinomial", draws.multinomial)
    monkeypatch.setattr(torch, "topk", stable_topk)
    try:
        return dream_generate(
            spec.upstream,
            request.prompt,
            steps=steps,
            gen_length=gen_length,
            alg=alg,
            generation_logits_hook_func=draws.logits_hook,
            **options,
        )
    finally:
        monkeypatch.undo()


ALGS = [("confidence", "maskgit_plus"), ("margin", "topk_margin"), ("neg_entropy", "entropy")]


@pytest.mark.parametrize("ordering,alg", ALGS)
def test_dream_preset_is_diffusion_generate_at_its_own_defaults(
    checkpoints, legacy_dream_defaults, ordering: str, alg: str
) -> None:
    """Called as Dream's examples call it (no top_k / top_p), transformers 4.x gives top-k 50:
    the ``dream`` preset's default, so confidence, margin and entropy come from the top 50."""
    spec, gen_length, steps = checkpoints["dream"], 16, 8
    requests = mixed_batch(spec, gen_length, seed=4)
    decoder = text_decoder(
        "dream", f"decoder.commit.steps={steps}", f"decoder.commit.ordering={ordering}", gen_length=gen_length
    )
    results = decoder.decode(engine_for(spec, "dream"), requests, block_length=gen_length)
    for request, result in zip(requests, results):
        expected, calls = dream_generate(spec.upstream, request.prompt, steps=steps, gen_length=gen_length, alg=alg)
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
        assert result.steps == calls == steps


SETTINGS = [
    pytest.param(dict(temperature=0.2, top_p=0.95), id="T0.2-top_p0.95"),
    pytest.param(dict(temperature=0.2, top_k=20), id="T0.2-top_k20"),
    pytest.param(dict(temperature=0.5, top_p=0.9, top_k=40), id="T0.5-top_p0.9-top_k40"),
]


# Every pair of (sampling setting, ordering, alg_temp) once: 9 cases instead of the 18 of the full
# product (each case sorts the 152k-word vocabulary for top-p at every step, ~13 s on a CPU core).
PAIRWISE = [
    pytest.param(
        setting.values[0], *ALGS[j], (0.0, 0.5)[(i + j) % 2], id=f"{setting.id}-{ALGS[j][0]}-{(0.0, 0.5)[(i + j) % 2]}"
    )
    for i, setting in enumerate(SETTINGS)
    for j in range(len(ALGS))
]


@pytest.mark.parametrize("setting,ordering,alg,alg_temp", PAIRWISE)
def test_dream_sampling_matches_diffusion_generate(
    checkpoints, monkeypatch, setting: dict, ordering: str, alg: str, alg_temp: float
) -> None:
    spec, gen_length, steps = checkpoints["dream"], 16, 8
    requests = mixed_batch(spec, gen_length, seed=5)
    decoder = text_decoder(
        "dream",
        f"decoder.commit.steps={steps}",
        f"decoder.commit.ordering={ordering}",
        f"decoder.commit.alg_temp={alg_temp}",
        "decoder.sampling.top_k=null",
        gen_length=gen_length,
    )
    results = decoder.decode(engine_for(spec, "dream", **setting), requests, block_length=gen_length)
    options = {"top_p": None, "top_k": None, **setting, "alg_temp": alg_temp}
    for request, result in zip(requests, results):
        expected, calls = run_dream(spec, request, monkeypatch, steps, gen_length, alg, **options)
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
        assert result.steps == calls == steps


class LLaDADraws:
    """dlmsearch's draws inside ``generate()`` for the sample ``uid`` (one ``add_gumbel_noise`` per model call)."""

    def __init__(self, uid: int, mask_id: int) -> None:
        self.uid, self.mask_id, self.call = uid, mask_id, -1

    def gumbel(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        self.call += 1
        if temperature == 0:
            return logits
        proposable = logits.float().clone()
        proposable[..., self.mask_id] = -math.inf
        probs = torch.softmax(proposable / temperature, dim=-1)
        token = inverse_cdf(probs[0], uniforms(self.uid, self.call, logits.shape[1], Stream.TOKEN_SAMPLE))
        return torch.nn.functional.one_hot(token, logits.shape[-1]).double()[None]

    def rand(self, *shape, **kwargs) -> torch.Tensor:  # LLaDA's ``torch.rand((1, L))`` of random remasking
        size = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        return uniforms(self.uid, self.call, size[-1])[None].to(kwargs.get("device") or "cpu")


def with_llada_draws(module, request, spec, monkeypatch) -> LLaDADraws:
    draws = LLaDADraws(request.uid, spec.mask_id)
    monkeypatch.setattr(module, "add_gumbel_noise", draws.gumbel)
    monkeypatch.setattr(torch, "rand", draws.rand)
    return draws


@pytest.mark.parametrize("remasking,ordering", [("low_confidence", "confidence"), ("random", "random")])
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_llada_sampling_matches_generate(
    checkpoints, monkeypatch, temperature: float, remasking: str, ordering: str
) -> None:
    spec, gen_length, block_length, steps = checkpoints["llada"], 16, 8, 8
    requests = mixed_batch(spec, gen_length, seed=6)
    decoder = text_decoder(
        "llada", f"decoder.commit.steps={steps}", f"decoder.commit.ordering={ordering}", gen_length=gen_length
    )
    results = decoder.decode(engine_for(spec, "llada", temperature=temperature), requests, block_length)
    module = llada_generate_module()
    for request, result in zip(requests, results):
        with_llada_draws(module, request, spec, monkeypatch)
        try:
            expected, nfe = llada_generate(
                spec.upstream,
                request.prompt,
                steps=steps,
                gen_length=gen_length,
                block_length=block_length,
                mask_id=spec.mask_id,
                temperature=temperature,
                remasking=remasking,
            )
        finally:
            monkeypatch.undo()
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
        assert result.steps == nfe


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_guidance_matches_llada_cfg_scale(checkpoints, monkeypatch, scale: float, temperature: float) -> None:
    """``decoder.guidance.scale`` against LLaDA's ``generate(cfg_scale=...)``: the same tokens, the
    same calls, and every call forwards two rows per sample (row-forwards double, steps do not)."""
    spec, gen_length, block_length, steps = checkpoints["llada"], 16, 8, 8
    requests = mixed_batch(spec, gen_length, seed=7)
    decoder = text_decoder(
        "llada", f"decoder.commit.steps={steps}", f"decoder.guidance.scale={scale}", gen_length=gen_length
    )
    results = decoder.decode(engine_for(spec, "llada", temperature=temperature), requests, block_length)
    module = pc_sampler_module()
    for request, result in zip(requests, results):
        with_llada_draws(module, request, spec, monkeypatch)
        try:
            expected, calls = llada_generate_guided(
                spec.upstream,
                request.prompt,
                steps=steps,
                gen_length=gen_length,
                block_length=block_length,
                cfg_scale=scale,
                mask_id=spec.mask_id,
                temperature=temperature,
            )
        finally:
            monkeypatch.undo()
        assert torch.equal(result.tokens, expected), f"prompt length {len(request.prompt)}"
        assert result.steps == calls and result.row_forwards == 2 * calls
