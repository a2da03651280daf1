"""A search preset is the search, not the paradigm (issue 48): on a model without a mask token the
model's own step replaces a preset's rule that fills masks, chosen once in plan building, and the run
records the rule that ran; a rule that decides blocks whole stays refused on a masked model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from conftest import MASK_ID, VOCAB, text_decoder, tiny_denoiser
from test_diffusion_gemma_cli import _run, model_dir  # noqa: F401  (the tiny checkpoint's fixture, by name)

from dlmsearch.config import decoder_presets
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.components.commit import ThresholdRule
from dlmsearch.search.components.uniform_noise_steps import UniformNoiseSteps
from dlmsearch.search.engine.rollout import RolloutEngine

SEARCHES = ["adalook", "ete", "best_of_n", "smc", "beam"]


def engine(noise: str) -> RolloutEngine:
    """A tiny model declaring a mask token (``mask``) or none (``uniform``: what the plan's rules read)."""
    adapter = ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB)
    if noise == "uniform":
        adapter.capabilities = attrs.evolve(
            adapter.capabilities, noise="uniform", canvas_length=8, stop_ids=(1,), name="DiffusionGemma"
        )
    return RolloutEngine(adapter=adapter)


def refusal(preset: str, noise: str, *overrides: str) -> str | None:
    """What planning ``preset`` on the ``noise`` model refuses (None: it plans)."""
    try:
        text_decoder(preset, *overrides).plan(engine(noise), 16, 8)
    except ValueError as error:
        return str(error)
    return None


def test_the_uniform_list_is_the_presets_that_plan_without_a_mask_token() -> None:
    """``decoder_presets("uniform")`` names exactly the presets whose plan a uniform-noise model accepts
    (or refuses only as a masked model does: a verifier the test gives none of)."""
    listed = set(decoder_presets("uniform"))
    for preset in decoder_presets():
        uniform = refusal(preset, "uniform")
        runs = uniform is None or uniform == refusal(preset, "mask")
        assert runs == (preset in listed), (preset, uniform)
    assert set(SEARCHES) <= listed and "diffusion_gemma" not in decoder_presets("mask")


def test_the_model_supplies_its_step_and_the_plan_names_it() -> None:
    plan = text_decoder("best_of_n").plan(engine("uniform"), 16, 8)
    assert isinstance(plan.commit, UniformNoiseSteps) and not plan.population.rechecks
    assert plan.temperature.as_dict()["owner"].startswith("commit rule UniformNoiseSteps")
    masked = text_decoder("best_of_n").plan(engine("mask"), 16, 8)
    assert isinstance(masked.commit, ThresholdRule) and masked.population.rechecks


def test_a_whole_block_rule_on_a_masked_model_is_refused_in_one_line() -> None:
    message = refusal("diffusion_gemma", "mask", "decoder.stop_at_eos=false")
    assert message is not None and "\n" not in message
    assert "re-decides a canvas of uniform noise every step" in message


@pytest.mark.parametrize("preset", SEARCHES)
def test_search_presets_decode_a_uniform_noise_model(
    request: pytest.FixtureRequest, tmp_path: Path, preset: str
) -> None:
    directory = request.getfixturevalue("model_dir")
    size = ["decoder.population.size=2"] if preset in ("best_of_n", "smc", "beam") else []
    summary = _run(directory, tmp_path / preset, f"+decoder={preset}", "task.limit=2", *size)
    records = [json.loads(line) for line in (tmp_path / preset / "results.jsonl").read_text().splitlines()]
    assert summary["items"] == 2 and summary["errors"] == 0, records
    assert summary["commit"] == "UniformNoiseSteps"
    saved = json.loads((tmp_path / preset / "summary.json").read_text())
    assert saved["commit"] == "UniformNoiseSteps" and saved["decoder"] == preset


def test_the_cli_decodes_the_shipped_uniform_model_with_a_search_preset(tmp_path: Path) -> None:
    out = tmp_path / "adalook"
    done = subprocess.run(
        [sys.executable, "-m", "dlmsearch", "+decoder=adalook", "model=countdown_uniform", "task=countdown"]
        + ["task.limit=2", "model.device=cpu", f"out_dir={out}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 2 and summary["errors"] == 0 and summary["commit"] == "UniformNoiseSteps"


def test_the_model_s_own_step_reads_its_checkpoint_s_generation_config(tmp_path: Path) -> None:
    """The step that replaces a preset's rule runs at the settings the checkpoint's generation config
    names, as ``decoder/commit=uniform_noise`` reads them (not UniformNoiseSteps' own defaults)."""
    from diffusion_gemma_models import tiny_adapter, tiny_diffusion_gemma
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    from dlmsearch.config import build, compose

    model = tiny_diffusion_gemma(seed=0)
    model.generation_config.max_denoising_steps = 5
    model.generation_config.sampler_config = EntropyBoundSamplerConfig(entropy_bound=0.25)
    model.generation_config.t_min = 0.3
    model.save_pretrained(tmp_path)
    adopted = text_decoder("adalook").plan(RolloutEngine(adapter=tiny_adapter(model)), 16, 8).commit
    assert (adopted.max_steps, adopted.entropy_bound, adopted.t_min, adopted.t_max) == (5, 0.25, 0.3, 0.8)
    cfg = compose(["model=diffusion_gemma", f"model.path={tmp_path}", "+decoder=diffusion_gemma"])
    settings = attrs.asdict(build(cfg, "decoder").commit)
    assert settings == {**attrs.asdict(adopted), "block_budget": None}  # the plan bound its rule to the layout
