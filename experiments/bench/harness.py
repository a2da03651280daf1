"""Timing, memory, inputs and the result file of the engine benchmark, and the decoders it times."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.random_model import BLOCK_SIZES, DREAM_SIZES, MASK_ID, PROMPT_ID_LIMIT, SIZES
from dlmsearch.config import build, compose
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.driver import SearchDecoder


def make_plan(size: str, quick: bool) -> dict[str, dict[str, Any]]:
    """Settings of every section. ``quick`` is sized for ``--size tiny`` on 2 CPU cores, where
    the 126k-word head and softmax dominate (a few ms per generated position per step)."""
    if size in BLOCK_SIZES:  # block diffusion: sections 2 (lookahead), 3 (none / block / fused block cache) and 4
        quick_block = quick or size.endswith("tiny")
        return {
            "lookahead": dict(
                prompt=32 if quick_block else 64,
                gen=32 if quick_block else 128,
                block=SIZES[size]["block_size"],
                ks=[1, 4],
                calls=2,
            ),
            "cache": dict(
                prompt=64 if quick_block else 200,
                gen=32 if quick_block else 256,
                block=SIZES[size]["block_size"],
                batches=[1] if quick_block else [1, 8],
                modes=("none", "block", "block_fused"),
                presets=("sdar_greedy", "fixed_depth"),
            ),
            "overhead": dict(
                prompt=32, gen=32 if quick_block else 128, block=SIZES[size]["block_size"], batches=[1, 32]
            ),
        }
    caches = (
        "none",
        "prefix",
        "dual",
        "dllm_cache",
        "d2cache",
        "elastic",
        "dkv",
    )  # Fast-dLLM's and the adaptive KV caches
    if size in DREAM_SIZES:  # a Dream-shaped model: the caches alone (the reference loop of section 1 is LLaDA's)
        return {"cache": dict(prompt=200, gen=64 if quick else 256, block=32, batches=[1], modes=caches)}
    if quick:
        return {
            "reference": dict(prompt=32, gen=16, block=8, batches=[1, 8, 32]),
            "lookahead": dict(prompt=32, gen=32, block=16, ks=[1, 2, 4, 8], calls=2),
            "cache": dict(prompt=200, gen=64, block=32, batches=[1], modes=caches),
            "overhead": dict(prompt=32, gen=16, block=8, batches=[1, 32]),
        }
    big = size == "8b"  # one H200, the whole 8b run in ~2-3 minutes (scripts/gpu_check.sh)
    return {
        "reference": dict(prompt=64, gen=128 if big else 256, block=32, batches=[1, 8, 32]),
        "lookahead": dict(prompt=64, gen=256, block=32, ks=[1, 2, 4, 8], calls=5),
        "cache": dict(prompt=200, gen=256, block=32, batches=[1] if big else [1, 8], modes=caches),
        "overhead": dict(prompt=64, gen=128, block=32, batches=[1, 64]),
    }


class Bench:
    """Timing, memory and the result file."""

    def __init__(self, args: argparse.Namespace, device: str, dtype: torch.dtype, out: Path) -> None:
        self.args, self.device, self.dtype, self.out = args, device, dtype, out
        self.cuda = device.startswith("cuda")
        self.started = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self.doc: dict[str, Any] = {}
        self.generator = torch.Generator().manual_seed(args.seed)

    # --- time ---
    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def over_budget(self) -> bool:
        return bool(self.args.budget_s) and self.elapsed() > self.args.budget_s

    def measure(self, fn: Callable[[], Any]) -> tuple[list[float], Any, float]:
        """Warm up once, then time ``--repeats`` calls (synchronised): (walls, last output, peak MiB)."""
        return self.measure_many({"only": fn})["only"]

    def measure_many(self, fns: dict[str, Callable[[], Any]]) -> dict[str, tuple[list[float], Any, float]]:
        """Settings that are compared with each other, timed interleaved (A B C, A B C, ...) after
        one warm-up each, so that a slow spell of a shared machine hits them alike. Per setting:
        (walls, last output, peak MiB over its timed calls)."""
        for fn in fns.values():
            fn()
            self.sync()
        walls: dict[str, list[float]] = {key: [] for key in fns}
        peaks: dict[str, float] = {key: 0.0 for key in fns}
        outputs: dict[str, Any] = {}
        for _ in range(self.args.repeats):
            for key, fn in fns.items():
                self.sync()
                self.reset_peak()
                start = time.perf_counter()
                outputs[key] = fn()
                self.sync()
                walls[key].append(time.perf_counter() - start)
                peaks[key] = max(peaks[key], round(self.peak_mib(), 1))
        return {key: (walls[key], outputs[key], peaks[key]) for key in fns}

    # --- memory ---
    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        try:  # Linux: "5" resets the peak resident set size (VmHWM) of this process
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            self.rss_resettable = True
        except OSError:
            self.rss_resettable = False

    def peak_mib(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        try:
            with open("/proc/self/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:") and getattr(self, "rss_resettable", False):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux; since start

    # --- inputs ---
    def prompts(self, count: int, length: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.args.seed * 1000 + length)
        return [torch.randint(0, PROMPT_ID_LIMIT, (length,), generator=generator) for _ in range(count)]

    # --- results ---
    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        self.rows.append(row)
        self.save()
        return row

    def skip(self, section: str, label: str, reason: str, **settings: Any) -> None:
        print(f"  [{section}] {label}: skipped ({reason})", flush=True)
        self.add({"section": section, "label": label, "skipped": reason, **settings})

    def save(self) -> None:
        self.doc["rows"] = self.rows
        self.doc["elapsed_s"] = round(self.elapsed(), 2)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=2) + "\n")
        tmp.replace(self.out)


class Interrupted(Exception):
    """SIGTERM (a timeout) arrived: stop measuring, report what there is."""


def make_decoder(preset: str, gen_length: int, *overrides: str) -> SearchDecoder:
    """A preset composed for left-to-right text (the papers' decoding settings at this generation length)."""
    cfg = compose([f"+decoder={preset}", "decoding=text", f"task.gen_length={gen_length}", *overrides])
    return build(cfg, "decoder")


def requests_for(prompts: list[torch.Tensor], gen_length: int) -> list[DecodeRequest]:
    return [
        DecodeRequest(uid=i, prompt=p, generation=torch.full((gen_length,), MASK_ID)) for i, p in enumerate(prompts)
    ]


def decode_stats(results: list[DecodeResult]) -> dict[str, float]:
    n = len(results)
    return {
        "steps_mean": round(sum(r.steps for r in results) / n, 2),
        "row_forwards_mean": round(sum(r.row_forwards for r in results) / n, 2),
        "token_forwards_mean": round(sum(r.token_forwards for r in results) / n, 1),
        "tokens_per_step": round(sum(r.tokens_committed for r in results) / max(1, sum(r.steps for r in results)), 2),
    }


def summary(walls: list[float]) -> dict[str, Any]:
    return {"wall_s": round(statistics.median(walls), 4), "walls_s": [round(w, 4) for w in walls]}
