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
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = ["pytest -m gpu", "bench_engine tiny (dry run)", "bench_engine tiny, engine.compile (dry run)"]
    assert summary["status"] == 0 and summary["dry_run"] and [s["step"] for s in summary["steps"]] == steps
    bench = json.loads((out / "bench_tiny.json").read_text())
    assert {row["section"] for row in bench["rows"]} == {"2_lookahead_round", "4_host_overhead"}
    compiled = json.loads((out / "bench_tiny_compile.json").read_text())
    assert {row["section"] for row in compiled["rows"]} == {"4_host_overhead"} and compiled["args"]["compile"]
    assert "gpu_check finished" in (out / "gpu_check.txt").read_text()
