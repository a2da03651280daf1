"""Production behaviour of a run: one failing item does not end it (retry alone, fallback, error
record, non-zero exit), deadlines, the summary a production user reads, SIGTERM/SIGKILL and
resume, and torchrun scale-out with a merge identical to one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port

from dlmsearch.config import compose
from dlmsearch.run import run

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def cli(*overrides: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dlmsearch", *overrides],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=timeout,
        check=False,
    )


def test_a_failing_item_gets_an_error_record_and_the_run_goes_on(tmp_path: Path) -> None:
    # the first easy puzzle starts with a clue "4" (token 3): poison every canvas whose first cell holds it
    done = cli(
        "+decoder=fast_dllm",
        "model._target_=production_models.faulty_sudoku",
        "+model.kind=clue",
        "+model.value=3",
        "task.limit=6",
        "batch_size=3",
        f"out_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-1500:]
    rows = records(tmp_path)
    failed = [r for r in rows if r.get("error")]
    assert len(rows) == 6 and len(failed) >= 1 and all("NaN logits" in r["error"] for r in failed)
    assert all(r["output"] for r in rows if not r.get("error"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == len(failed) and summary["items"] == 6


def test_fallback_decodes_what_the_decoder_cannot(tmp_path: Path) -> None:
    cfg = compose(
        [
            "+decoder=adalook",
            "model._target_=production_models.faulty_sudoku",
            "+model.kind=rows",
            "+model.value=1",
            "task.limit=3",
            "batch_size=3",
            "fallback=fast_dllm",
            f"out_dir={tmp_path}",
        ]
    )
    summary = run(cfg)
    rows = records(tmp_path)
    assert summary["fallbacks"] == 3 and summary["errors"] == 0
    assert all(r["fallback"] == "fast_dllm" and len(r["output"]) == 81 for r in rows)
    plain = run(compose(["+decoder=fast_dllm", "task.limit=3", f"out_dir={tmp_path / 'plain'}"]))
    assert [r["output"] for r in rows] == [r["output"] for r in records(tmp_path / "plain")]
    assert plain["fallbacks"] == 0


def test_deadline_finishes_with_the_base_rule(tmp_path: Path) -> None:
    summary = run(compose(["+decoder=adalook", "task.limit=4", "deadline_s=0", f"out_dir={tmp_path / 'a'}"]))
    assert summary["deadline_hits"] == 4
    run(compose(["+decoder=fast_block", "task.limit=4", f"out_dir={tmp_path / 'b'}"]))
    assert [r["output"] for r in records(tmp_path / "a")] == [r["output"] for r in records(tmp_path / "b")]
    assert all(r["deadline_hit"] for r in records(tmp_path / "a"))


def test_summary_reports_latency_throughput_memory(tmp_path: Path) -> None:
    summary = run(compose(["+decoder=fast_dllm", "task.limit=5", "batch_size=2", f"out_dir={tmp_path}"]))
    assert 0 < summary["latency_p50_s"] <= summary["latency_p95_s"] <= summary["latency_p99_s"]
    assert summary["samples_per_s"] > 0 and summary["tokens_per_s"] > 0 and summary["peak_rss_mb"] > 0
    assert (summary["errors"], summary["fallbacks"], summary["deadline_hits"]) == (0, 0, 0)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.slow
def test_interrupted_run_resumes_without_loss_or_duplicates(sig: signal.Signals, tmp_path: Path) -> None:
    args = ["+decoder=fast_dllm", "task.limit=24", "batch_size=2"]
    whole = tmp_path / "whole"
    assert cli(*args, f"out_dir={whole}", cwd=tmp_path).returncode == 0
    cut = tmp_path / "cut"
    process = subprocess.Popen(
        [sys.executable, "-m", "dlmsearch", *args, f"out_dir={cut}"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        (cut / "results.jsonl").exists() and (cut / "results.jsonl").read_text().count("\n") >= 4
    ):
        time.sleep(0.05)
    process.send_signal(sig)
    started = time.monotonic()
    code = process.wait(timeout=30)
    assert time.monotonic() - started < 10
    assert code == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL)
    partial = cut.joinpath("results.jsonl").read_text().count("\n")
    assert 4 <= partial < 24
    assert cli(*args, f"out_dir={cut}", cwd=tmp_path).returncode == 0
    resumed = records(cut)
    assert [r["id"] for r in resumed] == [r["id"] for r in records(whole)]
    assert [r["output"] for r in resumed] == [r["output"] for r in records(whole)]


def torchrun(processes: int, *overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={processes}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "dlmsearch",
        *overrides,
    ]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300, check=False)


@pytest.mark.slow
def test_torchrun_shards_and_merges_like_one_process(tmp_path: Path) -> None:
    args = ["+decoder=fast_dllm", "batch_size=2"]
    one = tmp_path / "one"
    assert cli(*args, "task.limit=10", f"out_dir={one}", cwd=tmp_path).returncode == 0
    ids = [r["id"] for r in records(one)]
    assert ids == sorted(ids, key=lambda i: int(i.rsplit(":", 1)[1]))  # the task's order, whatever the decoding order
    two = tmp_path / "two"
    done = torchrun(2, *args, "task.limit=6", f"out_dir={two}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["id"] for r in records(two)] == [r["id"] for r in records(one)][:6]
    assert not list(two.glob("results.rank*.jsonl"))
    # resume with another world size: the 4 remaining items, in one process
    assert cli(*args, "task.limit=10", f"out_dir={two}", cwd=tmp_path).returncode == 0
    merged, single = records(two), records(one)
    assert [(r["id"], r["output"], r["steps"]) for r in merged] == [(r["id"], r["output"], r["steps"]) for r in single]
    summary, reference = json.loads((two / "summary.json").read_text()), json.loads((one / "summary.json").read_text())
    assert (summary["items"], summary["accuracy"], summary["mean_steps"]) == (
        reference["items"],
        reference["accuracy"],
        reference["mean_steps"],
    )
