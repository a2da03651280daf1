"""One cheap decode setting per paradigm and cache policy, for metamorphic properties that relate two
decodes which must agree (issue 47): masked diffusion (no cache, prefix, dual, a layerwise cache),
block diffusion (no cache, the exact block cache) and uniform noise (DiffusionGemma). A helper
module, not a test module: tests import it as ``paradigm_models`` (``tests/`` is on ``sys.path``).
The models are built once per session (the first test that asks)."""

from __future__ import annotations

import functools

import torch
from diffusion_gemma_models import tiny_adapter, tiny_diffusion_gemma
from family_models import adapter_for

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.adaptive import DLLMCache
from dlmsearch.search.engine.rollout import RolloutEngine

GEN = 16
# paradigm/cache -> the engine's cache policy
CASES = {
    "masked/none": "none",
    "masked/prefix": "prefix",
    "masked/dual": "dual",
    "masked/dllm_cache": DLLMCache(prompt_interval=5, response_interval=3, ratio=0.25),
    "block/none": "none",
    "block/block": "block",
    "uniform/none": "none",
}
# uniform noise decodes with its own commit rule; a population scores it by log-probability
UNIFORM = ("decoder/commit=uniform_noise", "decoder.commit.max_steps=4", "decoder.sampling.confidence=sampling")
UNIFORM_POPULATION = ("decoder/population/score=log_probability",)
SDAR_BLOCK = 4


def _sdar_like() -> ModelAdapter:
    """A random block-causal model (SDAR's attention, blocks of 4), its head scaled so that confidences spread."""
    torch.manual_seed(1)
    config = TransformerConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_length=128,
        qk_norm=True,
        block_size=SDAR_BLOCK,
    )
    model = BidirectionalTransformer(config).eval()
    with torch.no_grad():
        model.head.weight.mul_(8.0)
        model.head.weight[63] = 0.0
    return ModelAdapter(module=model, mask_id=63, vocab_size=64, attention_block=SDAR_BLOCK)


def _diffusion_gemma() -> ModelAdapter:
    return tiny_adapter(tiny_diffusion_gemma(seed=3, moe=True))


@functools.cache
def adapter(paradigm: str) -> ModelAdapter:
    """The paradigm's tiny model (built once)."""
    return {"masked": lambda: adapter_for("llada", True), "block": _sdar_like, "uniform": _diffusion_gemma}[paradigm]()


def engine(case: str, **settings: object) -> RolloutEngine:
    return RolloutEngine(adapter=adapter(case.split("/")[0]), cache=CASES[case], **settings)


def block_length(case: str) -> int:
    paradigm = case.split("/")[0]
    return {"masked": 8, "block": SDAR_BLOCK, "uniform": adapter("uniform").canvas_length}[paradigm]


def decoder(case: str, preset: str, *overrides: str) -> SearchDecoder:
    """``preset`` as it runs on the case's paradigm (uniform noise: its own commit rule; a population
    scores by log-probability)."""
    paradigm, parts = case.split("/")[0], compose([f"+decoder={preset}"]).decoder
    own: tuple[str, ...] = ("decoding=text",)
    if paradigm == "uniform":  # the scorer's threshold reads the commit rule's, which uniform noise has not
        own = UNIFORM + (UNIFORM_POPULATION if "population" in parts else ())
        own += ("decoder.scorer.threshold=0.9",) if "scorer" in parts else ()
    elif paradigm == "block":
        own += (f"task.block_length={SDAR_BLOCK}",)
    cfg = compose([f"+decoder={preset}", f"task.gen_length={GEN}", *own, *overrides])
    return build(cfg, "decoder")


def requests(case: str, seed: int) -> list[DecodeRequest]:
    """Two samples of different prompt lengths, sampled with their own seeds."""
    mask_id = adapter(case.split("/")[0]).capabilities.open_id
    generator = torch.Generator().manual_seed(seed)
    made = []
    for uid, length in enumerate((3, 6)):
        prompt = torch.randint(3, min(mask_id, 60), (length,), generator=generator)
        made.append(DecodeRequest(uid=uid, prompt=prompt, generation=torch.full((GEN,), mask_id), seed=seed + uid))
    return made
