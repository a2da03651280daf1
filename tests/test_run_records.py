"""What a run writes and when: a record per sample as it finishes (continuous batching, a bar that
counts samples), records that do not depend on the batch size, per-sample latency, a summary that
names the run, and resume only into a run of the same config (``run.json``)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlmsearch.config import compose
from dlmsearch.run import run
from dlmsearch.run_records import percentile
from dlmsearch.search.session import DecodeSession

TESTS = Path(__file__).resolve().parent
RUN_FILE = "run.json"  # dlmsearch.run_records.RUN_FILE, spelt out so that each test fails on its own on code without it
TIMING_FIELDS = ("wall_seconds", "latency_seconds")
ENV = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def untimed(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records(out)]


def decode(out: Path, *overrides: str, **kwargs) -> dict:
    return run(compose([*overrides, f"out_dir={out}", "examples=0"]), **kwargs)


def cli(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dlmsearch", *overrides],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=300,
        check=False,
    )


# A schedule, a lookahead, a population with the task's verifier (keyed by uid), a revising rule.
@pytest.mark.parametrize("preset", ["llada", "adalook", "verified_best_of_n", "remdm"])
def test_records_do_not_depend_on_the_batch_size(preset: str, tmp_path: Path) -> None:
    """With 3 places, samples join a running decode as others finish; with 64, all start together."""
    narrow = decode(tmp_path / "narrow", f"+decoder={preset}", "task.tier=hard", "task.limit=8", "batch_size=3")
    wide = decode(tmp_path / "wide", f"+decoder={preset}", "task.tier=hard", "task.limit=8", "batch_size=64")
    assert untimed(tmp_path / "narrow") == untimed(tmp_path / "wide")
    assert len(records(tmp_path / "wide")) == 8 and narrow["accuracy"] == wide["accuracy"]


def test_each_record_is_written_when_its_sample_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records appear between steps of one decode, the bar moves one sample at a time, and freed
    places take new items while others decode on."""
    results = tmp_path / "results.jsonl"
    seen, admitted_beside, updates = [], [], []
    import dlmsearch.search.session as session_module

    step, admit = session_module.step, DecodeSession.admit

    def counting_step(*args, **kwargs):
        seen.append(results.read_text().count("\n") if results.exists() else 0)
        return step(*args, **kwargs)

    def noting_admit(self, requests):
        admitted_beside.append(len(self.uids))
        return admit(self, requests)

    import dlmsearch.run as run_module

    class Bar(run_module.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(session_module, "step", counting_step)
    monkeypatch.setattr(DecodeSession, "admit", noting_admit)
    monkeypatch.setattr(run_module, "tqdm", Bar)
    decode(tmp_path, "+decoder=fast_dllm", "task.limit=8", "batch_size=4")
    assert any(0 < lines < 8 for lines in seen), "no record was written while the decode was still running"
    assert updates == [1] * 8
    assert any(n > 0 for n in admitted_beside), "no item joined a decode that was running"


def test_latency_is_per_sample_from_admission_to_finish(tmp_path: Path) -> None:
    summary = decode(tmp_path, "+decoder=fast_dllm", "task.limit=6", "batch_size=6")
    rows = records(tmp_path)
    latencies = [r["latency_seconds"] for r in rows]
    assert summary["latency_p50_s"] == round(percentile(latencies, 50), 4) and summary["latency_p99_s"] == round(
        max(latencies), 4
    )
    # admitted together: a sample with more steps finishes no earlier than one with fewer
    by_steps = sorted(rows, key=lambda r: r["steps"])
    assert all(
        a["latency_seconds"] <= b["latency_seconds"] for a, b in itertools.pairwise(by_steps) if a["steps"] < b["steps"]
    )
    assert len({r["steps"] for r in rows}) > 1
    # the wall time is the decode's, split among the samples: each share is at most its latency
    assert all(0 < r["wall_seconds"] <= r["latency_seconds"] for r in rows)
    assert summary["wall_seconds"] == round(sum(r["wall_seconds"] for r in rows), 2)


def test_the_summary_names_overrides_cache_and_population(tmp_path: Path) -> None:
    overrides = ["+decoder=best_of_n", "task.limit=2"]
    summary = run(compose([*overrides, f"out_dir={tmp_path}", "examples=0"]), overrides=overrides)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["overrides"] == overrides and saved["cache"] == "none"
    assert saved["population"]["size"] == 4 and summary["population"] == saved["population"]
    plain = decode(tmp_path / "plain", "+decoder=fast_dllm", "task.limit=1")
    assert plain["population"] == "none" and plain["overrides"] == []


def test_a_rerun_with_another_config_is_refused_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = ["+decoder=llada", "task.limit=3", f"out_dir={out}"]
    done = cli(*first, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    before = (out / "results.jsonl").read_text()
    refused = cli("+decoder=adalook", "task.limit=3", f"out_dir={out}", cwd=tmp_path)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert (
        "decoder.name: llada -> adalook" in lines[0] and "another out_dir" in lines[0] and f"delete {out}" in lines[0]
    )
    assert (out / "results.jsonl").read_text() == before
    summary = json.loads((out / "summary.json").read_text())
    assert summary["decoder"] == "llada" and summary["overrides"] == first  # the CLI's own overrides


def test_same_config_resumes_with_another_batch_size_and_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    decode(tmp_path, "+decoder=fast_dllm", "task.limit=3", "batch_size=1")
    first = records(tmp_path)
    capsys.readouterr()
    summary = decode(tmp_path, "+decoder=fast_dllm", "task.limit=5", "batch_size=8", "engine.row_budget=64")
    assert f"resuming: 3 of 5 items already done in {tmp_path}" in capsys.readouterr().err
    assert summary["items"] == 5 and records(tmp_path)[:3] == first  # kept, not decoded again
    with pytest.raises(ValueError, match=r"seed: 0 -> 1"):
        decode(tmp_path, "+decoder=fast_dllm", "task.limit=5", "seed=1")


def test_records_without_run_json_are_checked_against_their_summary(tmp_path: Path) -> None:
    """A directory from before run.json: its summary's config decides; with no summary it cannot be checked."""
    decode(tmp_path, "+decoder=fast_dllm", "task.limit=2")
    (tmp_path / RUN_FILE).unlink()
    decode(tmp_path, "+decoder=fast_dllm", "task.limit=3")  # the summary's config is this one
    (tmp_path / RUN_FILE).unlink()
    with pytest.raises(ValueError, match=r"decoder.name: fast_dllm -> llada"):
        decode(tmp_path, "+decoder=llada", "task.limit=3")
    (tmp_path / "summary.json").unlink()
    with pytest.raises(ValueError, match=r"holds 3 records but no run.json or summary.json"):
        decode(tmp_path, "+decoder=fast_dllm", "task.limit=3")


def test_a_directory_without_records_takes_any_config(tmp_path: Path) -> None:
    """A run that failed before its first record leaves nothing to protect."""
    decode(tmp_path, "+decoder=fast_dllm", "task.limit=1")
    (tmp_path / "results.jsonl").write_text("")
    decode(tmp_path, "+decoder=llada", "task.limit=1")
    assert json.loads((tmp_path / RUN_FILE).read_text())["config"]["decoder"]["name"] == "llada"


def test_traces_do_not_depend_on_the_batch_size(tmp_path: Path) -> None:
    """A sample's lookahead log names its own levels, not the deeper ones others in the decode roll on to."""
    for batch_size in (1, 3):
        decode(
            tmp_path / str(batch_size),
            "+decoder=adalook",
            "task.tier=hard",
            "task.limit=6",
            f"batch_size={batch_size}",
            "trace=true",
        )
    alone, together = ((tmp_path / b / "trace.jsonl").read_text().splitlines() for b in ("1", "3"))
    assert [json.loads(line)["id"] for line in together] == [
        r["id"] for r in records(tmp_path / "3")
    ]  # the task's order
    assert alone == together
