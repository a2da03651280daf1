"""Benchmark of the rollout engine on a random-weight LLaDA-shaped model, all sections in one run.

Nothing is downloaded: the model is the native :class:`BidirectionalTransformer` with LLaDA's
vocabulary (126464), mask id (126336), RoPE theta 5e5 and untied head, built on the meta device and
materialised directly on the target device (an 8B model is allocated once, on the GPU, in bf16),
with N(0, 0.02) weights adjusted so that decoding behaves like a trained model's (see
:func:`initialise`). Sections, each a table and rows of the JSON:

1. reference loop vs dlmsearch ``fast_dllm`` (tau 0.9): Fast-dLLM's ``generate(threshold=0.9)``
   from ``../shared/upstream/fast-dllm`` at batch 1 on the same weights (our module behind a
   ``.logits`` shim), dlmsearch at several batch sizes; tokens/s and the ratio at batch 1;
2. one ``engine.evaluate`` call of 1 root row vs 1 + K rows (a lookahead round's rows), K = 1, 2,
   4, 8, without a cache and against a warm dual cache;
3. engine cache none / prefix / dual and the adaptive KV caches (dllm_cache, d2cache, elastic,
   dkv, with the authors' settings for the family: ``--size dream_*`` is Dream-shaped) at prompt
   200, generation 256, block 32 (``fast_dllm``; ``--quick``: generation 64);
4. host overhead: wall time vs time inside the model forward (and inside the engine's per-forward
   summary: softmax, argmax, NaN check, device-to-host copies) at batch 1 and a large batch;
5. peak memory of every setting (CUDA max allocated; CPU peak RSS).

    python experiments/bench_engine.py --size tiny --device cpu --quick     # 2-3 min on 2 CPU cores
    python experiments/bench_engine.py --size 8b --device cuda              # one H200: ~2-3 min
    python experiments/bench_engine.py --size 8b --dry-run                  # build on meta, print sizes

Results go to ``--out`` (default ``runs/bench_engine/<size>.json``), rewritten after every row so
an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from bench.harness import Bench, Interrupted, make_plan
from bench.random_model import (
    DREAM_SIZES,
    INIT_STD,
    LOGIT_STD,
    MASK_ID,
    QK_COMPONENT_STD,
    SIZES,
    VOCAB,
    build_model,
    confidence_profile,
)
from bench.report import ROOT, machine_info, report, targets
from bench.sections import section_cache, section_lookahead, section_overhead, section_reference
from outputs import add_flag, check

from dlmsearch.models.adapter import ModelAdapter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument(
        "--device", default="auto", help="auto | cpu | cuda (auto: cuda if available); bf16 on cuda, fp32 on cpu"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default runs/bench_engine/<size>.json)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per setting after one warm-up (median reported)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="short generations and small batches (tiny on 2 CPU cores: 2-3 min)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="every engine with engine.compile=true (the model's per-token work compiled, bucketed)",
    )
    parser.add_argument("--row-budget", type=int, default=64, help="engine rows per forward chunk")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (ignored on cuda)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="skip remaining settings once this many seconds have passed (0: no limit)",
    )
    parser.add_argument("--sections", default="1,2,3,4", help="which sections to run (5, memory, comes with every row)")
    parser.add_argument(
        "--dry-run", action="store_true", help="build the model on the meta device, print its size and the plan, exit"
    )
    add_flag(parser, "JSON (an --out under experiments/results/)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    check(parser, args, args.out)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available() and not args.dry_run:
        print("--device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if not device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    plan = make_plan(args.size, args.quick)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}

    meta = build_model(args.size, "meta", dtype)
    params = sum(p.numel() for p in meta.parameters())
    print(
        f"bench_engine: size {args.size} ({params / 1e9:.3f} B parameters, {params * torch.finfo(dtype).bits / 8 / 2**30:.2f} GiB in "
        f"{str(dtype).replace('torch.', '')}), device {device}, repeats {args.repeats}{', quick' if args.quick else ''}",
        flush=True,
    )
    if args.dry_run:
        print(
            json.dumps(
                {
                    "config": {
                        k: getattr(meta.config, k)
                        for k in (
                            "vocab_size",
                            "hidden_size",
                            "num_layers",
                            "num_heads",
                            "intermediate_size",
                            "max_length",
                            "rope_theta",
                        )
                    },
                    "parameters": params,
                    "plan": plan,
                },
                indent=2,
            )
        )
        return 0
    del meta

    out = args.out or ROOT / "runs" / "bench_engine" / f"{args.size}.json"
    bench = Bench(args, device, dtype, out)
    bench.doc.update(
        machine=machine_info(device, dtype),
        args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        plan=plan,
        model={
            "size": args.size,
            "parameters": params,
            **SIZES[args.size],
            "vocab_size": VOCAB,
            "mask_id": MASK_ID,
            "init": {"std": INIT_STD, "qk_component_std": QK_COMPONENT_STD, "logit_std": LOGIT_STD},
        },
    )
    start = time.perf_counter()
    module = build_model(args.size, device, dtype, seed=args.seed)
    bench.sync()
    bench.doc["model"]["build_s"] = round(time.perf_counter() - start, 2)
    bench.doc["model"]["confidences"] = confidence_profile(module, device)
    print(
        f"model built in {bench.doc['model']['build_s']} s; masked-position confidences: {bench.doc['model']['confidences']}",
        flush=True,
    )
    adapter = ModelAdapter(
        module=module,
        mask_id=MASK_ID,
        vocab_size=VOCAB,
        device=device,
        dtype=str(dtype).replace("torch.", ""),
        max_length=4096,
        attention_block=module.config.block_size,
        shift_logits=args.size in DREAM_SIZES,
    )
    bench.save()

    steps = [
        (
            "1",
            "reference",
            "1. reference loop vs dlmsearch fast_dllm",
            lambda: section_reference(bench, module, adapter, plan["reference"]),
        ),
        (
            "2",
            "lookahead",
            "2. plain round vs lookahead round",
            lambda: section_lookahead(bench, adapter, plan["lookahead"]),
        ),
        (
            "3",
            "cache",
            f"3. cache {' / '.join(plan['cache'].get('modes', ('none', 'prefix', 'dual')))}",
            lambda: section_cache(bench, adapter, plan["cache"]),
        ),
        ("4", "overhead", "4. host overhead", lambda: section_overhead(bench, adapter, plan["overhead"])),
    ]
    steps = [
        (key, title, run) for key, part, title, run in steps if part in plan
    ]  # a block-diffusion size has no LLaDA reference loop (section 1)

    def interrupted(signum: int, _frame: Any) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)  # `timeout` sends SIGTERM: still print what was measured
    try:
        for key, title, run in steps:
            if key in sections:
                print(f"[{bench.elapsed():6.1f} s] {title}", flush=True)
                run()
    except (Interrupted, KeyboardInterrupt) as stop:
        bench.doc["interrupted"] = f"{type(stop).__name__}: {stop} after {bench.elapsed():.1f} s"
        print(f"\ninterrupted ({stop}); reporting what was measured", flush=True)
    bench.doc["targets"] = targets(bench.rows)
    bench.doc["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    bench.save()
    print()
    print(report(bench))
    print(f"\nwrote {out} ({bench.elapsed():.1f} s in all)")
    return 124 if "interrupted" in bench.doc else 0


if __name__ == "__main__":
    sys.exit(main())
