"""The DiffusionGemma reference harness (issue 37's parity groundwork): transformers' own ``generate``
on a tiny checkpoint (``diffusion_gemma_models``), its draws replaced by dlmsearch's keyed ones
(``diffusion_gemma_reference``).

:data:`CASES` are the reference rows a parity table will compare dlmsearch's engine against: several
canvases, a generation length that is not a multiple of the canvas, EOS inside a canvas, adaptive
stopping on (ending canvases early) and off, entropy bounds keeping one-or-few and all positions, two
temperature schedules, MoE and a single expert. The tests assert only what must hold of every row,
plus that the table covers those situations. Measured here as well: the reference's left-padded
batch gives each row exactly its one-at-a-time tokens and counts (with keyed draws).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from diffusion_gemma_models import CANVAS, EOS, PAD, load_tiny, tiny_diffusion_gemma
from diffusion_gemma_reference import ReferenceOutput, Settings, reference_generate, reference_generate_batch

torch.set_num_threads(1)

SEED, STEPS, GEN = 7, 8, 20  # GEN: 3 canvases of 8, the last cut to 4 tokens
PROMPT_LENGTHS = [1, 4, 9, 13]  # 13 > the sliding window (6): the sliding layers' cache drops keys
# name -> (model variant, settings)
CASES: dict[str, tuple[str, Settings]] = {
    "defaults": ("moe", Settings(GEN, max_denoising_steps=STEPS)),
    "stopping-off": ("moe", Settings(GEN, max_denoising_steps=STEPS, stopping=False)),
    "stops-early": ("moe", Settings(GEN, entropy_bound=2.0, max_denoising_steps=STEPS, confidence_threshold=0.5)),
    "keeps-few": ("moe", Settings(GEN, entropy_bound=1e-3, max_denoising_steps=STEPS)),
    "keeps-all": ("moe", Settings(GEN, entropy_bound=50.0, max_denoising_steps=STEPS)),  # > 7 ln 96 ~ 32
    "hot-schedule": ("moe", Settings(GEN, t_min=0.1, t_max=2.0, max_denoising_steps=STEPS)),
    "single-expert": ("dense", Settings(GEN, max_denoising_steps=STEPS, stopping=False)),
}


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randint(3, 93, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("diffusion_gemma") / "moe"
    tiny_diffusion_gemma(directory, moe=True)
    return directory


@pytest.fixture(scope="module")
def models(checkpoint: Path) -> dict:
    """The checkpoint read back (what a loader sees) and the single-expert variant."""
    return {"moe": load_tiny(checkpoint), "dense": tiny_diffusion_gemma(moe=False)}  # dense: one expert


@pytest.fixture(scope="module")
def rows(models: dict) -> dict[str, list[ReferenceOutput]]:
    """Every case, each prompt decoded alone (uid = its index)."""
    return {
        name: [
            reference_generate_batch(models[variant], [prompt], settings, seed=SEED, uids=[uid])[0]
            for uid, prompt in enumerate(prompts())
        ]
        for name, (variant, settings) in CASES.items()
    }


def test_checkpoint_round_trip(checkpoint: Path, models: dict) -> None:
    """``save_pretrained`` -> ``from_pretrained`` keeps the weights, the special ids and the window."""
    built = tiny_diffusion_gemma(moe=True)
    loaded = models["moe"]
    assert loaded.generation_config.eos_token_id == EOS and loaded.generation_config.pad_token_id == PAD
    saved = json.loads((checkpoint / "config.json").read_text())
    assert saved["canvas_length"] == CANVAS and saved["text_config"]["sliding_window"] == 6
    state = loaded.state_dict()
    assert all(torch.equal(value, state[name]) for name, value in built.state_dict().items())
    prompt = prompts()[2]
    assert reference_generate(built, prompt, max_new_tokens=GEN, max_denoising_steps=4) == reference_generate(
        loaded, prompt, max_new_tokens=GEN, max_denoising_steps=4
    )


def test_bidirectional_all_halves_the_window() -> None:
    """``use_bidirectional_attention="all"``: the layers use ``w // 2 + 1``, the saved config keeps ``w``
    (transformers 5.25's ``generate`` then fails in sdpa: ``is_causal`` passed twice)."""
    model = tiny_diffusion_gemma(use_bidirectional_attention="all", sliding_window=4)
    assert model.config.text_config.sliding_window == 4
    assert model.config.to_dict()["text_config"]["sliding_window"] == 6


def test_mixed_length_prompts_one_at_a_time(models: dict) -> None:
    for uid, prompt in enumerate(prompts()):
        out = reference_generate(models["moe"], prompt, max_new_tokens=GEN, max_denoising_steps=3, seed=SEED, uid=uid)
        assert len(out.tokens) == GEN and len(out.generated) == CANVAS * len(out.canvas_steps)
        assert out.decoder_forward_passes == sum(out.canvas_steps) > 0


def test_draws_are_keyed_by_seed_and_uid(models: dict) -> None:
    prompt, model = prompts()[1], models["moe"]

    def run(seed: int, uid: int) -> ReferenceOutput:
        return reference_generate(model, prompt, max_new_tokens=GEN, max_denoising_steps=STEPS, seed=seed, uid=uid)

    first = run(SEED, 0)
    assert run(SEED, 0) == first
    assert run(SEED, 1).tokens != first.tokens
    assert run(SEED + 1, 0).tokens != first.tokens
    from transformers.models.diffusion_gemma import generation_diffusion_gemma

    assert generation_diffusion_gemma.torch is torch  # the substitutions were scoped to the calls
    assert not {"forward", "_denoising_step", "_prepare_sampler"} & set(vars(model))
    assert "forward" not in vars(model.model.encoder)


def test_given_canvas_at_top_1_needs_no_draws(models: dict) -> None:
    """Top-1 processed logits: every entropy is 0, every position is kept with its only possible
    draw, nothing is re-noised; from a given first canvas one canvas decodes identically with
    torch's generator and with the keyed draws."""
    from transformers import TopKLogitsWarper

    canvas = list(range(10, 10 + CANVAS))
    outputs = [
        reference_generate(
            models["moe"],
            prompts()[2],
            max_new_tokens=CANVAS,
            max_denoising_steps=STEPS,
            seed=seed,
            initial_canvas=canvas,
            substitute=substitute,
            logits_processors=[TopKLogitsWarper(top_k=1)],
        )
        for substitute in (False, True)
        for seed in (0, 1)
    ]
    assert all(out == outputs[0] for out in outputs)
    assert all(kept == CANVAS for out in outputs for step in out.kept for kept in step)


@pytest.mark.parametrize("name", list(CASES))
def test_reference_row_properties(name: str, rows: dict[str, list[ReferenceOutput]]) -> None:
    settings = CASES[name][1]
    canvases = math.ceil(settings.max_new_tokens / CANVAS)
    for out in rows[name]:
        assert len(out.tokens) == settings.max_new_tokens
        assert out.tokens == (out.generated + [PAD] * settings.max_new_tokens)[: settings.max_new_tokens]
        assert len(out.generated) == CANVAS * len(out.canvas_steps) == CANVAS * out.encoder_calls
        assert out.decoder_forward_passes == sum(out.canvas_steps)
        assert out.model_calls == len(out.canvas_steps) + sum(out.canvas_steps)
        assert [len(steps) for steps in out.kept] == out.canvas_steps
        assert all(1 <= kept <= CANVAS for steps in out.kept for kept in steps)
        if settings.entropy_bound >= (CANVAS - 1) * math.log(96):
            assert all(kept == CANVAS for steps in out.kept for kept in steps)
        if settings.stopping:  # stable needs one earlier argmax: never at a canvas's first step
            assert all(2 <= steps <= settings.max_denoising_steps for steps in out.canvas_steps)
        else:
            assert out.canvas_steps == [settings.max_denoising_steps] * len(out.canvas_steps)
        if EOS in out.generated:  # the EOS canvas is the last; everything after the first EOS is pad
            first = out.generated.index(EOS)
            assert first >= len(out.generated) - CANVAS
            assert set(out.generated[first + 1 :]) <= {PAD}
        else:
            assert len(out.canvas_steps) == canvases
        valid = sum(token != PAD for token in out.generated)
        assert out.tokens_per_forward == pytest.approx(valid / out.decoder_forward_passes)


def test_the_table_covers_what_parity_needs(rows: dict[str, list[ReferenceOutput]]) -> None:
    every = [out for outs in rows.values() for out in outs]
    assert any(len(out.canvas_steps) == 3 for out in every), "several canvases, the last cut"
    eos_inside = [out for out in every if EOS in out.generated[:-1] and out.generated.index(EOS) % CANVAS < CANVAS - 1]
    assert eos_inside, "EOS before a canvas's last column (pad after it)"
    assert any(steps < STEPS for out in rows["stops-early"] for steps in out.canvas_steps), "a canvas stopped early"

    def mean_kept(name: str) -> float:
        kept = [k for out in rows[name] for steps in out.kept for k in steps]
        return sum(kept) / len(kept)

    assert mean_kept("keeps-few") < 2.0 < mean_kept("defaults") < CANVAS == mean_kept("keeps-all")
    assert [out.tokens for out in rows["hot-schedule"]] != [out.tokens for out in rows["defaults"]]


@pytest.mark.parametrize("name", ["defaults", "stops-early", "single-expert"])
def test_batched_reference_equals_one_at_a_time(
    name: str, models: dict, rows: dict[str, list[ReferenceOutput]]
) -> None:
    """Left-padded in one ``generate`` call (positions shifted by each row's padding, rows that stop
    or finish carried along): with keyed draws each row gets its one-at-a-time tokens and counts."""
    variant, settings = CASES[name]
    batched = reference_generate_batch(
        models[variant], prompts(), settings, seed=SEED, uids=list(range(len(PROMPT_LENGTHS)))
    )
    for alone, together in zip(rows[name], batched, strict=True):
        assert together.tokens == alone.tokens
        assert (together.decoder_forward_passes, together.canvas_steps, together.kept) == (
            alone.decoder_forward_passes,
            alone.canvas_steps,
            alone.kept,
        )
