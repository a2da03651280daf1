"""The Python API (dlmsearch.api): presets with overrides, loading models, and generating, with
the same tokens and counters as the CLI path (dlmsearch.run.run) for the same prompts and puzzles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tiny_checkpoints import requires_upstream

from dlmsearch.api import Decoder, Model
from dlmsearch.config import ConfigError, compose
from dlmsearch.run import run
from dlmsearch.tasks.sudoku_files import load_puzzles, tier_path
from dlmsearch.tasks.sudoku_grids import grid_to_string

PROMPTS = ["What is 7 * 8? Answer briefly.", "Hello there"]
COUNTERS = ("steps", "row_forwards", "token_forwards", "tokens_committed")


@pytest.fixture(scope="module")
def sudoku_model() -> Model:
    return Model.load("sudoku")


def test_values_reach_the_config_verbatim(sudoku_model: Model) -> None:
    """Values are set on the composed config as Python data: nothing is quoted or interpolated."""
    for text in ("/tmp/a dir, with 'quotes'/m", "null", "C:\\models\\", "it\\'s", "x${seed}", "a=b", "[1, 2]"):
        cfg = Decoder.from_preset("llada", overrides={"decoder.name": text}).config(sudoku_model)
        assert cfg.decoder.name == text
    cfg = Decoder.from_preset("llada", overrides={"engine.row_budget": 3, "deadline_s": None}).config(sudoku_model)
    assert cfg.engine.row_budget == 3 and cfg.deadline_s is None


def test_from_preset_with_overrides(sudoku_model: Model) -> None:
    decoder = Decoder.from_preset(
        "adalook",
        overrides={
            "decoder.expansion.max_depth": 3,
            "decoder.commit.threshold": 0.8,
            "engine.cache": "none",
            "seed": 5,
        },
    )
    cfg = decoder.config(sudoku_model)
    assert cfg.decoder.expansion.max_depth == 3 and cfg.decoder.commit.threshold == 0.8 and cfg.engine.seed == 5
    # generate()'s own arguments win over the preset's overrides
    assert decoder.config(sudoku_model, seed=7).engine.seed == 7
    swapped = Decoder.from_preset("ete", overrides=["decoder/expansion=fixed_depth", "decoder.expansion.depth=3"])
    assert swapped.config(sudoku_model).decoder.expansion.depth == 3
    assert Decoder.from_preset("fast_dllm", decoding="text").config(sudoku_model).decoder.commit.threshold == 0.9
    assert (
        Decoder.from_preset("fast_dllm").config(sudoku_model).decoder.commit.threshold == 0.99
    )  # the task's (Sudoku) defaults


def test_from_preset_mistakes_name_the_key() -> None:
    with pytest.raises(ValueError, match="unknown decoder preset 'adalok'; did you mean adalook"):
        Decoder.from_preset("adalok")
    with pytest.raises(
        ConfigError, match="unknown key 'decoder.expansion.max_dept'; did you mean decoder.expansion.max_depth"
    ):
        Decoder.from_preset("adalook", overrides={"decoder.expansion.max_dept": 3})
    with pytest.raises(
        ConfigError, match="unknown key 'decoder.expansion.max_dept'; did you mean decoder.expansion.max_depth"
    ):  # a string override: the same line
        Decoder.from_preset("adalook", overrides=["decoder.expansion.max_dept=3"])
    with pytest.raises(ValueError, match="'decoder/expansion' is a config group"):
        Decoder.from_preset("adalook", overrides={"decoder/expansion": "../x"})
    with pytest.raises(ConfigError, match="max_depth"):
        Decoder.from_preset("adalook", overrides={"decoder.expansion.max_depth": "abc"})
    with pytest.raises(
        ConfigError,
        match="unknown decoder/expansion 'deep'; one of: confidence_depth, fixed_depth, gumbel_halving, one_step, puct, variance_gate",
    ):
        Decoder.from_preset("adalook", overrides={"decoder/expansion": "deep"})
    with pytest.raises(ValueError, match=r"'model.device' .*Model.load"):
        Decoder.from_preset("adalook", overrides={"model.device": "cpu"})
    with pytest.raises(ValueError, match="unknown model 'lama'"):
        Model.load("lama")


def test_sudoku_generate_matches_the_cli(sudoku_model: Model, tmp_path: Path) -> None:
    puzzles = [grid_to_string(p.puzzle) for p in load_puzzles(tier_path("easy"))[:2]]
    generations = Decoder.from_preset("adalook").generate(sudoku_model, puzzles, batch_size=2)
    run(compose(["+decoder=adalook", "task.limit=2", "batch_size=2", f"out_dir={tmp_path}"]))
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(generations) == len(records) == 2
    for generation, record in zip(generations, records):
        assert len(generation.text) == 81 and generation.text == record["output"]
        assert generation.correct == record["correct"]
        assert all(getattr(generation, key) == record[key] for key in COUNTERS)
        assert generation.tokens.shape == (81,)
    with pytest.raises(ValueError, match=r"puzzles\[1\]: puzzle must be 81 characters"):
        Decoder.from_preset("llada").generate(sudoku_model, [puzzles[0], "123"])
    with pytest.raises(ValueError, match="one block of 81 cells"):
        Decoder.from_preset("llada").generate(sudoku_model, puzzles, gen_length=32)
    with pytest.raises(TypeError, match="list of strings"):
        Decoder.from_preset("llada").generate(sudoku_model, puzzles[0])


def _cli_tokens(trace_line: str, gen_length: int) -> torch.Tensor:
    """The generation rebuilt from a CLI trace (each position's committed token)."""
    tokens = torch.full((gen_length,), -1, dtype=torch.long)
    for event in json.loads(trace_line)["events"]:
        tokens[event["positions"]] = torch.tensor(event["tokens"])
    return tokens


@requires_upstream
@pytest.mark.parametrize("family,preset,cache", [("llada", "adalook", "dual"), ("dream", "dream", "none")])
def test_text_generate_matches_the_cli(checkpoints, family: str, preset: str, cache: str, tmp_path: Path) -> None:
    spec = checkpoints[family]
    model = Model.load(family, path=spec.directory, device="cpu")
    assert model.is_text and model.adapter.mask_id == spec.mask_id and model.adapter.device == "cpu"
    stop_ids = model.config.stop_ids  # read from the checkpoint (${checkpoint:stop_ids}): a plain list
    assert list(OmegaConf.to_container(stop_ids) if OmegaConf.is_config(stop_ids) else stop_ids) == spec.stop_ids
    assert model.tokenizer.convert_tokens_to_ids(model.tokenizer.eos_token) in spec.stop_ids
    generations = Decoder.from_preset(preset).generate(
        model, PROMPTS, gen_length=16, block_length=8, batch_size=2, cache=cache
    )

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "cli"
    overrides = [
        f"+decoder={preset}",
        f"model={family}",
        f"model.path={spec.directory}",
        "model.device=cpu",
        "task=prompts",
        f"task.path={prompts}",
    ]
    run(
        compose(
            [
                *overrides,
                "task.gen_length=16",
                "task.block_length=8",
                f"engine.cache={cache}",
                "batch_size=2",
                "trace=true",
                f"out_dir={out}",
            ]
        )
    )
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    traces = (out / "trace.jsonl").read_text().splitlines()
    assert len(generations) == len(records) == 2
    for generation, record, trace in zip(generations, records, traces):
        assert isinstance(generation.text, str) and generation.text == record["output"] and generation.correct is None
        assert all(getattr(generation, key) == record[key] for key in COUNTERS) and generation.steps > 0
        assert torch.equal(generation.tokens, _cli_tokens(trace, 16))


@requires_upstream
def test_width_search_on_a_text_model(checkpoints) -> None:
    """A population on a text model: particles vote over the stated answers, with the hybrid score."""
    model = Model.load("llada", path=checkpoints["llada"].directory, device="cpu")
    overrides = [
        "decoder/population/choice=majority_vote",
        "decoder/population/score=hybrid",
        "decoder.population.size=3",
    ]
    generations = Decoder.from_preset("best_of_n", overrides=overrides).generate(
        model, PROMPTS, gen_length=16, block_length=8, batch_size=2
    )
    plain = Decoder.from_preset("fast_dllm").generate(model, PROMPTS, gen_length=16, block_length=8, batch_size=2)
    for generation, single in zip(generations, plain):
        assert isinstance(generation.text, str) and 1.0 <= generation.live_particles <= 3.0
        assert single.row_forwards <= generation.row_forwards <= 3 * generation.steps
