"""The server under load: throughput and latency against concurrency, beside one-at-a-time
serving and the offline decode of the same requests at batch 16, measured in one run.

    python experiments/serve_load.py                      # both models, fast_dllm and adalook (into runs/serve_load/)
    python experiments/serve_load.py --batch-wait-ms 0 10 --write-committed   # the committed experiments/results/serve/
    python experiments/serve_load.py --models countdown --requests 32 --concurrency 1 16 --settings greedy mixed

Two models: the shipped Countdown model, and a tiny random LLaDA (LLaDA's architecture at the
benchmark's ``tiny`` shape, 256 wide and 4 layers, initialised by
:func:`bench.random_model.initialise` so that it decodes like a trained one, over the Countdown
tokenizer so that the same chat requests apply; written to a temporary directory as a LLaDA
checkpoint and served as ``model=llada model.path=DIR``). Starts ``python -m dlmsearch.serve``
on 127.0.0.1 (an ephemeral port), sends ``--requests``
distinct chat requests (Countdown problems, each its own seed) from N concurrent clients
(httpx; one request through the official ``openai`` client first), and reads the server's
``/metrics`` for the mean rows per step. Each point runs twice (``--settings``): every request
greedy, and a mixed load where every second request samples at temperature 0.7 with top-p 0.9
(they share the greedy requests' forward: per-row sampling). Concurrency 1 is one-at-a-time serving. The offline
figure decodes the same prompts with :meth:`dlmsearch.api.Decoder.generate` at ``batch_size=16``
in this process. Writes ``load.json``, ``load.md`` and ``load.png`` into ``--out`` (default
``runs/serve_load/``; ``--write-committed``: ``experiments/results/serve/``, the table in docs/serving.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serving import running_server

sys.path.insert(0, str(Path(__file__).resolve().parent))
import attrs
from bench.random_model import initialise, model_config
from outputs import RUNS, add_flag, resolve

from dlmsearch.api import Decoder, Model
from dlmsearch.models.llada_checkpoint import save_llada
from dlmsearch.models.loading import checkpoint_ids
from dlmsearch.models.transformer import BidirectionalTransformer
from dlmsearch.run_records import percentile
from dlmsearch.shipped import package_data

COMMITTED_OUT = Path(__file__).resolve().parent / "results" / "serve"
BLOCK = 8  # the Countdown model's block length; the random LLaDA is served with the same
MODELS = ("countdown", "random_llada")


def random_llada(directory: Path) -> Path:
    """A tiny random LLaDA over the Countdown tokenizer, written as a LLaDA checkpoint (float32)."""
    shipped = package_data("countdown_model")
    ids = checkpoint_ids(shipped, "llada")
    assert ids.mask_id is not None and ids.vocab_size is not None and len(ids.eos_ids) == 2, ids
    model = BidirectionalTransformer(attrs.evolve(model_config("tiny"), vocab_size=ids.vocab_size))
    initialise(model, seed=0, mask_id=ids.mask_id)
    eos, eot = ids.eos_ids
    save_llada(directory, model.eval(), mask_id=ids.mask_id, eos_id=eos, eot_id=eot)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(shipped / name, directory / name)
    return directory


def served(name: str, directory: Path | None) -> tuple[list[str], Model]:
    """The server overrides and the offline model for one of :data:`MODELS`."""
    if name == "countdown":
        return [], Model.load("countdown")
    return ["model=llada", f"model.path={directory}", f"task.block_length={BLOCK}"], Model.load("llada", path=directory)


def prompts(count: int) -> list[str]:
    return [f"Make {10 + (i * 7) % 40} from {1 + i % 9} {2 + (i * 3) % 8} {3 + (i * 5) % 7}." for i in range(count)]


MIXED = {"temperature": 0.7, "top_p": 0.9}  # what every second request of a mixed load sets (the rest are greedy)


def sampling_of(i: int, settings: str) -> dict:
    """Request ``i``'s sampling fields: none (greedy) for every request, or for every second one under ``mixed``."""
    return MIXED if settings == "mixed" and i % 2 else {}


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User + system CPU seconds so far of process ``pid`` and of its descendants (Linux ``/proc``;
    the server: the engine, and its front processes)."""
    tick = os.sysconf("SC_CLK_TCK")

    def own(process: int) -> float:
        fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    def children(process: int) -> list[int]:
        found = []
        for task in Path(f"/proc/{process}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
        return found + [g for c in found for g in children(c)]

    try:
        return own(pid), sum(own(c) for c in children(pid))
    except (FileNotFoundError, ProcessLookupError):  # not Linux, or a process that just ended
        return 0.0, 0.0


async def load(
    url: str, model: str, texts: list[str], concurrency: int, max_tokens: int, settings: str, server_pid: int
) -> dict:
    gate = asyncio.Semaphore(concurrency)
    latencies, tokens, steps_taken, row_forwards = [], 0, [], []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal tokens
        async with gate:
            tick = time.perf_counter()
            r = await client.post(
                "/v1/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": texts[i]}],
                    "max_tokens": max_tokens,
                    "seed": i,
                    **sampling_of(i, settings),
                },
            )
            r.raise_for_status()
            latencies.append(time.perf_counter() - tick)
            tokens += r.json()["usage"]["completion_tokens"]
            steps_taken.append(r.json()["usage"]["steps"])
            row_forwards.append(r.json()["usage"]["row_forwards"])

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        steps0, slots0 = (
            await metric(client, "dlmsearch_steps_total"),
            await metric(client, "dlmsearch_slot_steps_total"),
        )
        tick, client_cpu, server_cpu = time.perf_counter(), time.process_time(), cpu_seconds(server_pid)
        await asyncio.gather(*(one(client, i) for i in range(len(texts))))
        wall = time.perf_counter() - tick
        client_cpu, server_cpu = (
            time.process_time() - client_cpu,
            [b - a for a, b in zip(server_cpu, cpu_seconds(server_pid))],
        )
        steps, slots = (
            await metric(client, "dlmsearch_steps_total") - steps0,
            await metric(client, "dlmsearch_slot_steps_total") - slots0,
        )
    return {
        "settings": settings,
        "concurrency": concurrency,
        "requests": len(texts),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(texts) / wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "p50_s": round(percentile(latencies, 50), 3),
        "p95_s": round(percentile(latencies, 95), 3),
        "p99_s": round(percentile(latencies, 99), 3),
        "mean_rows_per_step": round(slots / max(steps, 1), 2),
        "mean_steps_per_request": round(sum(steps_taken) / len(steps_taken), 2),  # sampled requests may need more
        "mean_row_forwards_per_request": round(sum(row_forwards) / len(row_forwards), 2),  # lookahead branches count
        # cores busy on average (CPU seconds / wall): the engine, the HTTP fronts, this load generator
        "cores_engine": round(server_cpu[0] / wall, 2),
        "cores_fronts": round(server_cpu[1] / wall, 2),
        "cores_client": round(client_cpu / wall, 2),
    }


async def metric(client: httpx.AsyncClient, name: str) -> float:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def offline(model: Model, preset: str, texts: list[str], max_tokens: int) -> float:
    """Requests per second of the offline decode of the same prompts at batch 16 (greedy: the seeds do not matter)."""
    decoder = Decoder.from_preset(preset)
    decoder.generate(
        model, texts[:16], gen_length=max_tokens, block_length=BLOCK, batch_size=16, seed=0
    )  # warm-up, as the server's first request
    tick = time.perf_counter()
    decoder.generate(model, texts, gen_length=max_tokens, block_length=BLOCK, batch_size=16, seed=0)
    return len(texts) / (time.perf_counter() - tick)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="where to write load.{json,md,png} (default runs/serve_load/)"
    )
    add_flag(parser, "table and figure in experiments/results/serve/")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--presets", nargs="+", default=["fast_dllm", "adalook"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--batch-wait-ms", type=float, nargs="+", default=[0.0], help="serve.batch_wait_ms values, each measured"
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=("greedy", "mixed"),
        default=["greedy", "mixed"],
        help="greedy: every request greedy; mixed: every second one at temperature 0.7, top-p 0.9 (each its own seed)",
    )
    parser.add_argument("--workers", type=int, default=1, help="serve.workers: the HTTP front processes")
    args = parser.parse_args(argv)
    out = resolve(parser, args, args.out, COMMITTED_OUT, RUNS / "serve_load")
    args.out = out
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    texts = prompts(args.requests)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        directory = random_llada(Path(scratch)) if "random_llada" in args.models else None
        for name in args.models:
            overrides, model = served(name, directory)
            for preset in args.presets:
                mine = []
                for wait in args.batch_wait_ms:
                    settings = [
                        *overrides,
                        f"+decoder={preset}",
                        "serve.max_batch=64",
                        "serve.max_queue=1024",
                        f"serve.batch_wait_ms={wait}",
                        f"serve.workers={args.workers}",
                    ]
                    with running_server(settings, cwd=str(out), threads=2) as (process, url, _):
                        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
                        served_as = client.models.list().data[0].id
                        for kind in args.settings:  # warm-up: each load's lanes are built before it is timed
                            client.chat.completions.create(
                                model=served_as,
                                messages=[{"role": "user", "content": texts[0]}],
                                max_tokens=args.max_tokens,
                                **sampling_of(1, kind),
                            )
                        mine += [
                            {
                                "model": name,
                                "preset": preset,
                                "batch_wait_ms": wait,
                                **asyncio.run(load(url, served_as, texts, c, args.max_tokens, kind, process.pid)),
                            }
                            for kind in args.settings
                            for c in args.concurrency
                        ]
                rate = offline(model, preset, texts, args.max_tokens)
                for row in mine:
                    alike = lambda r, row=row: r["batch_wait_ms"] == row["batch_wait_ms"]
                    base = next(
                        (
                            r["requests_per_s"]
                            for r in mine
                            if alike(r) and r["concurrency"] == 1 and r["settings"] == row["settings"]
                        ),
                        None,
                    )
                    greedy = next(
                        (
                            r["requests_per_s"]
                            for r in mine
                            if alike(r) and r["concurrency"] == row["concurrency"] and r["settings"] == "greedy"
                        ),
                        None,
                    )
                    row["offline_batch16_requests_per_s"] = round(rate, 3)
                    row["vs_one_at_a_time"] = round(row["requests_per_s"] / base, 2) if base else None
                    row["vs_offline_batch16"] = round(row["requests_per_s"] / rate, 2)
                    row["vs_greedy"] = round(row["requests_per_s"] / greedy, 2) if greedy else None
                    print(json.dumps(row), flush=True)
                rows += mine
    (out / "load.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "| model | preset | settings | batch wait ms | clients | requests/s | tokens/s | × one at a time | × offline batch 16 | × all greedy | p50 s | p95 s | p99 s | mean rows/step | steps/request | row-forwards/request | cores: engine / fronts / client |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['model']} | `{r['preset']}` | {r['settings']} | {r['batch_wait_ms']:g} | {r['concurrency']} | {r['requests_per_s']} | {r['tokens_per_s']} | {r['vs_one_at_a_time']} | {r['vs_offline_batch16']} | {r['vs_greedy']} | {r['p50_s']} | {r['p95_s']} | {r['p99_s']} | {r['mean_rows_per_step']} | {r.get('mean_steps_per_request', '')} | {r.get('mean_row_forwards_per_request', '')} | {r.get('cores_engine', '')} / {r.get('cores_fronts', '')} / {r.get('cores_client', '')} |"
        for r in rows
    ]
    (out / "load.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, args.requests, out / "load.png")
    print(f"wrote {out}/load.{{json,md,png}}")


def plot(rows: list[dict], requests: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(len(models), 2, figsize=(10, 4 * len(models)), squeeze=False)
    for (left, right), name in zip(axes, models):
        for preset in dict.fromkeys(r["preset"] for r in rows if r["model"] == name):
            for wait, kind in dict.fromkeys((r["batch_wait_ms"], r["settings"]) for r in rows):
                mine = [
                    r
                    for r in rows
                    if r["model"] == name
                    and r["preset"] == preset
                    and r["batch_wait_ms"] == wait
                    and r["settings"] == kind
                ]
                x, label = [r["concurrency"] for r in mine], f"{preset}, {kind}, wait {wait:g} ms"
                left.plot(
                    x,
                    [r["requests_per_s"] for r in mine],
                    marker="o",
                    linestyle="-" if kind == "greedy" else "--",
                    label=label,
                )
                right.plot(
                    x, [r["p95_s"] for r in mine], marker="o", linestyle="-" if kind == "greedy" else "--", label=label
                )
            left.axhline(mine[0]["offline_batch16_requests_per_s"], linestyle=":", color="grey")
            left.annotate(
                f"{preset} offline, batch 16",
                (x[0], mine[0]["offline_batch16_requests_per_s"]),
                fontsize=7,
                va="bottom",
            )
        for ax, label in ((left, "requests / s"), (right, "p95 latency (s)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel(label)
            ax.set_title(name)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"dlmsearch.serve under load ({requests} chat requests per point, 16 new tokens, 2 CPU cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
