"""A newcomer's first hour, measured again (issue 51, items 1, 2 and 8), as a user types it: a key
or value mistake anywhere (a YAML file of one's own, a preset, an override) is one line naming the
full key and the closest valid name, before any model loads; the bare command lists the presets;
a run that never decoded leaves nothing behind, one that failed while decoding says so in its
run.json; each arm of the gate ablation names itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_denoiser
from omegaconf import open_dict

from dlmsearch.config import ConfigError, compose, decoder_presets
from dlmsearch.models import loading
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.group_decisions import GroupDiverged
from dlmsearch.run import run

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "OMP_NUM_THREADS": "1"}


def cli(*args: str, cwd: Path, module: str = "dlmsearch") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def refused(done: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refused command (exit 2)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-2000:], done.stdout[-500:])
    return lines[0]


def left_behind(cwd: Path, *kept: str) -> list[str]:
    """What a command left in its working directory, besides ``kept``."""
    return sorted(p.name for p in cwd.iterdir() if p.name not in kept)


@pytest.fixture(scope="module")
def sudoku_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Sudoku denoiser saved like the shipped one: a run is quick."""
    directory = tmp_path_factory.mktemp("tiny_sudoku")
    tiny_denoiser(vocab=10, mask_id=9, max_len=81, grid_side=9).save(directory)
    return directory


class _Diverges(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        raise GroupDiverged("the group's collectives no longer pair (simulated)")


def diverging_sudoku(
    path: str | None = None, mask_id: int = 9, vocab_size: int = 10, device: str = "cpu", dtype: str = "float32"
) -> ModelAdapter:
    """A Sudoku model whose every forward fails as nothing can decode on (``model._target_=test_first_hour_cli.diverging_sudoku``)."""
    adapter = loading.load_denoiser(path, mask_id, vocab_size, device, dtype)
    adapter.module = _Diverges()
    return adapter


# ----------------------------------------------------------------- item 1: one line, before loading


def test_a_typo_in_a_users_decoder_file_names_the_closest_key(tmp_path: Path) -> None:
    own = tmp_path / "conf" / "decoder"
    own.mkdir(parents=True)
    text = (ROOT / "experiments" / "conf" / "decoder" / "confident_lookahead.yaml").read_text()
    (own / "mine.yaml").write_text(text.replace("depth: 2", "dept: 2"))
    done = cli(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "+decoder=mine", "task.limit=2", cwd=tmp_path)
    assert refused(done) == "error: unknown key 'decoder.expansion.dept'; did you mean decoder.expansion.depth?"
    assert left_behind(tmp_path, "conf") == []


@pytest.mark.parametrize(
    "override,line",
    [
        (
            "decoder.expansion.max_dept=3",
            "unknown key 'decoder.expansion.max_dept'; did you mean decoder.expansion.max_depth?",
        ),
        ("decoder.expansion.max_depth=abc", "decoder.expansion.max_depth must be an integer, got 'abc'"),
        ("decoder.candidates.k=0", "decoder.candidates.k must be within [1, inf], got 0"),
    ],
    ids=["key", "type", "value"],
)
def test_a_wrong_key_or_value_is_named_before_the_model_loads(override: str, line: str, tmp_path: Path) -> None:
    """A text model whose directory does not exist: the decoder's mistake is what the line names."""
    model = ["model=countdown", "task=countdown", f"model.path={tmp_path / 'no_model'}"]
    done = cli("+decoder=adalook", override, *model, "task.limit=2", cwd=tmp_path)
    assert refused(done) == f"error: {line}"
    assert left_behind(tmp_path) == []


def test_values_and_keys_are_checked_before_the_weights_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run itself checks a config built elsewhere (the Python API, a script) before the model."""
    loaded: list[str] = []
    monkeypatch.setattr(loading, "load_denoiser", lambda *args, **kwargs: loaded.append("model"))
    out = tmp_path / "run"
    bad_value = compose(["+decoder=adalook", "decoder.expansion.max_depth=abc", f"out_dir={out}"])
    with pytest.raises(ConfigError, match=r"^decoder.expansion.max_depth must be an integer, got 'abc'$"):
        run(bad_value)
    bad_key = compose(["+decoder=adalook", f"out_dir={out}"])
    with open_dict(bad_key):
        bad_key.decoder.candidates.kk = 3  # as a preset's typo would be
    with pytest.raises(
        ConfigError, match=r"^unknown key 'decoder.candidates.kk'; did you mean decoder.candidates.k\?$"
    ):
        run(bad_key)
    assert loaded == [] and not out.exists()  # nothing loaded, and the directory it made is gone again


# --------------------------------------------------- item 2: the bare command, what a run leaves


def test_the_bare_command_lists_the_presets_and_leaves_nothing(tmp_path: Path) -> None:
    for module in ("dlmsearch", "dlmsearch.serve"):
        done = cli(cwd=tmp_path, module=module)
        assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
        assert done.stdout.startswith(f"python -m {module} +decoder=NAME")
        assert [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")] == decoder_presets()
    assert left_behind(tmp_path) == []


def test_a_run_that_fails_before_decoding_leaves_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "no_model"
    line = f"error: model: FileNotFoundError: model.path={missing} is not a directory"
    assert refused(cli("+decoder=llada", f"model.path={missing}", "task.limit=1", cwd=tmp_path)) == line
    deep = cli("+decoder=llada", f"model.path={missing}", f"out_dir={tmp_path / 'runs' / 'a'}", cwd=tmp_path)
    assert refused(deep) == line
    assert left_behind(tmp_path) == []  # no outputs/<date>/<time>/, no runs/a


def test_run_json_says_how_the_run_ended(sudoku_model: Path, tmp_path: Path) -> None:
    common = [f"model.path={sudoku_model}", "task.limit=2", "examples=0"]
    failed = cli(
        "+decoder=fast_dllm",
        "model._target_=test_first_hour_cli.diverging_sudoku",
        *common,
        f"out_dir={tmp_path / 'failed'}",
        cwd=tmp_path,
    )
    assert failed.returncode == 1, failed.stderr[-2000:]
    stored = json.loads((tmp_path / "failed" / "run.json").read_text())
    assert stored["status"] == "failed"
    assert stored["error"] == "GroupDiverged: the group's collectives no longer pair (simulated)"
    finished = cli("+decoder=fast_dllm", *common, f"out_dir={tmp_path / 'finished'}", cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr[-2000:]
    stored = json.loads((tmp_path / "finished" / "run.json").read_text())
    assert stored["status"] == "finished" and "error" not in stored


# ------------------------------------------------------------ item 8: the ablation's arms named


def test_each_arm_of_the_gate_ablation_names_itself(sudoku_model: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    done = cli(
        "-m",
        "+experiment=ablate_gate",
        "ablate.arm=fixed_d1,gate_above_T1e-2_D3",
        "decoder.candidates.k=4",
        f"model.path={sudoku_model}",
        "task.limit=1",
        "examples=0",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    heads = [line.split(": ")[0] for line in done.stdout.splitlines() if " on sudoku: " in line]
    assert heads == ["adalook [ablate.arm=fixed_d1] on sudoku", "adalook [ablate.arm=gate_above_T1e-2_D3] on sudoku"]
    labels = sorted(json.loads(path.read_text())["label"] for path in sweep.glob("*/summary.json"))
    assert labels == ["ablate.arm=fixed_d1", "ablate.arm=gate_above_T1e-2_D3"]
