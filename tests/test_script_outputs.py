"""The experiment scripts: ``--help`` everywhere, and no quick look writes a committed file.

Every ``experiments/*.py`` and ``experiments/*.sh`` prints its help and exits 0 without touching a
committed file. A script that regenerates committed results (``docs/``, ``experiments/results/``,
``dlmsearch/data/``) writes under ``runs/`` unless ``--write-committed`` is given, and refuses a
committed output path given without it (``experiments/outputs.py``).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
SCRIPTS = sorted(p.name for p in EXPERIMENTS.glob("*.py"))
SHELL_SCRIPTS = sorted(p.name for p in EXPERIMENTS.glob("*.sh"))
WATCHED = ("docs", "experiments/results", "dlmsearch/data")

# Runs every script's --help in a child forked from one process that has imported the heavy
# dependencies once (a fresh interpreter per script costs 5-10 s each on 2 busy cores). Each child
# gets 60 s: a script that ignores --help and runs is stopped.
DRIVER = r"""
import json, os, runpy, signal, sys, time, traceback
for name in ("torch", "numpy", "matplotlib", "hydra", "omegaconf", "safetensors.torch", "transformers", "httpx", "openai",
             "dlmsearch.config", "dlmsearch.run", "dlmsearch.api"):
    try:
        __import__(name)
    except Exception:
        pass
import matplotlib
matplotlib.use("Agg")
scratch, scripts = sys.argv[1], sys.argv[2:]
found = {}
for path in scripts:
    capture = os.path.join(scratch, os.path.basename(path) + ".out")
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)  # its own group: whatever a runaway script starts is stopped with it
        fd = os.open(capture, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = [path, "--help"]
        sys.path.insert(0, os.path.dirname(path))
        code = 0
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() - started > 60:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            code = "timeout"
            break
        time.sleep(0.05)
    with open(capture, errors="replace") as handle:
        found[os.path.basename(path)] = {"code": code, "seconds": round(time.monotonic() - started, 1), "output": handle.read()[-3000:]}
print(json.dumps(found))
"""


def snapshot() -> dict[str, tuple[int, int] | None]:
    """Modification time and size of every committed file in the watched folders (hand-written pages
    under docs/ left out: they are edited, never generated), and the untracked files there."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", *WATCHED], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    extra = subprocess.run(
        ["git", "ls-files", "-z", "--others", "--exclude-standard", "--", "experiments/results", "dlmsearch/data"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    found: dict[str, tuple[int, int] | None] = {}
    for name in filter(None, tracked + extra):
        if name.startswith("docs/") and name.endswith(".md"):
            continue
        path = ROOT / name
        found[name] = (path.stat().st_mtime_ns, path.stat().st_size) if path.exists() else None
    return found


@pytest.fixture(scope="module")
def helps(tmp_path_factory: pytest.TempPathFactory) -> dict:
    before = snapshot()
    scratch = tmp_path_factory.mktemp("helps")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(scratch), *(str(EXPERIMENTS / s) for s in SCRIPTS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name in SHELL_SCRIPTS:
        ran = subprocess.Popen(
            ["bash", str(EXPERIMENTS / name), "--help"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = ran.communicate(timeout=20)
            found[name] = {"code": ran.returncode, "output": output}
        except subprocess.TimeoutExpired:  # it ignored --help and ran: stop it and all it started
            os.killpg(ran.pid, signal.SIGKILL)
            found[name] = {"code": "timeout", "output": ran.communicate()[0]}
    return {"scripts": found, "before": before, "after": snapshot()}


@pytest.mark.parametrize("script", SCRIPTS + SHELL_SCRIPTS)
def test_help_prints_help_and_exits_0(helps: dict, script: str) -> None:
    got = helps["scripts"][script]
    assert got["code"] == 0, f"{script} --help: exit {got['code']}\n{got['output']}"
    text = got["output"].lower()
    assert "usage" in text or "powered by hydra" in text or "--write-committed" in text, (
        f"{script} --help printed no help:\n{got['output']}"
    )


def test_help_writes_no_committed_file(helps: dict) -> None:
    before, after = helps["before"], helps["after"]
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not changed, f"--help changed committed files: {changed}"


# ---------------------------------------------------------------------------------------------
# Where each script writes: resolved by its parse_args (no decoding needed).

from outputs import committed

RESULTS = ROOT / "experiments" / "results"
COMMITTED_DOC = ROOT / "docs" / "sudoku_width.png"

# module, arguments it needs, the output attributes, the committed default (--write-committed), an explicit committed path refused
CASES = [
    ("serve_load", [], ["out"], RESULTS / "serve", ["--out", str(RESULTS / "serve")]),
    ("forward_ops", [], ["out"], RESULTS / "bench", ["--out", str(RESULTS / "bench")]),
    (
        "adaptive_caches",
        ["--limit", "4"],
        ["out", "runs"],
        RESULTS / "adaptive_caches",
        ["--out", str(RESULTS / "adaptive_caches")],
    ),
    ("block_model_card", ["--limit", "4"], ["out"], RESULTS / "block", ["--out", str(RESULTS / "block")]),
    ("revision_card", ["--limit", "4"], ["out"], RESULTS / "revision", ["--out", str(RESULTS / "revision")]),
    (
        "stop_at_eos",
        ["--limit", "4"],
        ["out"],
        RESULTS / "countdown" / "small" / "stop_at_eos",
        ["--out", str(RESULTS / "countdown")],
    ),
    ("bench_before_after", ["--before", "HEAD"], ["out"], RESULTS / "bench", ["--out", str(RESULTS / "bench")]),
    (
        "countdown_model_card",
        ["--limit", "4"],
        ["card", "figure"],
        ROOT / "docs" / "countdown_decoders.png",
        ["--figure", str(ROOT / "docs" / "x.png")],
    ),
    (
        "sudoku_model_card",
        ["--limit", "4"],
        ["card", "figure", "width_figure"],
        COMMITTED_DOC,
        ["--card", str(ROOT / "dlmsearch" / "data" / "sudoku_model" / "README.md")],
    ),
    (
        "ship_model",
        [],
        ["dest"],
        ROOT / "dlmsearch" / "data" / "sudoku_model",
        ["--dest", str(ROOT / "dlmsearch" / "data" / "countdown_model")],
    ),
    (
        "make_countdown_tiers",
        [],
        ["out"],
        ROOT / "dlmsearch" / "data" / "countdown",
        ["--out", str(ROOT / "dlmsearch" / "data" / "countdown")],
    ),
    ("make_sudoku_tiers", [], ["out"], ROOT / "dlmsearch" / "data", ["--out", str(ROOT / "dlmsearch" / "data")]),
    (
        "countdown_token_frequencies",
        [],
        ["out"],
        ROOT / "dlmsearch" / "data" / "countdown_model" / "token_frequencies.json",
        ["--out", str(ROOT / "dlmsearch" / "data" / "countdown_model" / "token_frequencies.json")],
    ),
    ("plot_sudoku_trace", ["runs/trace_demo"], ["out"], None, ["--out", str(ROOT / "docs" / "sudoku_trace.png")]),
    ("compare_cards", ["a.json", "b.json"], [], None, ["--out", str(RESULTS / "revision" / "before_after.md")]),
    ("bench_engine", [], [], None, ["--out", str(RESULTS / "bench" / "tiny.json")]),
]


@pytest.mark.parametrize("name, needed, attributes, committed_default, refused", CASES, ids=[c[0] for c in CASES])
def test_default_outputs_are_not_committed(
    name: str, needed: list[str], attributes: list[str], committed_default: Path | None, refused: list[str]
) -> None:
    module = importlib.import_module(name)
    args = module.parse_args(needed)
    for attribute in attributes:
        path = getattr(args, attribute)
        assert not committed(path), f"{name}: --{attribute.replace('_', '-')} defaults to the committed {path}"
    if committed_default is not None:
        forced = module.parse_args([*needed, "--write-committed"])
        paths = [Path(getattr(forced, a)).resolve() for a in attributes]
        assert committed_default.resolve() in paths or any(committed_default.resolve() in p.parents for p in paths), (
            name,
            paths,
        )
    with pytest.raises(SystemExit) as stop:
        module.parse_args([*needed, *refused])
    assert stop.value.code == 2
    module.parse_args([*needed, *refused, "--write-committed"])  # the explicit path, with the flag


def test_sudoku_card_redirected_keeps_its_width_figure_out_of_docs(tmp_path: Path) -> None:
    import sudoku_model_card

    args = sudoku_model_card.parse_args(
        ["--card", str(tmp_path / "card.md"), "--figure", str(tmp_path / "decoders.png")]
    )
    assert args.width_figure == tmp_path / "sudoku_width.png"
    args = sudoku_model_card.parse_args(["--write-committed"])
    assert (args.figure, args.width_figure) == (ROOT / "docs" / "sudoku_decoders.png", COMMITTED_DOC)


def test_adaptive_caches_quick_look_decodes_afresh() -> None:
    """``--limit N`` writes to a folder of its own, and the committed rows (every problem) are not its rows."""
    import adaptive_caches

    args = adaptive_caches.parse_args(["--limit", "4"])
    assert (
        args.out != adaptive_caches.COMMITTED_OUT and args.out.name == "limit4" and args.runs.is_relative_to(args.out)
    )
    assert adaptive_caches.parse_args(["--limit", "8"]).out != args.out
    committed_rows = adaptive_caches.done_rows(adaptive_caches.COMMITTED_OUT / "countdown.jsonl")
    assert committed_rows and not adaptive_caches.same_limit(committed_rows, 4)
    assert adaptive_caches.same_limit(committed_rows, None) == committed_rows  # the full run still resumes from them


def test_committed_paths() -> None:
    for path in (
        "docs/sudoku_width.png",
        "experiments/results",
        "experiments/results/new/table.md",
        "dlmsearch/data/sudoku_model",
        "README.md",
        "experiments/width_search_card.md",
        ".",
    ):
        assert committed(ROOT / path), path
    for path in ("runs/serve_load", "runs", "experiments/runs/block_card"):
        assert not committed(ROOT / path), path
    assert not committed(Path("/tmp/card.md"))
