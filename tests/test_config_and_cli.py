"""Hydra presets compose, instantiate and decode; mistakes fail at start naming the key; the CLI
works from any directory, writes JSONL incrementally, resumes, and sweeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_denoiser
from hydra.errors import ConfigCompositionException

from dlmsearch.config import ConfigError, build, compose, compose_checked, decoder_presets
from dlmsearch.run import run
from dlmsearch.search.components.expansion import FixedDepth

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["adalook", "dream", "ete", "fast_block", "fast_dllm", "fast_dllm_factor", "fixed_depth", "llada", "random"]


@pytest.fixture(scope="module")
def sudoku_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Sudoku denoiser saved like the shipped one."""
    directory = tmp_path_factory.mktemp("tiny_sudoku")
    tiny_denoiser(vocab=10, mask_id=9, max_len=81, grid_side=9).save(directory)
    return directory


def test_all_required_presets_exist() -> None:
    assert set(PRESETS) <= set(decoder_presets())


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_instantiates_and_decodes(preset: str, sudoku_model: Path, tmp_path: Path) -> None:
    cfg = compose(
        [f"+decoder={preset}", f"model.path={sudoku_model}", "task.limit=2", f"out_dir={tmp_path}", "trace=true"]
    )
    summary = run(cfg)
    assert summary["decoder"] == preset and summary["items"] == 2
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {"id", "output", "correct", "steps", "row_forwards", "tokens_committed", "wall_seconds"} <= set(records[0])
    assert all(len(r["output"]) == 81 and "0" not in r["output"] for r in records)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["mean_steps"] == summary["mean_steps"] > 0
    traces = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert sum(len(e["positions"]) for e in traces[0]["events"]) == records[0]["tokens_committed"]
    for trace in traces:  # the search record: a lookahead ran exactly where a branch's commits were adopted
        depths = [d for e in trace["events"] for d in e["depth"]]
        levels = trace["lookahead"]
        assert bool(levels) == any(d >= 1 for d in depths)
        if levels:
            assert max(depths) <= max(level["depth"] for level in levels)
            assert all(len(level["live"]) == len(level["scores"]) >= 1 for level in levels)


def test_ete_and_adalook_differ_only_in_expansion_and_selection() -> None:
    ete = compose(["+decoder=ete"]).decoder
    ada = compose(["+decoder=adalook"]).decoder
    differing = {key for key in ete if ete[key] != ada[key]}
    assert differing == {"expansion", "selector", "name"}


def test_slot_swap_and_nested_override() -> None:
    decoder = build(compose(["+decoder=ete", "decoder/expansion=fixed_depth", "decoder.expansion.depth=3"]), "decoder")
    assert isinstance(decoder.expansion, FixedDepth) and decoder.expansion.depth == 3


def test_unknown_key_fails_at_compose_naming_it() -> None:
    with pytest.raises(ConfigCompositionException, match="max_dept"):
        compose(["+decoder=adalook", "decoder.expansion.max_dept=3"])
    with pytest.raises(
        ConfigError, match="unknown key 'decoder.expansion.max_dept'; did you mean decoder.expansion.max_depth"
    ):
        compose_checked(["+decoder=adalook", "decoder.expansion.max_dept=3"])


def test_added_unknown_key_fails_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"decoder\.expansion.*max_dept"):  # unchecked compose: at build
        build(compose(["+decoder=adalook", "+decoder.expansion.max_dept=3"]), "decoder")
    with pytest.raises(
        ConfigError, match="unknown key 'decoder.expansion.max_dept'; did you mean decoder.expansion.max_depth"
    ):
        compose_checked(["+decoder=adalook", "+decoder.expansion.max_dept=3"])


def test_wrong_type_fails_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"max_depth must be an integer, got 'abc'"):
        build(compose(["+decoder=adalook", "decoder.expansion.max_depth=abc"]), "decoder")
    with pytest.raises(ConfigError, match=r"continue_if must be one of above, below"):
        build(compose(["+decoder=adalook", "decoder.expansion.continue_if=sideways"]), "decoder")


def test_user_decoder_from_yaml(sudoku_model: Path, tmp_path: Path) -> None:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from dlmsearch.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose(
            "config",
            overrides=[
                f"hydra.searchpath=[file://{ROOT / 'experiments' / 'conf'}]",
                "+decoder=confident_lookahead",
                f"model.path={sudoku_model}",
                "task.limit=2",
                f"out_dir={tmp_path}",
            ],
        )
    assert run(cfg)["decoder"] == "confident_lookahead"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "dlmsearch", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cli_without_decoder_lists_presets(tmp_path: Path) -> None:
    """The bare command lists the presets (exit 0, tests/test_first_hour_cli.py); with overrides
    but no decoder, it is one line with the choices, exit 2."""
    done = cli("task.limit=2", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: no decoder chosen: add +decoder=NAME, one of: {', '.join(decoder_presets())}"
    ]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_cli_runs_from_another_directory_and_resumes(sudoku_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = cli("+decoder=fast_dllm", f"model.path={sudoku_model}", "task.limit=3", f"out_dir={out}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "fast_dllm on sudoku: 3 items" in first.stdout
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3
    (out / "results.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])  # a run killed mid-write
    again = cli("+decoder=fast_dllm", f"model.path={sudoku_model}", "task.limit=3", f"out_dir={out}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    records = [
        json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()[2:] if line.startswith('{"id')
    ]
    assert [r["id"] for r in records] == [json.loads(lines[2])["id"]]  # only the lost item was decoded again
    assert json.loads((out / "summary.json").read_text())["items"] == 3


def test_cli_errors_are_one_line(sudoku_model: Path, tmp_path: Path) -> None:
    missing = cli("+decoder=llada", "model.path=/nonexistent/model", cwd=tmp_path)
    assert missing.returncode == 2 and "model.path=/nonexistent/model is not a directory" in missing.stderr
    bad_type = cli("+decoder=adalook", f"model.path={sudoku_model}", "decoder.expansion.max_depth=deep", cwd=tmp_path)
    assert bad_type.returncode == 2 and "max_depth must be an integer" in bad_type.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    no_items = cli("+decoder=llada", f"model.path={sudoku_model}", f"task.path={empty}", cwd=tmp_path)
    assert no_items.returncode == 2 and "no puzzles in file" in no_items.stderr


# A multirun sweeping decoders (each job runs, the table is printed): tests/test_cli_errors.py
