"""A new user's first mistakes (issue 35, items 2, 3, 5 and 9): every override is read by someone
or refused in one line that names it and the closest valid name, exit 2, on the command line as
in the Python API and the server's composition; text lengths follow what the model was trained
for; a multirun ends with its comparison table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_denoiser

from dlmsearch.api import compose_settings
from dlmsearch.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sudoku_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Sudoku denoiser saved like the shipped one: a run that is not refused is quick."""
    directory = tmp_path_factory.mktemp("tiny_sudoku")
    tiny_denoiser(vocab=10, mask_id=9, max_len=81, grid_side=9).save(directory)
    return directory


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "dlmsearch", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def refused(done: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refused command line (exit 2)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-2000:], done.stdout[-500:])
    return lines[0]


MISTAKES = [
    # item 2: a misspelled +group= or +key= was silently ignored (exit 0)
    (["+decoder/populaton=smc"], "error: unknown config group 'decoder/populaton'; did you mean decoder/population?"),
    (["+seeed=3"], "error: unknown key 'seeed'; did you mean seed?"),
    (["+task.limt=3"], "error: unknown key 'task.limt'; did you mean task.limit?"),
    (
        ["+decoder.comit.threshold=0.5"],
        "error: unknown key 'decoder.comit.threshold'; did you mean decoder.commit.threshold?",
    ),
    # item 3: Hydra's 3-35 lines and exit 1
    (
        ["decoder.expansion.max_dept=3"],
        "error: unknown key 'decoder.expansion.max_dept'; did you mean decoder.expansion.max_depth?",
    ),
    (
        ["decoder.comit.threshold=0.5"],
        "error: unknown key 'decoder.comit.threshold'; did you mean decoder.commit.threshold?",
    ),
    (["+decoder=adaloook"], "error: unknown decoder 'adaloook'; did you mean adalook?"),
    (["model=lada"], "error: unknown model 'lada'; did you mean llada or llada2?"),
    (["cache=duall"], "error: unknown cache 'duall'; did you mean dual?"),
]


@pytest.mark.parametrize("mistake,line", MISTAKES, ids=[m[0][0] for m in MISTAKES])
def test_a_mistake_is_one_line_with_the_closest_name(
    mistake: list[str], line: str, sudoku_model: Path, tmp_path: Path
) -> None:
    decoder = [] if any(m.startswith("+decoder=") for m in mistake) else ["+decoder=adalook"]
    done = cli(
        *decoder, *mistake, f"model.path={sudoku_model}", "task.limit=1", f"out_dir={tmp_path / 'run'}", cwd=tmp_path
    )
    assert refused(done) == line
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_each_value_of_a_sweep_is_checked(sudoku_model: Path, tmp_path: Path) -> None:
    done = cli(
        "-m",
        "+decoder=llada,adaloook",
        f"model.path={sudoku_model}",
        "task.limit=1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert (
        refused(done) == "error: in the job with +decoder=adaloook: unknown decoder 'adaloook'; did you mean adalook?"
    )
    assert not list(tmp_path.glob("sweep/*/results.jsonl"))  # refused before the first job


def test_hydra_flags_still_work(tmp_path: Path) -> None:
    """The check leaves Hydra's own flags and settings alone."""
    shown = cli(
        "--cfg",
        "job",
        "+decoder=adalook",
        f"hydra.run.dir={tmp_path / 'x'}",
        "decoder.expansion.max_depth=2",
        cwd=tmp_path,
    )
    assert shown.returncode == 0 and "max_depth: 2" in shown.stdout, shown.stderr
    assert cli("--help", cwd=tmp_path).returncode == 0
    experiment = cli("--cfg", "job", "+experiment=ablate_gate", "ablate.arm=fixed_d2", cwd=tmp_path)
    assert experiment.returncode == 0 and "arm: fixed_d2" in experiment.stdout, experiment.stderr


def test_the_api_and_the_server_composition_refuse_the_same(tmp_path: Path) -> None:
    from dlmsearch.api import Decoder, Model

    with pytest.raises(
        ConfigError, match=r"^unknown key 'decoder.comit.threshold'; did you mean decoder.commit.threshold\?$"
    ):
        Decoder.from_preset("adalook", overrides=["+decoder.comit.threshold=0.5"])
    with pytest.raises(ConfigError, match=r"^unknown key 'model.devise'; did you mean model.device\?$"):
        Model.load("sudoku", devise="cpu")
    # the server composes its lanes so, from conf/serve.yaml
    with pytest.raises(
        ConfigError, match=r"^unknown config group 'decoder/populaton'; did you mean decoder/population\?$"
    ):
        compose_settings(["+decoder=adalook", "+decoder/populaton=smc"], (), "serve")
    with pytest.raises(ConfigError, match=r"^unknown key 'seeed'; did you mean seed\?$"):
        compose_settings(["+decoder=adalook", "+seeed=3"], (), "serve")


@pytest.mark.parametrize(
    "mistake,line",
    [
        (["+decoder=fast_dllm", "serve.prot=1"], "error: unknown key 'serve.prot'; did you mean serve.port?"),
        (["+decoder=fast_dlm"], "error: unknown decoder 'fast_dlm'; did you mean fast_dllm?"),
    ],
    ids=["serve.prot", "fast_dlm"],
)
def test_the_server_command_line_is_checked_too(mistake: list[str], line: str, tmp_path: Path) -> None:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "dlmsearch.serve", *mistake],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused(done) == line


# item 5: text lengths default to what the model was trained for (countdown: 16 in blocks of 8, 128 positions)
def test_cli_text_lengths_follow_the_model(tmp_path: Path) -> None:
    done = cli(
        "+decoder=llada",
        "model=countdown",
        "model.device=cpu",
        "task=prompts",
        "task.prompt='Make 12 from 3, 5, 7.'",
        f"out_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "llada on prompts: 1 items" in done.stdout


def test_api_text_lengths_follow_the_model() -> None:
    from dlmsearch.api import Decoder, Model

    model = Model.load("countdown", device="cpu")
    [out] = Decoder.from_preset("llada").generate(model, ["Make 12 from 3, 5, 7."])
    assert out.tokens.shape == (16,)
    assert model.lengths == (16, 8)  # what lm-eval's backend takes when model_args give none


def test_lm_eval_text_lengths_follow_the_model() -> None:
    pytest.importorskip("lm_eval")
    from dlmsearch.lm_eval import DLMSearchLM

    lm = DLMSearchLM(family="countdown", decoder="llada", device="cpu")
    assert (lm.gen_length, lm.block_length) == (16, 8)


# item 9: a plain multirun ends with the comparison table
def test_multirun_prints_the_comparison_table(sudoku_model: Path, tmp_path: Path) -> None:
    done = cli(
        "-m",
        "+decoder=llada,fast_dllm",
        f"model.path={sudoku_model}",
        "task.limit=1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0].startswith("| # | config | judged | solved | accuracy")
    assert [row.split(" | ")[1] for row in table[2:]] == ["decoder=llada", "decoder=fast_dllm"]
    assert (tmp_path / "sweep" / "sweep.md").exists()
    summaries = sorted(json.loads(p.read_text())["decoder"] for p in (tmp_path / "sweep").glob("*/summary.json"))
    assert summaries == ["fast_dllm", "llada"]  # each job ran
