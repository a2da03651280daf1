"""The benchmark's report: tables, the targets and the machine it ran on."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from bench.harness import Bench

ROOT = Path(__file__).resolve().parents[2]


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    lines = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        if "skipped" in row:
            lines.append(
                "| "
                + " | ".join([row.get("label", ""), f"skipped: {row['skipped']}"] + [""] * (len(columns) - 2))
                + " |"
            )
            continue
        lines.append("| " + " | ".join(fmt(row.get(key)) for key, _ in columns) + " |")
    return "\n".join(lines)


def report(bench: Bench) -> str:
    rows = bench.rows
    by = lambda prefix: [r for r in rows if r["section"].startswith(prefix)]
    parts = []
    sections = [
        (
            "1",
            "1. Reference loop vs dlmsearch fast_dllm (tau 0.9)",
            [
                ("label", "loop"),
                ("batch", "batch"),
                ("prompt", "prompt"),
                ("gen", "gen"),
                ("block", "block"),
                ("wall_s", "wall s"),
                ("tokens_per_s", "tokens/s"),
                ("steps_mean", "steps"),
                ("tokens_per_step", "tok/step"),
                ("tokens_equal_reference", "= ref"),
                ("peak_mib", "peak MiB"),
            ],
        ),
        (
            "2",
            "2. One engine call: plain round (1 row) vs lookahead round (1 + K rows)",
            [
                ("cache", "cache"),
                ("k", "K"),
                ("rows", "rows"),
                ("call_s", "s/call"),
                ("ratio_vs_plain", "x plain"),
                ("token_forwards_per_call", "token-fwd/call"),
                ("peak_mib", "peak MiB"),
            ],
        ),
        (
            "3",
            "3. KV cache, fast_dllm tau 0.9",
            [
                ("label", "cache"),
                ("batch", "batch"),
                ("prompt", "prompt"),
                ("gen", "gen"),
                ("block", "block"),
                ("wall_s", "wall s"),
                ("tokens_per_s", "tokens/s"),
                ("steps_mean", "steps"),
                ("token_forwards_mean", "token-fwd"),
                ("ratio_vs_none", "x none"),
                ("tokens_equal_none", "= none"),
                ("peak_mib", "peak MiB"),
            ],
        ),
        (
            "4",
            "4. Host overhead, fast_dllm (no cache)",
            [
                ("batch", "batch"),
                ("gen", "gen"),
                ("wall_s", "wall s"),
                ("model_s", "model s"),
                ("forwards", "forwards"),
                ("overhead_fraction", "overhead"),
                ("summary_fraction", "summaries"),
                ("host_fraction", "host"),
                ("host_ms_per_step", "host ms/fwd"),
                ("peak_mib", "peak MiB"),
            ],
        ),
    ]
    for prefix, title, columns in sections:
        chosen = by(prefix)
        if chosen:
            parts.append(f"### {title}\n\n{table(chosen, columns)}")
    memory = [r for r in rows if "peak_mib" in r]
    if memory:
        kind = "CUDA max allocated" if bench.cuda else "CPU peak RSS"
        parts.append(
            f"### 5. Peak memory ({kind}, MiB)\n\n"
            + table(
                [
                    {
                        "what": f"{r['section'][2:]}: {r['label']}"
                        + (f" b={r['batch']}" if "batch" in r else "")
                        + (f" cache={r['cache']}" if "cache" in r and "cache=" not in r["label"] else ""),
                        "peak_mib": r["peak_mib"],
                    }
                    for r in memory
                ],
                [("what", "setting"), ("peak_mib", "peak MiB")],
            )
        )
    targets = bench.doc.get("targets", {})
    if targets:
        lines = ["| target | value | goal | met |", "|---|---:|---|---|"]
        for key, item in targets.items():
            lines.append(f"| {key} | {fmt(item['value'])} | {item['goal']} | {fmt(item['met'])} |")
        parts.append("### Targets (set for a GPU)\n\n" + "\n".join(lines))
    return "\n\n".join(parts)


def targets(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    live = [r for r in rows if "skipped" not in r]
    ref = next((r for r in live if r["section"].startswith("1") and r["loop"] == "reference"), None)
    ours = next(
        (r for r in live if r["section"].startswith("1") and r["label"] == "dlmsearch fast_dllm" and r["batch"] == 1),
        None,
    )
    if ref and ours:
        value = ours["tokens_per_s"] / ref["tokens_per_s"]
        out["dlmsearch / reference tokens/s, batch 1"] = {
            "value": round(value, 3),
            "goal": ">= 1.0",
            "met": value >= 1.0,
        }
    k4 = next((r for r in live if r["section"].startswith("2") and r["k"] == 4 and r["cache"] == "none"), None)
    if k4:
        out["lookahead round K=4 / plain round (no cache)"] = {
            "value": k4["ratio_vs_plain"],
            "goal": "<= 1.15",
            "met": k4["ratio_vs_plain"] <= 1.15,
        }
    dual = [r for r in live if r["section"].startswith("3") and r["cache"] == "dual"]
    if dual:
        first = dual[0]
        out[f"dual / none tokens/s, batch {first['batch']}"] = {
            "value": first["ratio_vs_none"],
            "goal": ">= 3",
            "met": (first["ratio_vs_none"] or 0) >= 3,
        }
    over = [r for r in live if r["section"].startswith("4")]
    if over:
        big = max(over, key=lambda r: r["batch"])
        out[f"host overhead, batch {big['batch']}"] = {
            "value": big["overhead_fraction"],
            "goal": "<= 0.05",
            "met": big["overhead_fraction"] <= 0.05,
        }
    return out


def machine_info(device: str, dtype: torch.dtype) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],  # a busy shared machine makes CPU timings noisy
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(
            device_name=torch.cuda.get_device_name(0),
            cuda=torch.version.cuda,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
        )
    else:
        name = platform.processor()
        try:
            name = next(
                l.split(":", 1)[1].strip()
                for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")
            )
        except (OSError, StopIteration):
            pass
        info["device_name"] = name
    try:
        info["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info
