"""Issue 47, defects 7 and 8: every refusal of a combination is a numbered rule of ``plan.RULES``,
refused once by the plan before any forward; and one declared owner decides the token
temperature (a commit rule's schedule, a population's diversity, else the settings layered),
so a temperature set for another owner is refused instead of silently replaced, and the plan
(and a run's summary) records the temperature used and where it came from."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import torch
from conftest import MASK_ID, VOCAB, CountingModule, cached_adapter, make_requests, text_decoder, tiny_denoiser
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import build, compose
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.tensor_parallel import TensorParallel, shard_model
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.search import plan as plan_module
from dlmsearch.search import plan_rules
from dlmsearch.search.components.commit import FastBlockRule
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.width.diversity import TokenTemperature
from dlmsearch.search.width.population import Population


def counting_adapter() -> ModelAdapter:
    return ModelAdapter(module=CountingModule(tiny_denoiser()), mask_id=MASK_ID, vocab_size=VOCAB)


def uniform(adapter: ModelAdapter, canvas: int = 8) -> ModelAdapter:
    """``adapter`` declaring a uniform-noise model's capabilities (what the plan's rules read)."""
    adapter.capabilities = attrs.evolve(
        adapter.capabilities, noise="uniform", canvas_length=canvas, stop_ids=(1,), name="DiffusionGemma"
    )
    return adapter


def sharded() -> ModelAdapter:
    """A native transformer sharded as rank 0 of 2 (its reduce the identity: no process group needed)."""
    config = TransformerConfig(
        vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=32, max_length=64
    )
    module = shard_model(BidirectionalTransformer(config), TensorParallel(0, 2, None, lambda t: t))
    return ModelAdapter(module=module, mask_id=MASK_ID, vocab_size=VOCAB)


@attrs.define
class VerifiedFastBlock(FastBlockRule):
    """Fast block diffusion asking for WINO's shadow block (which needs rows one block long)."""

    statistics = frozenset({"verify"})


# name: (decoder, engine, generation length, task block length, the rule's message)
Case = Callable[[], tuple[SearchDecoder, RolloutEngine, int, int, str]]
CASES: dict[str, Case] = {
    "lookahead over a revision (was SearchDecoder's post-init)": lambda: (
        build(compose(["+decoder=rcr", "decoder/trigger=always"]), "decoder"),
        RolloutEngine(adapter=counting_adapter()),
        16,
        8,
        r"revises commits \(.*\) and explores",
    ),
    "lookahead without its parts (was SearchDecoder's post-init)": lambda: (
        text_decoder("fast_dllm", "decoder/trigger=always"),
        RolloutEngine(adapter=counting_adapter()),
        16,
        8,
        "explores .* but has no candidates, scorer, expansion, selector: use `decoder/trigger=never`",
    ),
    "a canvas that is not whole (was make_plan's own check)": lambda: (
        text_decoder("diffusion_gemma"),
        RolloutEngine(adapter=uniform(counting_adapter())),
        12,
        8,
        r"must be a whole number of this model's canvases of 8 .*: use `task.gen_length=16`",
    ),
    "blocks that are not whole (was Layout's)": lambda: (
        text_decoder("llada"),
        RolloutEngine(adapter=counting_adapter()),
        12,
        8,
        r"whole number of decoding blocks of 8 .*: use `task.gen_length=16`",
    ),
    "a shadow block over windows of several blocks (was the engine's, at call time)": lambda: (
        SearchDecoder(commit=VerifiedFastBlock(budget=1)),
        RolloutEngine(adapter=cached_adapter()),
        16,
        4,
        "verify statistic .* moves on after 1 rounds .*: use `decoder/commit=wide_in`",
    ),
    "tensor parallelism and a layerwise cache (was at the first forward)": lambda: (
        text_decoder("llada"),
        RolloutEngine(adapter=sharded(), cache="dllm_cache"),
        16,
        8,
        "cache=dllm_cache chooses what to recompute per layer .* model.tensor_parallel=2",
    ),
    "tensor parallelism and engine.compile (was the CLI's and the model's)": lambda: (
        text_decoder("llada"),
        RolloutEngine(adapter=sharded(), compile=True),
        16,
        8,
        "engine.compile=true with model.tensor_parallel=2: .*: use `engine.compile=false`",
    ),
}


def forwards(engine: RolloutEngine) -> int:
    module = engine.adapter.module
    return len(module.calls) if isinstance(module, CountingModule) else 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_refusal_is_a_listed_rule_refused_before_any_forward(name: str) -> None:
    decoder, engine, gen_length, block_length, message = CASES[name]()
    requests = make_requests([3, 5], gen_length)
    with pytest.raises(ValueError, match=message) as refused:
        decoder.decode(engine, requests, block_length)
    raisers = [entry.frame.code.name for entry in refused.traceback]
    assert "validate" in raisers, f"refused outside plan.RULES: {raisers[-1]}"
    assert forwards(engine) == 0


def test_the_canvas_rule_on_requests_is_listed_and_says_what_check_canvas_says() -> None:
    """Rule 19 needs a prompt: the plan asks it with none (nothing refused), every entry point with its longest."""
    engine = RolloutEngine(
        adapter=ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB, max_length=96)
    )
    plan = text_decoder("llada").plan(engine, 16, 8)
    assert plan_rules._canvas_fits in plan_rules.RULES
    with pytest.raises(ValueError, match=r"\(prompt 90 \+ generation 16\) is 106 tokens") as refused:
        plan.check_canvas(90, "the canvas of item 7")
    meeting = plan_module.Meeting(
        text_decoder("llada"), engine.cache, False, engine.capabilities, None, 16, 8, plan.temperature, 90
    )
    assert str(refused.value) == plan_rules._canvas_fits(meeting).replace("the canvas", "the canvas of item 7")
    assert plan_rules._canvas_fits(attrs.evolve(meeting, prompt_length=None)) is None


def test_the_tensor_parallel_size_is_a_capability() -> None:
    assert sharded().capabilities.tensor_parallel == 2
    assert cached_adapter().capabilities.tensor_parallel == 1


# --- defect 8: one owner of the token temperature ----------------------------------------------------


def particles(decoder: SearchDecoder, temperature: float = 0.7, keep_greedy: bool = True, size: int = 2):
    return attrs.evolve(decoder, population=Population(size=size, diversity=TokenTemperature(temperature, keep_greedy)))


def test_a_temperature_the_schedule_would_replace_is_refused_and_the_schedule_recorded() -> None:
    """``+decoder=diffusion_gemma decoder.sampling.temperature=0.7`` decoded on the schedule's 0.8→0.4
    and recorded 0.7: now refused, naming the owner; the plan records the schedule."""
    engine = RolloutEngine(adapter=uniform(counting_adapter()))
    refused = text_decoder("diffusion_gemma", "decoder.sampling.temperature=0.7")
    with pytest.raises(
        ValueError, match="decoder.sampling.temperature=0.7 would be ignored: commit rule UniformNoiseSteps"
    ):
        refused.plan(engine, 16, 8)
    with pytest.raises(ValueError, match="TokenTemperature .* would be ignored: commit rule UniformNoiseSteps"):
        particles(text_decoder("diffusion_gemma")).plan(engine, 16, 8)
    plan = text_decoder("diffusion_gemma").plan(engine, 16, 8)
    assert plan.temperature.as_dict() == {
        "value": "0.8→0.4",
        "owner": "commit rule UniformNoiseSteps (schedule 0.8→0.4 over each canvas's steps)",
    }


def test_a_temperature_the_particles_would_replace_is_refused(adapter: ModelAdapter) -> None:
    """A population's TokenTemperature replaced every row's temperature with no rule."""
    with pytest.raises(ValueError, match="engine.temperature=0.3 would be ignored: the population's diversity"):
        particles(text_decoder("fast_dllm")).plan(RolloutEngine(adapter=adapter, temperature=0.3), 16, 8)
    with pytest.raises(ValueError, match="decoder.sampling.temperature=1.0 would be ignored: .*TokenTemperature"):
        particles(text_decoder("sdar_greedy", "decoder.sampling.temperature=1.0")).plan(
            RolloutEngine(adapter=adapter), 16, 8
        )
    engine = RolloutEngine(adapter=adapter)
    own = [attrs.evolve(r, sampling=Sampling(temperature=0.5)) for r in make_requests([3, 4], 16)]
    with pytest.raises(ValueError, match=r"own temperature of sample uid\(s\) \[0, 1\] would be ignored"):
        particles(text_decoder("fast_dllm")).decode(engine, own, 8)
    # the same temperature for every particle is no conflict; a population of one leaves it to the settings
    same = particles(attrs.evolve(text_decoder("fast_dllm"), sampling=Sampling(temperature=0.7)), keep_greedy=False)
    assert same.plan(engine, 16, 8).temperature.value == 0.7
    assert particles(text_decoder("fast_dllm"), size=1).plan(engine, 16, 8).temperature.source == "no setting (argmax)"


@attrs.define(eq=False, init=False)  # the engine's own constructor (engine.temperature, ...)
class SpyEngine(RolloutEngine):
    """Records every temperature a row of a call samples at."""

    seen: set = attrs.field(factory=set)

    def evaluate(self, rows, settings):
        temperature = (
            rows.temperature if rows.temperature is not None else torch.tensor([settings.sampling.temperature])
        )
        self.seen.update(round(float(t), 6) for t in temperature)
        return super().evaluate(rows, settings)


@settings(max_examples=12, deadline=None)
@given(
    engine_t=st.sampled_from([None, 0.0, 0.5]),
    decoder_t=st.sampled_from([None, 0.5, 1.0]),
    size=st.integers(1, 3),
    diversity_t=st.sampled_from([0.5, 1.5]),
    keep_greedy=st.booleans(),
)
def test_rows_sample_at_the_declared_owners_temperature(
    adapter: ModelAdapter,
    engine_t: float | None,
    decoder_t: float | None,
    size: int,
    diversity_t: float,
    keep_greedy: bool,
) -> None:
    """Whatever is set, either the plan refuses it (rule 13) or every row samples at what the plan declares."""
    decoder = particles(
        attrs.evolve(text_decoder("fast_dllm"), sampling=Sampling(temperature=decoder_t)),
        diversity_t,
        keep_greedy,
        size,
    )
    engine = SpyEngine(adapter=adapter, temperature=engine_t)
    try:
        plan = decoder.plan(engine, 8, 8)
    except ValueError as refused:
        assert "would be ignored" in str(refused) and size > 1
        return
    decoder.decode(engine, make_requests([2, 3], 8, seed=size), 8, plan=plan)
    owner = plan.temperature
    if size > 1:
        assert owner.kind == "diversity"
        expected = {diversity_t, 0.0} if keep_greedy else {diversity_t}
        assert engine.seen <= expected and diversity_t in engine.seen
    else:
        layered = next((t for t in (engine_t, decoder_t) if t is not None), 0.0)
        assert owner.kind == "settings" and owner.value == layered and engine.seen == {layered}
