"""The benchmark's sections, each a table and rows of the JSON (see ``experiments/bench_engine.py``)."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.harness import Bench, decode_stats, make_decoder, requests_for, summary
from bench.random_model import MASK_ID, THRESHOLD, ReferenceView
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.transformer import BidirectionalTransformer
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.engine.adaptive import ADAPTIVE_POLICIES
from dlmsearch.search.engine.cache_policy import BlockCache
from dlmsearch.search.engine.call_records import CallRows, CallSettings
from dlmsearch.search.engine.profile import ForwardProfile
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.state import Layout, initial_canvas

# The reference loops are a test helper (tests/upstream.py), not part of the package.
sys.path.append(str(Path(__file__).resolve().parents[2] / "tests"))
from upstream import llada_generate, upstream_missing_reason


def section_reference(
    bench: Bench, module: BidirectionalTransformer, adapter: ModelAdapter, plan: dict[str, Any]
) -> None:
    """1. Fast-dLLM's ``generate(threshold=0.9)`` vs dlmsearch ``fast_dllm``, same weights.

    At batch 1 the two loops are timed interleaved; larger batches are dlmsearch only."""
    name = "1_reference_vs_fast_dllm"
    prompt_len, gen, block = plan["prompt"], plan["gen"], plan["block"]
    settings = dict(prompt=prompt_len, gen=gen, block=block, threshold=THRESHOLD)
    prompts = bench.prompts(max(plan["batches"]), prompt_len)
    decoder = make_decoder("fast_dllm", gen, f"decoder.commit.threshold={THRESHOLD}")
    engine = RolloutEngine(adapter=adapter, row_budget=bench.args.row_budget, compile=bench.args.compile, cache="none")

    def dlm(batch: int) -> Callable[[], list[DecodeResult]]:
        requests = requests_for(prompts[:batch], gen)
        return lambda: decoder.decode(engine, requests, block)

    def dlm_row(
        label: str, batch: int, measured: tuple[list[float], Any, float], reference_tokens: torch.Tensor | None = None
    ) -> None:
        walls, results, peak = measured
        row = {
            "section": name,
            "label": label,
            "loop": "dlmsearch",
            "batch": batch,
            **settings,
            **summary(walls),
            "tokens_per_s": round(batch * gen / statistics.median(walls), 2),
            **decode_stats(results),
            "peak_mib": peak,
        }
        if reference_tokens is not None:
            row["tokens_equal_reference"] = bool(torch.equal(results[0].tokens, reference_tokens))
        bench.add(row)
        print(
            f"      {label} b={batch}: {row['wall_s']:.3f} s, {row['tokens_per_s']} tok/s, {row['steps_mean']} steps",
            flush=True,
        )

    batches = list(plan["batches"])
    reason = upstream_missing_reason()
    if reason:
        print(f"  [1] reference loop skipped: {reason}", flush=True)
        bench.skip(name, "reference generate()", reason, batch=1, **settings)
    elif not bench.over_budget():
        # Fast-dLLM is imported by tests/upstream.py from the local copy; nothing is copied.
        view = ReferenceView(module)
        print("  [1] reference generate() and dlmsearch fast_dllm at b=1, interleaved ...", flush=True)
        measured = bench.measure_many(
            {
                "reference": lambda: llada_generate(
                    view,
                    prompts[0],
                    steps=gen,
                    gen_length=gen,
                    block_length=block,
                    threshold=THRESHOLD,
                    mask_id=MASK_ID,
                ),
                "dlmsearch": dlm(1),
            }
        )
        walls, (tokens, nfe), peak = measured["reference"]
        row = bench.add(
            {
                "section": name,
                "label": "reference generate()",
                "loop": "reference",
                "batch": 1,
                **settings,
                **summary(walls),
                "tokens_per_s": round(gen / statistics.median(walls), 2),
                "steps_mean": nfe,
                "tokens_per_step": round(gen / nfe, 2),
                "peak_mib": peak,
            }
        )
        print(f"      reference b=1: {row['wall_s']:.3f} s, {row['tokens_per_s']} tok/s, {nfe} calls", flush=True)
        if 1 in batches:
            dlm_row("dlmsearch fast_dllm", 1, measured["dlmsearch"], tokens)
            batches.remove(1)

    for batch in batches:
        if bench.over_budget():
            bench.skip(name, "dlmsearch fast_dllm", "over --budget-s", batch=batch, **settings)
            continue
        print(f"  [1] dlmsearch fast_dllm b={batch} ...", flush=True)
        dlm_row("dlmsearch fast_dllm", batch, bench.measure(dlm(batch)))


def section_lookahead(bench: Bench, adapter: ModelAdapter, plan: dict[str, Any]) -> None:
    """2. One engine call of 1 root row vs 1 + K rows of one sample (a lookahead round's rows),
    without a cache and against a warm dual cache (all rows then forward the block only; a
    block-diffusion model: its exact block cache)."""
    name = "2_lookahead_round"
    prompt_len, gen, block, calls = plan["prompt"], plan["gen"], plan["block"], plan["calls"]
    layout = Layout(gen_start=prompt_len, gen_length=gen, block_length=block)
    canvas = initial_canvas(
        bench.prompts(1, prompt_len), [torch.full((gen,), MASK_ID)], layout, MASK_ID, pad_id=MASK_ID
    )
    for cache in ("none", "block" if adapter.capabilities.attention_block else "dual"):
        if bench.over_budget():
            bench.skip(name, f"cache={cache}", "over --budget-s", cache=cache)
            continue
        engine = RolloutEngine(
            adapter=adapter, row_budget=bench.args.row_budget, compile=bench.args.compile, cache=cache
        )
        inputs = {}
        for k in [0, *plan["ks"]]:
            rows = 1 + k
            tokens = canvas.tokens.repeat(rows, 1)
            for branch in range(1, rows):  # each branch has committed one position of the block
                tokens[branch, prompt_len + (branch - 1) % block] = 1000 + branch
            window = (
                (torch.full((rows,), prompt_len), torch.full((rows,), prompt_len + block)) if cache != "none" else None
            )
            inputs[k] = (
                tokens,
                canvas.attention.repeat(rows, 1),
                torch.zeros(rows, dtype=torch.long),
                torch.arange(rows),
                window,
            )

        def call(k: int) -> int:
            """One engine call of ``1 + k`` rows; the positions it computed."""
            tokens, attention, zeros, row_key, window = inputs[k]
            rows = CallRows(tokens, attention, zeros, zeros, row_key, zeros, window)
            _, cost = engine.evaluate(rows, CallSettings(memory, sampling, frozenset(), prompt_len))
            return int(cost.tokens.sum())

        memory, sampling = engine.memory(1), engine.sampling_over(Sampling())
        if cache != "none":  # the root's full forward fills the sample's cache for this window
            call(0)
        print(
            f"  [2] cache={cache}: rows 1, " + ", ".join(str(1 + k) for k in plan["ks"]) + " interleaved ...",
            flush=True,
        )
        measured = bench.measure_many({k: (lambda k=k: [call(k) for _ in range(calls)]) for k in inputs})
        base = statistics.median(measured[0][0]) / calls
        for k, (walls, _, peak) in measured.items():
            computed = call(k)  # the block only, when the cache is hit
            per_call = statistics.median(walls) / calls
            row = bench.add(
                {
                    "section": name,
                    "label": f"1 root + {k} branch rows" if k else "plain round (1 row)",
                    "prompt": prompt_len,
                    "gen": gen,
                    "block": block,
                    "cache": cache,
                    "k": k,
                    "rows": 1 + k,
                    "calls_per_timing": calls,
                    **summary(walls),
                    "call_s": round(per_call, 5),
                    "ratio_vs_plain": round(per_call / base, 3),
                    "token_forwards_per_call": computed,
                    "peak_mib": peak,
                }
            )
            print(
                f"      rows={1 + k}: {1000 * per_call:.1f} ms/call, x{row['ratio_vs_plain']}, {computed} token-forwards",
                flush=True,
            )


def section_cache(bench: Bench, adapter: ModelAdapter, plan: dict[str, Any]) -> None:
    """3. Engine cache none / prefix / dual, ``fast_dllm`` tau 0.9 (the three timed interleaved); on a
    block-diffusion model none / block / block with fused writes, for a plain and a K = 4 lookahead decoder."""
    name = "3_kv_cache"
    prompt_len, gen, block = plan["prompt"], plan["gen"], plan["block"]
    prompts = bench.prompts(max(plan["batches"]), prompt_len)
    modes = plan.get("modes", ("none", "prefix", "dual"))
    family = "dream" if adapter.capabilities.shift_logits else "llada"
    policies = {
        "block_fused": BlockCache(fuse_write=True),
        **{policy.name: policy.for_family(family) for policy in ADAPTIVE_POLICIES},
    }
    for preset in plan.get("presets", ("fast_dllm",)):
        decoder = make_decoder(preset, gen, f"decoder.commit.threshold={THRESHOLD}")
        for batch in plan["batches"]:
            settings = dict(prompt=prompt_len, gen=gen, block=block, threshold=THRESHOLD, batch=batch, preset=preset)
            if bench.over_budget():
                for cache in modes:
                    bench.skip(name, f"{preset} cache={cache}", "over --budget-s", cache=cache, **settings)
                continue
            requests = requests_for(prompts[:batch], gen)
            engines = {
                cache: RolloutEngine(
                    adapter=adapter,
                    row_budget=bench.args.row_budget,
                    compile=bench.args.compile,
                    cache=policies.get(cache, cache),
                )
                for cache in modes
            }
            print(f"  [3] {preset}: cache {' / '.join(modes)} at b={batch}, interleaved ...", flush=True)
            measured = bench.measure_many(
                {
                    cache: (lambda engine=engine: decoder.decode(engine, requests, block))
                    for cache, engine in engines.items()
                }
            )
            none_speed = batch * gen / statistics.median(measured["none"][0])
            none_tokens = torch.stack([r.tokens for r in measured["none"][1]])
            for cache, (walls, results, peak) in measured.items():
                speed = batch * gen / statistics.median(walls)
                tokens = torch.stack([r.tokens for r in results])
                row = bench.add(
                    {
                        "section": name,
                        "label": f"{preset} cache={cache}",
                        "cache": cache,
                        **settings,
                        **summary(walls),
                        "tokens_per_s": round(speed, 2),
                        **decode_stats(results),
                        "ratio_vs_none": round(speed / none_speed, 3),
                        "tokens_equal_none": round((tokens == none_tokens).float().mean().item(), 4),
                        "peak_mib": peak,
                    }
                )
                print(
                    f"      {preset} cache={cache}: {row['tokens_per_s']} tok/s, {row['steps_mean']} steps, {row['token_forwards_mean']} token-forwards, "
                    f"x{row['ratio_vs_none']}",
                    flush=True,
                )


def section_overhead(bench: Bench, adapter: ModelAdapter, plan: dict[str, Any]) -> None:
    """4. Wall time vs time inside the model forward and the engine's per-forward summaries
    (the engine's :class:`ForwardProfile`, synchronised)."""
    name = "4_host_overhead"
    prompt_len, gen, block = plan["prompt"], plan["gen"], plan["block"]
    decoder = make_decoder("fast_dllm", gen, f"decoder.commit.threshold={THRESHOLD}")
    prompts = bench.prompts(max(plan["batches"]), prompt_len)
    for batch in plan["batches"]:
        settings = dict(prompt=prompt_len, gen=gen, block=block, threshold=THRESHOLD, batch=batch)
        if bench.over_budget():
            bench.skip(name, "fast_dllm", "over --budget-s", **settings)
            continue
        profile = ForwardProfile()
        engine = RolloutEngine(
            adapter=adapter, row_budget=bench.args.row_budget, compile=bench.args.compile, cache="none", profile=profile
        )
        requests = requests_for(prompts[:batch], gen)
        splits = []

        def run() -> list[DecodeResult]:
            profile.reset()
            start = time.perf_counter()
            results = decoder.decode(engine, requests, block)
            bench.sync()
            splits.append((time.perf_counter() - start, profile.model_s, profile.summary_s, profile.forwards))
            return results

        print(f"  [4] fast_dllm b={batch} ...", flush=True)
        walls, results, peak = bench.measure(run)
        splits = splits[1:]  # drop the warm-up
        wall, model_s, summarise_s, calls = sorted(splits)[len(splits) // 2]
        row = bench.add(
            {
                "section": name,
                "label": "fast_dllm",
                **settings,
                **summary(walls),
                **decode_stats(results),
                "model_s": round(model_s, 4),
                "summarise_s": round(summarise_s, 4),
                "forwards": calls,
                "overhead_fraction": round(1 - model_s / wall, 4),
                "summary_fraction": round((summarise_s - model_s) / wall, 4),
                "host_fraction": round(1 - summarise_s / wall, 4),
                "host_ms_per_step": round(1000 * (wall - summarise_s) / max(1, calls), 3),
                "peak_mib": peak,
            }
        )
        print(
            f"      wall {wall:.3f} s, model {model_s:.3f} s, overhead {100 * row['overhead_fraction']:.1f} % "
            f"(summaries {100 * row['summary_fraction']:.1f} %, host {100 * row['host_fraction']:.1f} %)",
            flush=True,
        )
