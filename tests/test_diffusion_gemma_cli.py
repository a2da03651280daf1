"""A DiffusionGemma-format Countdown checkpoint through the CLI's run and the Python API (issue 37).

The checkpoint is built here, untrained and tiny, by the uniform-noise training script's own
``build_model`` (DiffusionGemma's classes, the Countdown tokenizer); accuracy is not the point,
the path is: ``model=diffusion_gemma model.path=DIR`` reads its ids and canvas, ``+decoder=diffusion_gemma``
decodes, width presets run with the uniform-noise rule, and what has no meaning is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_uniform_training import MODEL
from train_countdown import write_countdown_tokenizer
from train_countdown_uniform import build_model

from dlmsearch.api import Decoder, Model
from dlmsearch.config import compose
from dlmsearch.models.trained_on import write_trained_on
from dlmsearch.run import run

TINY = {**MODEL, "max_position_embeddings": 128}  # test_uniform_training's tiny model, longer prompts
CANVAS = 8
FAST = ["task=countdown", "task.limit=3", "model.device=cpu"]
UNIFORM_RULE = ["decoder/commit=uniform_noise", "decoder.sampling.confidence=sampling", "decoder.stop_at_eos=true"]
UNIFORM_WIDTH = [*UNIFORM_RULE, "decoder/population/score=log_probability"]
STEPS = "decoder.commit.max_steps=3"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    directory = tmp_path_factory.mktemp("diffusion_gemma_cli") / "model"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model(OmegaConf.create(TINY), canvas_length=CANVAS)
    model.save_pretrained(str(directory))
    write_countdown_tokenizer(directory)
    write_trained_on(
        directory, template="Make {target} from {numbers}.", gen_length=16, block_length=CANVAS, tier="small"
    )
    return directory


def _run(model_dir: Path, out: Path, *overrides: str) -> dict:
    cfg = compose(["model=diffusion_gemma", f"model.path={model_dir}", *FAST, f"out_dir={out}", *overrides])
    return run(cfg)


def test_the_cli_reads_the_checkpoint_and_decodes(model_dir: Path, tmp_path: Path) -> None:
    summary = _run(model_dir, tmp_path / "run", "+decoder=diffusion_gemma", STEPS)
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 3 and summary["items"] == 3
    assert all(1 <= r["steps"] <= 2 * (1 + 3) for r in records), [r["steps"] for r in records]  # <= 2 canvases
    # the temperature used and its owner (issue 47, defect 8), also where the layered settings name none
    owner = "commit rule UniformNoiseSteps (schedule 0.8→0.4 over each canvas's steps)"
    assert summary["temperature"] == {"value": "0.8→0.4", "owner": owner}
    assert summary["sampling"]["temperature"] == "0.8→0.4"


@pytest.mark.parametrize("preset", ["best_of_n", "smc"])
def test_width_presets_run_with_the_uniform_noise_rule(model_dir: Path, tmp_path: Path, preset: str) -> None:
    summary = _run(
        model_dir, tmp_path / preset, f"+decoder={preset}", *UNIFORM_WIDTH, STEPS, "decoder.population.size=2"
    )
    assert summary["items"] == 3


@pytest.mark.parametrize("preset", ["ete", "adalook", "fixed_depth"])
def test_lookahead_over_keep_sets(model_dir: Path, tmp_path: Path, preset: str) -> None:
    """Lookahead presets with the uniform-noise rule: a branch keeps a candidate beside the keep-set and
    rolls the reference loop on with its own self-conditioning input; the adopted one's becomes its slot's."""
    out = tmp_path / preset
    summary = _run(model_dir, out, f"+decoder={preset}", *UNIFORM_RULE, STEPS, "decoder.scorer.threshold=0.9")
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert summary["items"] == 3
    assert any(r["row_forwards"] > r["steps"] for r in records), "no lookahead branch was ever evaluated"


@pytest.mark.parametrize(
    "overrides,message",
    [
        # a masked preset decodes (the model's own step replaces its rule), but not one that sets its own temperature
        (["+decoder=sdar"], "decoder.sampling.temperature=1.0 would be ignored: commit rule UniformNoiseSteps"),
        (["+decoder=best_of_n", *UNIFORM_RULE], "score=log_probability"),
        (["+decoder=diffusion_gemma", "cache=prefix"], "caches a masked canvas"),
        (["+decoder=rcr", *UNIFORM_RULE], "re-noises what it does not keep"),
        (["+decoder=diffusion_gemma", "engine.temperature=0.7"], "engine.temperature=0.7 would be ignored"),
        (  # issue 47, defect 8: was decoded on the schedule's 0.8→0.4 while the summary said 0.7
            ["+decoder=diffusion_gemma", "decoder.sampling.temperature=0.7"],
            "decoder.sampling.temperature=0.7 would be ignored: commit rule UniformNoiseSteps",
        ),
        (["+decoder=diffusion_gemma", "decoder.commit.entropy_bound=0"], r"entropy_bound must be within \(0.0"),
        (["+decoder=diffusion_gemma", "decoder.commit.t_max=0.3"], "t_max=0.3 must be above t_min=0.4"),
    ],
)
def test_what_has_no_meaning_is_refused_in_one_line(model_dir: Path, tmp_path: Path, overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        _run(model_dir, tmp_path / "refused", *overrides)


def test_the_api_takes_an_initial_canvas(model_dir: Path) -> None:
    model = Model.load("diffusion_gemma", path=model_dir, device="cpu")
    decoder = Decoder.from_preset("diffusion_gemma", {"decoder.commit.max_steps": 3})
    prompts = ["Make 10 from 2, 5, 1.", "Make 7 from 3, 4, 9."]
    canvas = [[5 + j for j in range(CANVAS)], [40 + j for j in range(CANVAS)]]
    first = decoder.generate(model, prompts, seed=3, initial_canvas=canvas)
    again = decoder.generate(model, prompts, seed=3, initial_canvas=torch.tensor(canvas), batch_size=1)
    assert [g.tokens.tolist() for g in first] == [g.tokens.tolist() for g in again]
    with pytest.raises(ValueError, match=r"shape \[prompts, canvas_length\] = \[2, 8\]"):
        decoder.generate(model, prompts, initial_canvas=[[1, 2, 3]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decoder.generate(model, prompts, initial_canvas=[[5000] * CANVAS] * 2)


def test_a_sampled_decode_does_not_depend_on_its_batch(model_dir: Path) -> None:
    """Through transformers' classes (routed experts included), at the schedule's temperatures with
    the seed fixed, prompts of mixed lengths decode alike one at a time and all together (issue 47,
    defect 14; tests/test_uniform_lookahead.py pins the decoder's logits themselves)."""
    model = Model.load("diffusion_gemma", path=model_dir, device="cpu")
    decoder = Decoder.from_preset("diffusion_gemma", {"decoder.commit.max_steps": 4})
    prompts = ["Make 10 from 2, 5, 1.", "Make 7 from 3, 4, 9, 2, 8.", "Make 30 from 5, 6.", "Make 24 from 1, 2, 3, 4."]
    together = decoder.generate(model, prompts, seed=7, gen_length=2 * CANVAS)
    alone = decoder.generate(model, prompts, seed=7, gen_length=2 * CANVAS, batch_size=1)
    assert [g.tokens.tolist() for g in alone] == [g.tokens.tolist() for g in together]


def test_served_requests_equal_the_api(model_dir: Path) -> None:
    """The OpenAI-compatible server decodes a uniform-noise model as the Python API does, request by request."""
    from fastapi.testclient import TestClient

    from dlmsearch.config import compose_settings
    from dlmsearch.serve.app import Server, create_app

    overrides = ["model=diffusion_gemma", f"model.path={model_dir}", "+decoder=diffusion_gemma", STEPS]
    server = Server(compose_settings(overrides, (), "serve"), overrides, "diffusion_gemma")
    prompts = ["Make 10 from 2, 5, 1.", "Make 7 from 3, 4, 9.", "Make 30 from 5, 6, 1."]
    with TestClient(create_app(server)) as client:
        served = [
            client.post(
                "/v1/completions",
                json={"model": "diffusion_gemma", "prompt": p, "max_tokens": 16, "seed": 4, "chat": False},
            ).json()
            for p in prompts
        ]
        streamed = client.post(
            "/v1/completions",
            json={
                "model": "diffusion_gemma",
                "prompt": prompts[1],
                "max_tokens": 16,
                "seed": 4,
                "chat": False,
                "stream": True,
            },
        )
        refused = client.post(
            "/v1/completions",
            json={"model": "diffusion_gemma", "prompt": prompts[0], "max_tokens": 16, "temperature": 0.7},
        )
    model = Model.load("diffusion_gemma", path=model_dir, device="cpu")
    decoder = Decoder.from_preset("diffusion_gemma", {"decoder.commit.max_steps": 3})
    for prompt, body in zip(prompts, served):
        offline = decoder.generate(model, [prompt], seed=4, chat=False, gen_length=16)[0]
        assert "choices" in body, body
        assert body["choices"][0]["text"] == offline.text
        assert body["usage"]["steps"] == offline.steps
        assert body["usage"]["decoder_forwards"] == offline.decoder_forwards == offline.steps - 2  # 2 canvases encoded
    assert refused.status_code == 400 and "would be ignored" in refused.json()["error"]["message"]
    pieces = [
        choice["text"]
        for line in streamed.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
        for choice in json.loads(line[len("data: ") :]).get("choices", [])
        if choice.get("text")
    ]
    assert "".join(pieces) == served[1]["choices"][0]["text"], "a stream sent a canvas that later changed"


def test_the_cli_takes_an_initial_canvas_through_the_task(model_dir: Path, tmp_path: Path) -> None:
    """``task.initial_canvas=FILE`` (one list of canvas ids per item) replays as the API's ``initial_canvas=``."""
    canvases = [[5 + j for j in range(CANVAS)], [40 + j for j in range(CANVAS)], [7] * CANVAS]
    path = tmp_path / "canvas.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in canvases))
    first = _run(model_dir, tmp_path / "a", "+decoder=diffusion_gemma", STEPS, f"task.initial_canvas={path}", "seed=1")
    again = _run(model_dir, tmp_path / "b", "+decoder=diffusion_gemma", STEPS, f"task.initial_canvas={path}", "seed=2")
    drawn = _run(model_dir, tmp_path / "c", "+decoder=diffusion_gemma", STEPS, "seed=1")
    read = lambda out: [json.loads(line)["output"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert first["items"] == again["items"] == drawn["items"] == 3
    assert read(tmp_path / "a") != read(tmp_path / "c"), "the given canvas changed nothing"
    path.write_text(json.dumps([1, 2, 3]) + "\n")
    with pytest.raises(ValueError, match=r"shape \[prompts, canvas_length\]"):
        _run(model_dir, tmp_path / "d", "+decoder=diffusion_gemma", STEPS, f"task.initial_canvas={path}")
