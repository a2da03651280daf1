"""The GPU check's own script, run as a dry run on CPU with the tiny model, so that it cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_writes_its_tables_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "gpu check"  # a directory name with a space
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    # No wall-clock limit here, and the dry run sets none on its steps (their limits are for a GPU
    # node): a busy machine is slow, not wrong. Options in any order: --dry-run before OUT_DIR.
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = [
        "pytest -m gpu",
        "memory per rank (python -m dlmsearch.estimate)",
        "tensor parallel TP=1",
        "bench_engine tiny (dry run)",
        "bench_engine tiny, engine.compile (dry run)",
    ]
    assert summary["status"] == 0 and summary["dry_run"] and [s["step"] for s in summary["steps"]] == steps
    assert all(s["limit_s"] is None for s in summary["steps"])
    bench = json.loads((out / "bench_tiny.json").read_text())
    assert {row["section"] for row in bench["rows"]} == {"2_lookahead_round", "4_host_overhead"}
    compiled = json.loads((out / "bench_tiny_compile.json").read_text())
    assert {row["section"] for row in compiled["rows"]} == {"4_host_overhead"} and compiled["args"]["compile"]
    log = (out / "gpu_check.txt").read_text()
    assert "gpu_check finished" in log and "| 8 | 26.14 |" in log  # LLaDA2-flash at N = 8: 26.14 GiB per rank
    assert len((out / "tp1" / "results.jsonl").read_text().splitlines()) == 2


def test_gpu_check_refuses_unknown_options_and_a_second_out_dir(tmp_path: Path) -> None:
    script = str(ROOT / "scripts" / "gpu_check.sh")
    for args in (["--no-such-option", str(tmp_path / "a")], [str(tmp_path / "a"), str(tmp_path / "b")], []):
        done = subprocess.run(["bash", script, *args], cwd=tmp_path, capture_output=True, text=True, check=False)
        assert done.returncode == 2 and "usage: scripts/gpu_check.sh" in done.stderr, (args, done.stderr)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
