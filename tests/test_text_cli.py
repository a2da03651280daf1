"""The CLI end to end on tiny LLaDA and Dream checkpoints: GSM8K items decoded to text, answers
extracted and judged, traces with token strings; and the mistakes a user makes with text
models, each stopped with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoints import requires_upstream

from dlmsearch.config import compose
from dlmsearch.run import run

pytestmark = requires_upstream

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["task.gen_length=32", "task.block_length=16", "model.device=cpu"]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_gsm8k_through_the_cli_api(checkpoints, family: str, tmp_path: Path) -> None:
    spec = checkpoints[family]
    cfg = compose(
        [
            "+decoder=adalook",
            f"model={family}",
            f"model.path={spec.directory}",
            "task=gsm8k",
            "task.limit=2",
            *SMALL,
            f"out_dir={tmp_path}",
            "trace=true",
        ]
    )
    summary = run(cfg)
    assert summary["items"] == 2 and summary["task"] == "gsm8k" and summary["accuracy"] is not None
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    for record in records:
        assert {"id", "output", "answer", "reference", "correct", "steps", "row_forwards"} <= set(record)
        assert isinstance(record["output"], str) and isinstance(record["correct"], bool)
        assert record["tokens_committed"] == 32
    trace = json.loads((tmp_path / "trace.jsonl").read_text().splitlines()[0])
    event = trace["events"][0]
    assert len(event["strings"]) == len(event["tokens"]) and all(isinstance(s, str) for s in event["strings"])


@pytest.mark.parametrize("family,preset", [("llada", "llada"), ("dream", "dream")])
@pytest.mark.slow
def test_cli_subprocess_writes_answers(checkpoints, family: str, preset: str, tmp_path: Path) -> None:
    spec = checkpoints[family]
    command = [
        sys.executable,
        "-m",
        "dlmsearch",
        f"+decoder={preset}",
        f"model={family}",
        f"model.path={spec.directory}",
        "task=gsm8k",
        "task.limit=2",
        *SMALL,
        f"out_dir={tmp_path}",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{preset} on gsm8k: 2 items, solved/correct" in done.stdout
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2


def cli_error(*overrides: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dlmsearch", *overrides],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr[-2000:]
    return lines[0]


def test_text_mistakes_stop_with_one_line(checkpoints, tmp_path: Path) -> None:
    llada = checkpoints["llada"].directory
    base = ["+decoder=fast_dllm", "model=llada", f"out_dir={tmp_path / 'out'}", *SMALL]
    assert "model.path is required" in cli_error(*base, "task=gsm8k", cwd=tmp_path)
    # the task (its tokenizer) is built before the model loads: an empty directory is named by it first
    assert "has no tokenizer files" in cli_error(*base, f"model.path={tmp_path}", "task=gsm8k", cwd=tmp_path)
    assert "holds a llada checkpoint; use model=llada" in cli_error(
        "+decoder=fast_dllm",
        "model=dream",
        f"model.path={llada}",
        "task=gsm8k",
        *SMALL,
        f"out_dir={tmp_path / 'o2'}",
        cwd=tmp_path,
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"prompt": "no question field"}\n')
    assert f"{bad}:2" in cli_error(*base, f"model.path={llada}", "task=gsm8k", f"task.path={bad}", cwd=tmp_path)
    assert "longer than the model's maximum length of 512" in cli_error(
        *base, f"model.path={llada}", "task=prompts", "task.prompt='" + "word " * 600 + "'", cwd=tmp_path
    )
