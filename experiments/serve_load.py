"""The server under load: throughput and latency against concurrency, beside one-at-a-time
serving and the offline decode of the same requests at batch 16, measured in one run.

    python experiments/serve_load.py                      # shipped Countdown model, fast_dllm and adalook
    python experiments/serve_load.py --requests 32 --concurrency 1 16

Starts ``python -m dlmsearch.serve`` on 127.0.0.1 (an ephemeral port), sends ``--requests``
distinct chat requests (Countdown problems, each its own seed) from N concurrent clients
(httpx; one request through the official ``openai`` client first), and reads the server's
``/metrics`` for the mean rows per step. Concurrency 1 is one-at-a-time serving. The offline
figure decodes the same prompts with :meth:`dlmsearch.api.Decoder.generate` at ``batch_size=16``
in this process. Writes ``experiments/results/serve/{load.json,load.md,load.png}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serving import running_server  # noqa: E402

from dlmsearch.api import Decoder, Model  # noqa: E402
from dlmsearch.records import percentile  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "serve"


def prompts(count: int) -> list[str]:
    return [f"Make {10 + (i * 7) % 40} from {1 + i % 9} {2 + (i * 3) % 8} {3 + (i * 5) % 7}." for i in range(count)]


async def load(url: str, texts: list[str], concurrency: int, max_tokens: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    latencies, tokens = [], 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal tokens
        async with gate:
            tick = time.perf_counter()
            r = await client.post("/v1/chat/completions", json={"model": "countdown", "messages": [{"role": "user", "content": texts[i]}], "max_tokens": max_tokens, "seed": i})
            r.raise_for_status()
            latencies.append(time.perf_counter() - tick)
            tokens += r.json()["usage"]["completion_tokens"]

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        steps0, slots0 = await metric(client, "dlmsearch_steps_total"), await metric(client, "dlmsearch_slot_steps_total")
        tick = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(len(texts))))
        wall = time.perf_counter() - tick
        steps, slots = await metric(client, "dlmsearch_steps_total") - steps0, await metric(client, "dlmsearch_slot_steps_total") - slots0
    return {
        "concurrency": concurrency, "requests": len(texts), "wall_s": round(wall, 3), "requests_per_s": round(len(texts) / wall, 3),
        "tokens_per_s": round(tokens / wall, 1), "p50_s": round(percentile(latencies, 50), 3), "p95_s": round(percentile(latencies, 95), 3),
        "p99_s": round(percentile(latencies, 99), 3), "mean_rows_per_step": round(slots / max(steps, 1), 2),
    }


async def metric(client: httpx.AsyncClient, name: str) -> float:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def offline(preset: str, texts: list[str], max_tokens: int, block: int) -> float:
    """Requests per second of the offline decode of the same prompts at batch 16 (greedy: the seeds do not matter)."""
    model, decoder = Model.load("countdown"), Decoder.from_preset(preset)
    tick = time.perf_counter()
    decoder.generate(model, texts, gen_length=max_tokens, block_length=block, batch_size=16, seed=0)
    return len(texts) / (time.perf_counter() - tick)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["fast_dllm", "adalook"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    texts = prompts(args.requests)
    rows = []
    for preset in args.presets:
        with running_server([f"+decoder={preset}", "serve.max_batch=64", "serve.max_queue=1024"], cwd=str(OUT), threads=2) as (_, url, _):
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused").chat.completions.create(model="countdown", messages=[{"role": "user", "content": texts[0]}], max_tokens=args.max_tokens)
            for concurrency in args.concurrency:
                row = {"preset": preset, **asyncio.run(load(url, texts, concurrency, args.max_tokens))}
                rows.append(row)
                print(json.dumps(row), flush=True)
        rate = offline(preset, texts, args.max_tokens, 8)
        for row in rows:
            if row["preset"] == preset:
                row["offline_batch16_requests_per_s"] = round(rate, 3)
        print(f"{preset}: offline at batch 16 {rate:.2f} requests/s", flush=True)
    base = {r["preset"]: r["requests_per_s"] for r in rows if r["concurrency"] == 1}
    for row in rows:
        row["vs_one_at_a_time"] = round(row["requests_per_s"] / base[row["preset"]], 2) if row["preset"] in base else None
        row["vs_offline_batch16"] = round(row["requests_per_s"] / row["offline_batch16_requests_per_s"], 2)
    (OUT / "load.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| preset | clients | requests/s | tokens/s | × one at a time | × offline batch 16 | p50 s | p95 s | p99 s | mean rows/step |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| `{r['preset']}` | {r['concurrency']} | {r['requests_per_s']} | {r['tokens_per_s']} | {r['vs_one_at_a_time']} | {r['vs_offline_batch16']} | {r['p50_s']} | {r['p95_s']} | {r['p99_s']} | {r['mean_rows_per_step']} |" for r in rows]
    (OUT / "load.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, args.requests)


def plot(rows: list[dict], requests: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for preset in dict.fromkeys(r["preset"] for r in rows):
        mine = [r for r in rows if r["preset"] == preset]
        x = [r["concurrency"] for r in mine]
        left.plot(x, [r["requests_per_s"] for r in mine], marker="o", label=preset)
        left.axhline(mine[0]["offline_batch16_requests_per_s"], linestyle=":", color=left.lines[-1].get_color(), label=f"{preset} offline, batch 16")
        right.plot(x, [r["p95_s"] for r in mine], marker="o", label=preset)
    for ax, label in ((left, "requests / s"), (right, "p95 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"dlmsearch.serve on the shipped Countdown model ({requests} requests per point, 2 CPU cores)")
    fig.tight_layout()
    fig.savefig(OUT / "load.png", dpi=120)


if __name__ == "__main__":
    main()
