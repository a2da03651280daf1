"""Operators per forward, eager against ``engine.compile``: what a GPU would launch as kernels.

On a GPU a small-window forward is launch-bound: its cost is the number of kernels, not their
work. This counts, with the torch profiler on CPU, the operators one engine call runs for the
benchmark's random LLaDA-shaped model (a warm dual-cache call of one row's 32-token block, and a
full forward of a 96-token canvas): every ATen operator that does work (views, reshapes and
other metadata-only operators are not counted), and for the compiled run every fused kernel.

    python experiments/forward_ops.py --size tiny      # ~1 min on 2 cores (the compile included), into runs/forward_ops/
    python experiments/forward_ops.py --size tiny --write-committed   # experiments/results/bench/forward_ops_tiny.{md,json}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from bench.random_model import MASK_ID, VOCAB, build_model
from outputs import RUNS, add_flag, resolve
from torch.profiler import ProfilerActivity, profile

from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.engine.call_records import CallRows, CallSettings
from dlmsearch.search.engine.rollout import RolloutEngine

ROOT = Path(__file__).resolve().parents[1]
METADATA = {
    "aten::view",
    "aten::reshape",
    "aten::transpose",
    "aten::expand",
    "aten::slice",
    "aten::select",
    "aten::as_strided",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::t",
    "aten::permute",
    "aten::alias",
    "aten::_unsafe_view",
    "aten::detach",
    "aten::empty",
    "aten::empty_strided",
    "aten::resize_",
    "aten::lift_fresh",
    "aten::contiguous",
    "aten::result_type",
    "aten::_reshape_alias",
    "aten::unbind",
    "aten::split",
    "aten::chunk",
    "aten::narrow",
    "aten::is_nonzero",
    "aten::item",
    "aten::_local_scalar_dense",
}


def counted(run) -> dict[str, int]:
    """Top-level work operators and fused kernels of one call of ``run``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = prof.events()
    ops = [
        e
        for e in events
        if e.name.startswith("aten::")
        and e.name not in METADATA
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    ]
    fused = [e for e in events if "fused" in e.name or e.name.startswith("cpp_") or e.name.startswith("triton_")]
    return {"operators": len(ops), "fused_kernels": len(fused)}


def measure(size: str, compile_: bool) -> dict[str, dict[str, int]]:
    torch.manual_seed(0)
    module = build_model(size, "cpu", torch.float32, seed=0)
    adapter = ModelAdapter(module=module, mask_id=MASK_ID, vocab_size=VOCAB, max_length=4096)
    prompt, gen, block = 64, 32, 32
    tokens = torch.cat([torch.randint(0, 1000, (1, prompt)), torch.full((1, gen), MASK_ID)], dim=1)
    attention = torch.ones_like(tokens, dtype=torch.bool)
    zeros = torch.zeros(1, dtype=torch.long)
    window = (torch.tensor([prompt]), torch.tensor([prompt + block]))
    out = {}
    for cache in ("none", "dual"):
        engine = RolloutEngine(adapter=adapter, cache=cache, compile=compile_)
        memory, sampling = engine.memory(1), engine.sampling_over(Sampling())
        rows = CallRows(tokens, attention, zeros, zeros, zeros, zeros, window)
        call = lambda: engine.evaluate(rows, CallSettings(memory, sampling, frozenset(), prompt))
        for _ in range(3):  # the first call refreshes the cache (dual); later ones hit it; compiles warm up
            call()
        out["dual-cache call (32-token window)" if cache == "dual" else "full forward (96 tokens)"] = counted(call)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write forward_ops_<size>.{md,json} (default runs/forward_ops/)"
    )
    add_flag(parser, "table in experiments/results/bench/")
    args = parser.parse_args(argv)
    results = resolve(parser, args, args.out, ROOT / "experiments" / "results" / "bench", RUNS / "forward_ops")
    args.out = results
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = args.out
    torch._inductor.config.cpp.enable_kernel_profile = True  # the fused C++ kernels show in the profile
    torch.set_num_threads(2)
    found = {"eager": measure(args.size, False), "engine.compile": measure(args.size, True)}
    layers = build_model(args.size, "meta", torch.float32).config.num_layers
    lines = [
        f"| call ({args.size}, {layers} layers) | eager operators | compiled: operators + fused kernels |",
        "|---|---:|---:|",
    ]
    for what in found["eager"]:
        e, c = found["eager"][what], found["engine.compile"][what]
        lines.append(f"| {what} | {e['operators']} | {c['operators']} + {c['fused_kernels']} |")
    table = "\n".join(lines)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"forward_ops_{args.size}.md").write_text(
        f"{table}\n\nMeasured by `python experiments/forward_ops.py --size {args.size}`.\n"
    )
    (results / f"forward_ops_{args.size}.json").write_text(json.dumps(found, indent=1) + "\n")
    print(table)
    print(f"wrote {results}/forward_ops_{args.size}.{{md,json}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
