"""The engine benchmark side by side with an earlier engine, in one run on this machine.

The earlier commit is exported (``git archive``) to a temporary directory and its own
``experiments/bench_engine.py`` runs from there, importing its own ``dlmsearch``; then this
checkout's, without and with ``--compile``. The runs alternate ``--rounds`` times (so drift on a
shared machine hits all of them alike) and the table reports each metric's median over rounds:

* fast_dllm tokens/s at batch 1 and 32, and their ratio (batched vs one at a time);
* one engine call of 1 + K = 4 rows / a plain call of 1 row, without a cache and with the dual cache;
* dual-cache / no-cache tokens/s;
* host overhead (the share of wall time outside the model forward) at batch 1 and 32;
* the uniform-noise (DiffusionGemma) path: ``+decoder=diffusion_gemma`` on the shipped
  ``model=countdown_uniform`` through each tree's own CLI, tokens/s at batch 1 and 32 (eager runs only).

    python experiments/bench_before_after.py --before fe8c0e7 --size tiny --rounds 2
    python experiments/bench_before_after.py --before fe8c0e7 --size tiny --rounds 3 --repeats 3 --write-committed

Writes ``before_after_<size>.{json,md}`` into ``--out`` (default ``runs/bench_before_after/``; with
``--write-committed``, the committed ``experiments/results/bench/``) and keeps every run's own JSON
under ``runs/bench_before_after/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from outputs import ROOT, RUNS, add_flag, resolve

UPSTREAM = ROOT.parent / "shared" / "upstream" / "fast-dllm"


def metrics(doc: dict[str, Any]) -> dict[str, float | None]:
    """The compared numbers of one benchmark run (None where the run has no such row)."""
    rows = [r for r in doc.get("rows", []) if "skipped" not in r]

    def pick(section: str, **match: Any) -> dict[str, Any] | None:
        return next(
            (r for r in rows if r["section"].startswith(section) and all(r.get(k) == v for k, v in match.items())), None
        )

    def value(row: dict[str, Any] | None, key: str) -> float | None:
        return None if row is None or row.get(key) is None else float(row[key])

    one, many = pick("1", loop="dlmsearch", batch=1), pick("1", loop="dlmsearch", batch=32)
    speed_one, speed_many = value(one, "tokens_per_s"), value(many, "tokens_per_s")
    return {
        "fast_dllm tokens/s, batch 1": speed_one,
        "fast_dllm tokens/s, batch 32": speed_many,
        "batched / one at a time (tokens/s, 32 vs 1)": None
        if not (speed_one and speed_many)
        else round(speed_many / speed_one, 2),
        "K=4 call / plain call, no cache": value(pick("2", cache="none", k=4), "ratio_vs_plain"),
        "K=4 call / plain call, dual cache": value(pick("2", cache="dual", k=4), "ratio_vs_plain"),
        "dual / none tokens/s": value(pick("3", cache="dual"), "ratio_vs_none"),
        "host overhead, batch 1": value(pick("4", batch=1), "overhead_fraction"),
        "host overhead, batch 32": value(pick("4", batch=32), "overhead_fraction"),
        "host ms per forward (outside model and summaries), batch 1": value(pick("4", batch=1), "host_ms_per_step"),
        "host ms per forward (outside model and summaries), batch 32": value(pick("4", batch=32), "host_ms_per_step"),
    }


def export(commit: str, into: Path) -> Path:
    """The tree of ``commit`` under ``into`` (no git bookkeeping left behind)."""
    archive = into / "tree.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), commit], cwd=ROOT, check=True)
    tree = into / commit
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def run_bench(tree: Path, out: Path, args: argparse.Namespace, compile_: bool) -> dict[str, Any]:
    command = [
        sys.executable,
        str(tree / "experiments" / "bench_engine.py"),
        "--size",
        args.size,
        "--device",
        "cpu",
        "--quick",
        "--repeats",
        str(args.repeats),
        "--threads",
        str(args.threads),
        "--sections",
        args.sections,
        "--out",
        str(out),
    ] + (["--compile"] if compile_ else [])
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "DLMSEARCH_UPSTREAM": os.environ.get("DLMSEARCH_UPSTREAM", str(UPSTREAM)),
    }
    print(f"$ PYTHONPATH={tree} {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=tree, env=env, text=True, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"benchmark in {tree} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return json.loads(out.read_text())


UNIFORM_BATCHES = (1, 32)  # the uniform-noise (DiffusionGemma) path: tokens/s of the CLI's own decode


def run_uniform(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, float | None]:
    """Tokens/s of ``+decoder=diffusion_gemma model=countdown_uniform task=countdown`` through the CLI of
    ``tree`` at each batch size of :data:`UNIFORM_BATCHES` (``summary.json``'s ``tokens_per_s``: answer
    tokens over the decode's wall time, model loading left out)."""
    found: dict[str, float | None] = {}
    for batch in UNIFORM_BATCHES:
        run_dir = out / f"uniform_batch{batch}"
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time (the CLI resumes a directory it finds)
        command = [
            sys.executable,
            "-m",
            "dlmsearch",
            "+decoder=diffusion_gemma",
            "model=countdown_uniform",
            "task=countdown",
            f"task.limit={args.uniform_items}",
            f"batch_size={batch}",
            "examples=0",
            f"hydra.run.dir={run_dir}",
        ]
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
        done = subprocess.run(command, cwd=tree, env=env, text=True, capture_output=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"uniform-noise decode in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        found[f"DiffusionGemma path (countdown_uniform) tokens/s, batch {batch}"] = summary.get("tokens_per_s")
    return found


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the earlier commit (e.g. fe8c0e7)")
    parser.add_argument("--size", default="tiny", help="bench_engine.py --size")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three runs")
    parser.add_argument("--repeats", type=int, default=3, help="bench_engine.py --repeats")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sections", default="1,2,3,4", help="bench_engine.py --sections (1b on CPU: 2)")
    parser.add_argument(
        "--uniform-items", type=int, default=32, help="Countdown items of the uniform-noise (DiffusionGemma) runs"
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="leave out the engine.compile run (eager before and after only)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write before_after_<size>.{json,md} (default runs/bench_before_after/)",
    )
    add_flag(parser, "table in experiments/results/bench/")
    args = parser.parse_args(argv)
    out = resolve(parser, args, args.out, ROOT / "experiments" / "results" / "bench", RUNS / "bench_before_after")
    args.out = out
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out
    runs_dir = ROOT / "runs" / "bench_before_after"
    runs_dir.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    )
    variants = {
        f"before ({args.before})": None,
        f"after ({head}{'+' if dirty else ''})": False,
        "after, engine.compile": True,
    }
    if args.no_compile:
        variants.pop("after, engine.compile")
    found: dict[str, list[dict[str, float | None]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as scratch:
        before_tree = export(args.before, Path(scratch))
        for round_ in range(args.rounds):
            for index, (name, compile_) in enumerate(variants.items()):
                tree = before_tree if compile_ is None else ROOT
                doc = run_bench(tree, runs_dir / f"{args.size}_{index}_round{round_}.json", args, bool(compile_))
                uniform = {} if compile_ else run_uniform(tree, runs_dir / f"{args.size}_{index}_round{round_}", args)
                found[name].append({**metrics(doc), **uniform})
                print(f"  {name}, round {round_ + 1}: {json.dumps(found[name][-1])}", flush=True)
    keys = list(dict.fromkeys(k for ms in found.values() for m in ms for k in m))
    medians = {
        name: {k: (statistics.median(v) if (v := [m[k] for m in ms if m.get(k) is not None]) else None) for k in keys}
        for name, ms in found.items()
    }
    names = list(variants)
    lines = [
        f"| metric ({args.size}, CPU, {args.threads} threads, median of {args.rounds} rounds) | "
        + " | ".join(names)
        + " |",
        "|---|" + "---:|" * len(names),
    ]
    lines += [
        f"| {k} | "
        + " | ".join(fmt(round(medians[n][k], 3) if medians[n][k] is not None else None) for n in names)
        + " |"
        for k in keys
    ]
    table = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    command = (
        f"python experiments/bench_before_after.py --before {args.before} --size {args.size} --rounds {args.rounds} --repeats {args.repeats}"
        + (f" --sections {args.sections}" if args.sections != "1,2,3,4" else "")
        + (" --no-compile" if args.no_compile else "")
    )
    (out / f"before_after_{args.size}.md").write_text(f"{table}\n\nMeasured by `{command}`.\n")
    (out / f"before_after_{args.size}.json").write_text(
        json.dumps({"command": command, "rounds": found, "median": medians}, indent=1) + "\n"
    )
    print("\n" + table)
    print(f"wrote {out}/before_after_{args.size}.{{md,json}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
