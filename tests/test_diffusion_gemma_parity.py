"""DiffusionGemma through dlmsearch's one loop equals transformers' own ``generate`` (issue 37, item 4).

Mixed-length prompts are decoded in **one** dlmsearch batch (``+decoder=diffusion_gemma``'s rule,
:class:`~dlmsearch.search.components.commit.UniformNoiseSteps`) and compared with the reference
loop run one prompt at a time (``tests/diffusion_gemma_reference.py``: transformers' ``generate``
with its ``torch.randint`` / ``torch.multinomial`` draws replaced by dlmsearch's keyed draws).
Both run the same module with dlmsearch's attention registered (sdpa with float64 sums on CPU).
Tokens are identical through the first EOS; after it the reference pads (``pad_token_id``) and
dlmsearch fills with EOS, its convention for every model (neither counts as a commit). Model calls
(encoder + decoder) are identical per sample, hence the decoder-forward counts.
"""

from __future__ import annotations

import pytest
import torch
from diffusion_gemma_models import EOS, PAD, tiny_adapter, tiny_diffusion_gemma
from diffusion_gemma_reference import ReferenceOutput, reference_generate
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import build, compose
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.diffusion_gemma import DiffusionGemmaAdapter, load_diffusion_gemma
from dlmsearch.search.components.uniform_noise_steps import UniformNoiseSteps
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine

PROMPTS = ([5, 6, 7, 8, 9], [10, 11, 12], [3, 4], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30], [40])


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    torch.set_num_threads(1)
    return {
        "dense": tiny_diffusion_gemma(seed=0),
        "eos": tiny_diffusion_gemma(seed=2, eos_gain=3.0),
        "moe": tiny_diffusion_gemma(seed=3, moe=True),
    }


def _adapter(model: torch.nn.Module) -> DiffusionGemmaAdapter:
    return tiny_adapter(model)


def _decode(model: torch.nn.Module, rule: UniformNoiseSteps, gen_length: int, seeds: list[int]) -> list[DecodeResult]:
    adapter = _adapter(model)
    decoder = SearchDecoder(commit=rule, sampling=Sampling(confidence="sampling"), stop_at_eos=True, name="dg")
    requests = [
        DecodeRequest(
            uid=i, prompt=torch.tensor(p), generation=torch.full((gen_length,), adapter.capabilities.open_id), seed=s
        )
        for i, (p, s) in enumerate(zip(PROMPTS, seeds))
    ]
    return decoder.decode(RolloutEngine(adapter, row_budget=3), requests, block_length=adapter.canvas_length)


def _through_eos(tokens: list[int], fill: int) -> list[int]:
    """The tokens through the first EOS, then ``fill`` (each side's padding convention)."""
    end = tokens.index(EOS) + 1 if EOS in tokens else len(tokens)
    return tokens[:end] + [fill] * (len(tokens) - end)


CASES = {
    "defaults_three_canvases": ("dense", {}),
    "stopping_off": ("dense", {"stopping": False}),
    "keeps_few": ("dense", {"entropy_bound": 0.001}),
    "keeps_many": ("dense", {"entropy_bound": 3.0}),
    "stability_two": ("moe", {"entropy_bound": 2.0, "confidence_threshold": 0.5, "stability_threshold": 2}),
    "hot_schedule": ("dense", {"t_min": 0.9, "t_max": 1.5}),
    "stops_early": ("moe", {"entropy_bound": 2.0, "confidence_threshold": 0.5}),
    "eos_inside_a_canvas": ("eos", {}),
    "mixture_of_experts": ("moe", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_batch_equals_generate_one_prompt_at_a_time(models: dict, case: str) -> None:
    name, settings = CASES[case]
    model = models[name]
    steps = 10
    rule = UniformNoiseSteps(max_steps=steps, **settings)
    gen_length = 3 * model.config.canvas_length
    seeds = [11 + i for i in range(len(PROMPTS))]
    ours = _decode(model, rule, gen_length, seeds)
    references: list[ReferenceOutput] = [
        reference_generate(
            model,
            prompt,
            max_new_tokens=gen_length,
            max_denoising_steps=steps,
            seed=seed,
            uid=uid,
            **{k: v for k, v in settings.items()},
        )
        for uid, (prompt, seed) in enumerate(zip(PROMPTS, seeds))
    ]
    for uid, (mine, ref) in enumerate(zip(ours, references)):
        assert _through_eos(mine.tokens.tolist(), PAD) == _through_eos(ref.tokens, PAD), f"sample {uid}"
        assert mine.steps == ref.model_calls, f"sample {uid}: model calls"
        assert mine.decoder_forwards == ref.decoder_forward_passes, f"sample {uid}: decoder forwards"
        assert mine.writes == len(ref.canvas_steps) == ref.encoder_calls, f"sample {uid}: encoder calls"
    if case == "stops_early":
        assert any(s < steps for r in references for s in r.canvas_steps), "the stopping rule never fired"
    if case == "eos_inside_a_canvas":
        assert any(EOS in r.tokens[: -model.config.canvas_length] for r in references), "no answer ended early"
    if case in ("keeps_few", "keeps_many"):
        kept = [k for r in references for canvas in r.kept for k in canvas]
        mean = sum(kept) / len(kept)
        assert mean <= 2 if case == "keeps_few" else mean >= 6, kept


def test_a_samples_result_does_not_depend_on_its_batch(models: dict) -> None:
    """Each sample alone equals itself in the mixed batch (temperature > 0, per-sample seeds)."""
    model = models["moe"]
    rule = UniformNoiseSteps(max_steps=6)
    gen_length = 2 * model.config.canvas_length
    seeds = [7, 8, 9, 10, 11]
    batched = _decode(model, rule, gen_length, seeds)
    adapter = _adapter(model)
    decoder = SearchDecoder(commit=rule, sampling=Sampling(confidence="sampling"), stop_at_eos=True, name="dg")
    for uid, (prompt, seed) in enumerate(zip(PROMPTS, seeds)):
        request = DecodeRequest(
            uid=uid,
            prompt=torch.tensor(prompt),
            generation=torch.full((gen_length,), adapter.capabilities.open_id),
            seed=seed,
        )
        alone = decoder.decode(RolloutEngine(adapter), [request], block_length=adapter.canvas_length)[0]
        assert alone.tokens.tolist() == batched[uid].tokens.tolist()
        assert (alone.steps, alone.token_forwards) == (batched[uid].steps, batched[uid].token_forwards)


def test_loads_a_local_checkpoint_through_transformers(tmp_path) -> None:
    tiny_diffusion_gemma(tmp_path, seed=0)
    adapter = load_diffusion_gemma(str(tmp_path), device="cpu", dtype="float32")
    assert adapter.capabilities.noise == "uniform"
    assert adapter.capabilities.canvas_length == 8
    assert adapter.mask_id is None and adapter.vocab_size == 96  # no mask token (issue 48: no fake id)
    assert adapter.stop_ids == [EOS]


def test_a_missing_or_foreign_checkpoint_fails_in_one_line(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_diffusion_gemma(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "llada"}')
    with pytest.raises(ValueError, match="model_type='llada'"):
        load_diffusion_gemma(str(tmp_path))
    with pytest.raises(ValueError, match="model.path is required"):
        load_diffusion_gemma(None)


def _given_first_canvas(
    model: torch.nn.Module, rule: UniformNoiseSteps, canvases: list[list[int]], sampling: Sampling, gen_length: int
) -> list[DecodeResult]:
    """One batch whose requests hold their first canvas (the API's ``initial_canvas=``)."""
    adapter = _adapter(model)
    decoder = SearchDecoder(commit=rule, sampling=sampling, stop_at_eos=True, name="dg")
    open_ = torch.full((gen_length - adapter.canvas_length,), adapter.capabilities.open_id)
    requests = [
        DecodeRequest(uid=i, prompt=torch.tensor(p), generation=torch.cat([torch.tensor(c), open_]), seed=5)
        for i, (p, c) in enumerate(zip(PROMPTS, canvases))
    ]
    return decoder.decode(RolloutEngine(adapter), requests, block_length=adapter.canvas_length)


def test_a_given_first_canvas_replays_generate(models: dict) -> None:
    """``initial_canvas`` is the reference's ``decoder_input_ids``: the first step reads it as given."""
    model = models["moe"]
    length = model.config.canvas_length
    canvases = [[(7 * i + 3 * j) % 90 + 3 for j in range(length)] for i in range(len(PROMPTS))]
    rule = UniformNoiseSteps(max_steps=6)
    ours = _given_first_canvas(model, rule, canvases, Sampling(confidence="sampling"), 2 * length)
    for uid, (prompt, canvas) in enumerate(zip(PROMPTS, canvases)):
        ref = reference_generate(
            model, prompt, max_new_tokens=2 * length, max_denoising_steps=6, seed=5, uid=uid, initial_canvas=canvas
        )
        assert _through_eos(ours[uid].tokens.tolist(), PAD) == _through_eos(ref.tokens, PAD), f"sample {uid}"
        assert ours[uid].steps == ref.model_calls


def test_top_1_from_a_given_canvas_is_deterministic_and_equals_generate(models: dict) -> None:
    """``engine.top_k=1`` and a given canvas: one canvas decodes the same whatever the seed, as the
    reference with a top-1 logits processor does."""
    from transformers import TopKLogitsWarper

    model = models["dense"]
    length = model.config.canvas_length
    canvases = [[(5 * i + j) % 90 + 3 for j in range(length)] for i in range(len(PROMPTS))]
    rule = UniformNoiseSteps(max_steps=8)
    top1 = Sampling(top_k=1, confidence="sampling")
    ours = _given_first_canvas(model, rule, canvases, top1, length)
    for uid, (prompt, canvas) in enumerate(zip(PROMPTS, canvases)):
        refs = [
            reference_generate(
                model,
                prompt,
                max_new_tokens=length,
                max_denoising_steps=8,
                seed=seed,
                uid=uid,
                initial_canvas=canvas,
                logits_processors=[TopKLogitsWarper(1)],
            )
            for seed in (5, 99)
        ]
        assert refs[0].tokens == refs[1].tokens, "the reference is not deterministic under top-1"
        assert _through_eos(ours[uid].tokens.tolist(), PAD) == _through_eos(refs[0].tokens, PAD), f"sample {uid}"
        assert ours[uid].steps == refs[0].model_calls


UNIFORM_WIDTH = (
    "decoder/commit=uniform_noise",
    "decoder/population/score=log_probability",
    "decoder.sampling.confidence=sampling",
    "decoder.stop_at_eos=true",
)
APPLICABLE = {
    "diffusion_gemma": (),
    "best_of_n": (*UNIFORM_WIDTH, "decoder.population.size=3"),
    "smc": (*UNIFORM_WIDTH, "decoder.population.size=3"),
    "beam": (*UNIFORM_WIDTH, "decoder.population.size=3"),
    "ete": (*UNIFORM_WIDTH[:1], *UNIFORM_WIDTH[2:], "decoder.scorer.threshold=0.9"),
    "adalook": (*UNIFORM_WIDTH[:1], *UNIFORM_WIDTH[2:], "decoder.scorer.threshold=0.9"),
}


@settings(max_examples=10, deadline=None)
@given(
    preset=st.sampled_from(sorted(APPLICABLE)),
    chosen=st.lists(st.integers(0, len(PROMPTS) - 1), min_size=1, max_size=4, unique=True),
    seed=st.integers(0, 1000),
)
def test_every_applicable_preset_is_batch_invariant(models: dict, preset: str, chosen: list[int], seed: int) -> None:
    """Each sample decodes the same alone and in any batch, at temperature > 0 with its own seed."""
    cfg = compose([f"+decoder={preset}", "decoder.commit.max_steps=4", *APPLICABLE[preset]])
    decoder = build(cfg, "decoder")
    adapter = _adapter(models["moe"])
    gen_length = 2 * adapter.canvas_length

    def request(uid: int) -> DecodeRequest:
        open_ = torch.full((gen_length,), adapter.capabilities.open_id)
        return DecodeRequest(uid=uid, prompt=torch.tensor(PROMPTS[uid]), generation=open_, seed=seed + uid)

    batch = decoder.decode(RolloutEngine(adapter, row_budget=4), [request(u) for u in chosen], adapter.canvas_length)
    for uid, together in zip(chosen, batch):
        alone = decoder.decode(RolloutEngine(adapter), [request(uid)], adapter.canvas_length)[0]
        assert alone.tokens.tolist() == together.tokens.tolist(), (preset, uid)
        assert (alone.steps, alone.row_forwards, alone.token_forwards) == (
            together.steps,
            together.row_forwards,
            together.token_forwards,
        )


def test_image_token_ids_in_a_prompt_are_refused(models: dict) -> None:
    adapter = _adapter(models["dense"])
    model = models["dense"]
    saved = model.config.image_token_id
    try:
        model.config.image_token_id = 50
        adapter = _adapter(model)
    finally:
        model.config.image_token_id = saved
    assert 50 in adapter.capabilities.media_ids
    decoder = SearchDecoder(commit=UniformNoiseSteps(max_steps=2), sampling=Sampling(confidence="sampling"))
    request = DecodeRequest(
        uid=4, prompt=torch.tensor([3, 50, 7]), generation=torch.full((8,), adapter.capabilities.open_id)
    )
    with pytest.raises(
        ValueError, match=r"uid\(s\) \[4\] holds image or audio token ids \[50, 93, 94\]: dlmsearch decodes text only"
    ):
        decoder.decode(RolloutEngine(adapter), [request], adapter.canvas_length)


def test_bfloat16_decodes(models: dict) -> None:
    """The module in bfloat16: the self-conditioning input is kept in the embedding's dtype, as the reference keeps it."""
    import copy

    model = copy.deepcopy(models["dense"])
    vocab = model.config.get_text_config().vocab_size
    adapter = tiny_adapter(model, dtype="bfloat16")
    decoder = SearchDecoder(commit=UniformNoiseSteps(max_steps=3), sampling=Sampling(confidence="sampling"))
    request = DecodeRequest(uid=0, prompt=torch.tensor(PROMPTS[0]), generation=torch.full((16,), vocab))
    result = decoder.decode(RolloutEngine(adapter), [request], adapter.canvas_length)[0]
    assert result.tokens.shape == (16,) and bool(((result.tokens >= 0) & (result.tokens < vocab)).all())


def test_a_branch_keeps_its_own_canvas_memory_until_adopted() -> None:
    """A lookahead branch reads its slot's self-conditioning input and draft until it has its own; the
    adopted branch's become its slot's, the others are dropped."""
    from dlmsearch.search.engine.encoder_prefix import SelfConditioning
    from dlmsearch.search.records.randomness import BRANCH_KEYS

    memory = SelfConditioning()
    memory.reset(2)
    slot, start = torch.tensor([0, 1]), torch.tensor([4, 4])
    roots = torch.tensor([0, BRANCH_KEYS])  # particle 0 of slot 0, particle 1 of slot 1: their roots
    root_logits, draft = torch.randn(2, 3, 5), torch.tensor([[1, 2, 3], [4, 0, 1]])
    assert memory.remember(slot, start, roots, torch.tensor([True, True]), root_logits, draft).tolist() == [0, 0]
    branch = torch.tensor([2, BRANCH_KEYS + 1])  # branch 1 of slot 0, branch 0 of slot 1
    read, has = memory.conditioning(slot, start, branch)
    assert bool(has.all()) and torch.equal(read, root_logits), "a fresh branch reads its slot's memory"
    branch_logits = torch.randn(2, 3, 5)
    repeats = memory.remember(slot, start, branch, torch.tensor([False, False]), branch_logits, draft)
    assert repeats.tolist() == [1, 1], "the same draft as the slot's: repeated once"
    read, _ = memory.conditioning(slot, start, branch)
    assert torch.equal(read, branch_logits)
    assert torch.equal(memory.conditioning(slot, start, roots)[0], root_logits), "a branch never writes its slot's"
    memory.adopt(torch.tensor([0]), torch.tensor([2]))
    assert torch.equal(memory.logits[0], branch_logits[0]) and torch.equal(memory.logits[1], root_logits[1])
    assert memory.repeats.tolist() == [1, 0] and memory.branches == {}


def test_a_checkpoint_with_vision_weights_but_no_text_config_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "diffusion_gemma", "vision_config": {"hidden_size": 8}}')
    with pytest.raises(ValueError, match="has vision weights but no text_config"):
        load_diffusion_gemma(str(tmp_path))
