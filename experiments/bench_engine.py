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
3. engine cache none / prefix / dual at prompt 200, generation 256, block 32 (``fast_dllm``;
   ``--quick``: generation 64);
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
import math
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.search.driver import DecodeRequest, DecodeResult, SearchDecoder
from dlmsearch.search.engine import RolloutEngine
from dlmsearch.search.state import Layout, initial_canvas

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = Path(__file__).resolve().parents[2] / "shared" / "upstream" / "fast-dllm"
TESTS = ROOT / "tests"

MASK_ID = 126336
VOCAB = 126464
PROMPT_ID_LIMIT = 126000  # random prompt ids stay below the special tokens
THRESHOLD = 0.9  # Fast-dLLM's tau

SIZES = {
    "tiny": dict(hidden_size=256, num_layers=4, num_heads=8, intermediate_size=768),
    "1b": dict(hidden_size=2048, num_layers=16, num_heads=16, intermediate_size=5632),
    "8b": dict(hidden_size=4096, num_layers=32, num_heads=32, intermediate_size=12288),  # LLaDA-8B
}

# Random weights (see ``initialise``).
INIT_STD = 0.02
QK_COMPONENT_STD = 2.56  # query/key component std: attention logits std ~6.5, sharp and position-dependent
LOGIT_STD = 16.0  # head output std: top-1 probabilities spread over (0, 1), tau = 0.9 commits ~3 tokens/step
CONSTANT_VALUE = 0.05  # a constant residual channel that carries the mask token's logit far down
MASK_LOGIT_WEIGHT = -1.0e4


# ---------------------------------------------------------------------------------------------
# Plans: what each section runs, per mode
# ---------------------------------------------------------------------------------------------


def make_plan(size: str, quick: bool) -> dict[str, dict[str, Any]]:
    """Settings of every section. ``quick`` is sized for ``--size tiny`` on 2 CPU cores, where
    the 126k-word head and softmax dominate (a few ms per generated position per step)."""
    if quick:
        return {
            "reference": dict(prompt=32, gen=16, block=8, batches=[1, 8, 32], compile_batches=[1]),
            "lookahead": dict(prompt=32, gen=32, block=16, ks=[1, 2, 4, 8], calls=2),
            "cache": dict(prompt=200, gen=64, block=32, batches=[1]),
            "overhead": dict(prompt=32, gen=16, block=8, batches=[1, 32]),
        }
    big = size == "8b"  # one H200, the whole 8b run in ~2-3 minutes (scripts/gpu_check.sh)
    return {
        "reference": dict(prompt=64, gen=128 if big else 256, block=32, batches=[1, 8, 32], compile_batches=[1, 8]),
        "lookahead": dict(prompt=64, gen=256, block=32, ks=[1, 2, 4, 8], calls=5),
        "cache": dict(prompt=200, gen=256, block=32, batches=[1] if big else [1, 8]),
        "overhead": dict(prompt=64, gen=128, block=32, batches=[1, 64]),
    }


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def model_config(size: str) -> TransformerConfig:
    shape = SIZES[size]
    return TransformerConfig(
        vocab_size=VOCAB,
        num_kv_heads=shape["num_heads"],
        max_length=4096,
        rope_theta=5e5,
        tie_embeddings=False,
        **shape,
    )


def build_model(size: str, device: str, dtype: torch.dtype, seed: int = 0) -> BidirectionalTransformer:
    """The model on ``device`` in ``dtype``: constructed on the meta device (no memory), then
    allocated once where it runs (``device="meta"`` stops before that) and initialised in place."""
    with torch.device("meta"):
        model = BidirectionalTransformer(model_config(size))
    model = model.to(dtype=dtype)
    if device == "meta":
        return model
    model.to_empty(device=device)
    initialise(model, seed)
    return model.eval()


@torch.no_grad()
def initialise(model: BidirectionalTransformer, seed: int) -> None:
    """N(0, 0.02) weights and unit norms, with three adjustments that make a random model decode
    like a trained one (the same ideas as ``tests/tiny_checkpoints.py``):

    * query and key projections scaled so their components have std ``QK_COMPONENT_STD`` at any
      width: masked positions hold the same embedding and differ only through (RoPE) attention,
      which must be sharp for their confidences to differ;
    * the head scaled so that logits have std ``LOGIT_STD``: over a 126k vocabulary the top-1
      probability then spreads over (0, 1) and threshold decoding commits several tokens per step;
    * a constant residual channel (last dimension: the same value in every embedding, never
      written by a block, read by the head for the mask token only) that puts the mask token's
      logit hundreds below the rest, so that the mask is never proposed, not even by the
      reference loop (which does not exclude it).
    """
    config = model.config
    width = config.hidden_size
    device = model.embed.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    for param in model.parameters():
        if param.dim() == 1:
            param.fill_(1.0)
        else:
            param.normal_(0.0, INIT_STD, generator=generator)
    qk_gain = QK_COMPONENT_STD / (INIT_STD * math.sqrt(width))
    j = width - 1
    model.embed.weight[:, j] = CONSTANT_VALUE
    for block in model.blocks:
        block.q_proj.weight.mul_(qk_gain)
        block.k_proj.weight.mul_(qk_gain)
        block.o_proj.weight[j] = 0.0
        block.down_proj.weight[j] = 0.0
    head = model.head.weight
    head.mul_(LOGIT_STD / (INIT_STD * math.sqrt(width)))
    head[:, j] = 0.0  # the constant channel feeds the mask logit only
    head[MASK_ID] = 0.0
    head[MASK_ID, j] = MASK_LOGIT_WEIGHT
    model.norm.weight[j] = 1.0 / CONSTANT_VALUE  # mask logit about -1e4 / rms of the last hidden state


class ReferenceView(nn.Module):
    """Our module as the reference loop wants a model: ``model(x).logits`` and ``model.device``.
    Both loops then run the very same weights and forward; only the loops differ."""

    def __init__(self, inner: BidirectionalTransformer) -> None:
        super().__init__()
        self.inner = inner

    @property
    def device(self) -> torch.device:
        return self.inner.embed.weight.device

    def forward(self, input_ids: torch.Tensor, **_: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(logits=self.inner(input_ids))


def confidence_profile(module: BidirectionalTransformer, device: str, prompt: int = 64, masks: int = 64) -> dict[str, float]:
    """Top-1 probabilities at the masked positions of one random prompt (does the model behave?)."""
    generator = torch.Generator().manual_seed(123)
    x = torch.cat([torch.randint(0, PROMPT_ID_LIMIT, (prompt,), generator=generator), torch.full((masks,), MASK_ID)])[None].to(device)
    with torch.no_grad():
        logits = module(x, logits_from=prompt)[0].float()
    top = torch.softmax(logits, dim=-1).max(dim=-1).values
    return {
        "median_top1": round(top.median().item(), 4),
        "share_above_0.9": round((top > 0.9).float().mean().item(), 4),
        "share_below_0.3": round((top < 0.3).float().mean().item(), 4),
        "distinct_argmax": int(logits.argmax(-1).unique().numel()),
        "mask_logit_margin": round((logits.max(-1).values - logits[:, MASK_ID]).min().item(), 1),
    }


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


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
    """A preset composed for left-to-right text, as ``tests/conftest.py::text_decoder`` does."""
    cfg = compose([f"+decoder={preset}", "decoding=text", f"task.gen_length={gen_length}", *overrides])
    return build(cfg, "decoder")


def requests_for(prompts: list[torch.Tensor], gen_length: int) -> list[DecodeRequest]:
    return [DecodeRequest(uid=i, prompt=p, generation=torch.full((gen_length,), MASK_ID)) for i, p in enumerate(prompts)]


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


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


def section_reference(bench: Bench, module: BidirectionalTransformer, adapter: ModelAdapter, plan: dict[str, Any]) -> None:
    """1. Fast-dLLM's ``generate(threshold=0.9)`` vs dlmsearch ``fast_dllm``, same weights.

    At batch 1 the two loops are timed interleaved; larger batches are dlmsearch only."""
    name = "1_reference_vs_fast_dllm"
    prompt_len, gen, block = plan["prompt"], plan["gen"], plan["block"]
    settings = dict(prompt=prompt_len, gen=gen, block=block, threshold=THRESHOLD)
    prompts = bench.prompts(max(plan["batches"]), prompt_len)
    decoder = make_decoder("fast_dllm", gen, f"decoder.commit.threshold={THRESHOLD}")
    engine = RolloutEngine(adapter=adapter, row_budget=bench.args.row_budget, cache="none")

    def dlm(batch: int) -> Callable[[], list[DecodeResult]]:
        requests = requests_for(prompts[:batch], gen)
        return lambda: decoder.decode(engine, requests, block)

    def dlm_row(label: str, batch: int, measured: tuple[list[float], Any, float], reference_tokens: torch.Tensor | None = None) -> None:
        walls, results, peak = measured
        row = {"section": name, "label": label, "loop": "dlmsearch", "batch": batch, **settings, **summary(walls),
               "tokens_per_s": round(batch * gen / statistics.median(walls), 2), **decode_stats(results), "peak_mib": peak}
        if reference_tokens is not None:
            row["tokens_equal_reference"] = bool(torch.equal(results[0].tokens, reference_tokens))
        bench.add(row)
        print(f"      {label} b={batch}: {row['wall_s']:.3f} s, {row['tokens_per_s']} tok/s, {row['steps_mean']} steps", flush=True)

    batches = list(plan["batches"])
    reason = reference_missing_reason()
    if reason:
        print(f"  [1] reference loop skipped: {reason}", flush=True)
        bench.skip(name, "reference generate()", reason, batch=1, **settings)
    elif not bench.over_budget():
        # Fast-dLLM is imported through the test helpers (tests/ on sys.path), which load the
        # upstream package under private names with the transformers 5.x shims; nothing is copied.
        sys.path.insert(0, str(TESTS))
        from tiny_checkpoints import llada_generate

        view = ReferenceView(module)
        print("  [1] reference generate() and dlmsearch fast_dllm at b=1, interleaved ...", flush=True)
        measured = bench.measure_many({
            "reference": lambda: llada_generate(view, prompts[0], steps=gen, gen_length=gen, block_length=block, threshold=THRESHOLD, mask_id=MASK_ID),
            "dlmsearch": dlm(1),
        })
        walls, (tokens, nfe), peak = measured["reference"]
        row = bench.add({"section": name, "label": "reference generate()", "loop": "reference", "batch": 1, **settings, **summary(walls),
                         "tokens_per_s": round(gen / statistics.median(walls), 2), "steps_mean": nfe, "tokens_per_step": round(gen / nfe, 2),
                         "peak_mib": peak})
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

    if bench.args.compile:
        label = "dlmsearch fast_dllm (torch.compile)"
        original = module.run
        try:
            module.run = torch.compile(original, dynamic=True)  # the adapter calls module.run
            for batch in plan["compile_batches"]:
                if bench.over_budget():
                    bench.skip(name, label, "over --budget-s", batch=batch, **settings)
                    continue
                print(f"  [1] {label} b={batch} (the warm-up compiles) ...", flush=True)
                dlm_row(label, batch, bench.measure(dlm(batch)))
        except Exception as error:  # noqa: BLE001 - compile support varies by platform
            message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
            if bench.cuda:
                print(f"  [1] torch.compile failed: {message}", flush=True)
            bench.skip(name, label, f"compile failed: {message}", batch=1, **settings)
        finally:
            module.__dict__.pop("run", None)  # back to the class's method
            torch._dynamo.reset()


def section_lookahead(bench: Bench, adapter: ModelAdapter, plan: dict[str, Any]) -> None:
    """2. One engine call of 1 root row vs 1 + K rows of one sample (a lookahead round's rows),
    without a cache and against a warm dual cache (all rows then forward the block only)."""
    name = "2_lookahead_round"
    prompt_len, gen, block, calls = plan["prompt"], plan["gen"], plan["block"], plan["calls"]
    layout = Layout(gen_start=prompt_len, gen_length=gen, block_length=block)
    canvas = initial_canvas(bench.prompts(1, prompt_len), [torch.full((gen,), MASK_ID)], layout, MASK_ID, pad_id=MASK_ID)
    for cache in ("none", "dual"):
        if bench.over_budget():
            bench.skip(name, f"cache={cache}", "over --budget-s", cache=cache)
            continue
        engine = RolloutEngine(adapter=adapter, row_budget=bench.args.row_budget, cache=cache)
        inputs = {}
        for k in [0, *plan["ks"]]:
            rows = 1 + k
            tokens = canvas.tokens.repeat(rows, 1)
            for branch in range(1, rows):  # each branch has committed one position of the block
                tokens[branch, prompt_len + (branch - 1) % block] = 1000 + branch
            window = (torch.full((rows,), prompt_len), torch.full((rows,), prompt_len + block)) if cache != "none" else None
            inputs[k] = (tokens, canvas.attention.repeat(rows, 1), torch.zeros(rows, dtype=torch.long), torch.arange(rows), window)

        def call(k: int) -> None:
            tokens, attention, zeros, row_key, window = inputs[k]
            engine.evaluate(tokens, attention, zeros, zeros, row_key, frozenset(), prompt_len, window)

        engine.reset(1)
        if cache != "none":  # the root's full forward fills the sample's cache for this window
            call(0)
        print(f"  [2] cache={cache}: rows 1, " + ", ".join(str(1 + k) for k in plan["ks"]) + " interleaved ...", flush=True)
        measured = bench.measure_many({k: (lambda k=k: [call(k) for _ in range(calls)]) for k in inputs})
        base = statistics.median(measured[0][0]) / calls
        for k, (walls, _, peak) in measured.items():
            before = int(engine.token_forwards.sum())
            call(k)
            computed = int(engine.token_forwards.sum()) - before  # the block only, when the cache is hit
            per_call = statistics.median(walls) / calls
            row = bench.add({"section": name, "label": f"1 root + {k} branch rows" if k else "plain round (1 row)", "prompt": prompt_len, "gen": gen,
                             "block": block, "cache": cache, "k": k, "rows": 1 + k, "calls_per_timing": calls, **summary(walls),
                             "call_s": round(per_call, 5), "ratio_vs_plain": round(per_call / base, 3), "token_forwards_per_call": computed, "peak_mib": peak})
            print(f"      rows={1 + k}: {1000 * per_call:.1f} ms/call, x{row['ratio_vs_plain']}, {computed} token-forwards", flush=True)


def section_cache(bench: Bench, adapter: ModelAdapter, plan: dict[str, Any]) -> None:
    """3. Engine cache none / prefix / dual, ``fast_dllm`` tau 0.9 (the three timed interleaved)."""
    name = "3_kv_cache"
    prompt_len, gen, block = plan["prompt"], plan["gen"], plan["block"]
    decoder = make_decoder("fast_dllm", gen, f"decoder.commit.threshold={THRESHOLD}")
    prompts = bench.prompts(max(plan["batches"]), prompt_len)
    modes = ("none", "prefix", "dual")
    for batch in plan["batches"]:
        settings = dict(prompt=prompt_len, gen=gen, block=block, threshold=THRESHOLD, batch=batch)
        if bench.over_budget():
            for cache in modes:
                bench.skip(name, f"cache={cache}", "over --budget-s", cache=cache, **settings)
            continue
        requests = requests_for(prompts[:batch], gen)
        engines = {cache: RolloutEngine(adapter=adapter, row_budget=bench.args.row_budget, cache=cache) for cache in modes}
        print(f"  [3] cache none / prefix / dual at b={batch}, interleaved ...", flush=True)
        measured = bench.measure_many({cache: (lambda engine=engine: decoder.decode(engine, requests, block)) for cache, engine in engines.items()})
        none_speed = batch * gen / statistics.median(measured["none"][0])
        none_tokens = torch.stack([r.tokens for r in measured["none"][1]])
        for cache, (walls, results, peak) in measured.items():
            speed = batch * gen / statistics.median(walls)
            tokens = torch.stack([r.tokens for r in results])
            row = bench.add({"section": name, "label": f"cache={cache}", "cache": cache, **settings, **summary(walls), "tokens_per_s": round(speed, 2),
                             **decode_stats(results), "ratio_vs_none": round(speed / none_speed, 3),
                             "tokens_equal_none": round((tokens == none_tokens).float().mean().item(), 4), "peak_mib": peak})
            print(f"      cache={cache}: {row['tokens_per_s']} tok/s, {row['steps_mean']} steps, {row['token_forwards_mean']} token-forwards, x{row['ratio_vs_none']}", flush=True)


class TimedEngine(RolloutEngine):
    """The engine with the time inside its per-forward summaries accumulated (synchronised).

    ``_summarise`` is the model forward plus what the engine does on the vocabulary-sized
    logits (NaN check, softmax, argmax, copies to the host)."""

    def _summarise(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        sync = torch.cuda.synchronize if self.adapter.device.startswith("cuda") else (lambda: None)
        sync()
        start = time.perf_counter()
        try:
            return super()._summarise(*args, **kwargs)
        finally:
            sync()
            self.summarise_s = getattr(self, "summarise_s", 0.0) + time.perf_counter() - start


def section_overhead(bench: Bench, module: BidirectionalTransformer, adapter: ModelAdapter, plan: dict[str, Any]) -> None:
    """4. Wall time vs time inside the model forward (``module.run``) and the engine's summaries."""
    name = "4_host_overhead"
    prompt_len, gen, block = plan["prompt"], plan["gen"], plan["block"]
    decoder = make_decoder("fast_dllm", gen, f"decoder.commit.threshold={THRESHOLD}")
    prompts = bench.prompts(max(plan["batches"]), prompt_len)
    timer = {"model_s": 0.0, "calls": 0}
    original = module.run

    def timed_run(*args: Any, **kwargs: Any):
        bench.sync()
        start = time.perf_counter()
        out = original(*args, **kwargs)
        bench.sync()
        timer["model_s"] += time.perf_counter() - start
        timer["calls"] += 1
        return out

    module.run = timed_run  # the adapter calls module.run; an instance attribute shadows the method
    try:
        for batch in plan["batches"]:
            settings = dict(prompt=prompt_len, gen=gen, block=block, threshold=THRESHOLD, batch=batch)
            if bench.over_budget():
                bench.skip(name, "fast_dllm", "over --budget-s", **settings)
                continue
            engine = TimedEngine(adapter=adapter, row_budget=bench.args.row_budget, cache="none")
            requests = requests_for(prompts[:batch], gen)
            splits = []

            def run():
                timer.update(model_s=0.0, calls=0)
                engine.summarise_s = 0.0
                start = time.perf_counter()
                results = decoder.decode(engine, requests, block)
                bench.sync()
                wall = time.perf_counter() - start
                splits.append((wall, timer["model_s"], engine.summarise_s, timer["calls"]))
                return results

            print(f"  [4] fast_dllm b={batch} ...", flush=True)
            walls, results, peak = bench.measure(run)
            splits = splits[1:]  # drop the warm-up
            middle = sorted(splits)[len(splits) // 2]
            wall, model_s, summarise_s, calls = middle
            row = bench.add({"section": name, "label": "fast_dllm", **settings, **summary(walls), **decode_stats(results),
                             "model_s": round(model_s, 4), "summarise_s": round(summarise_s, 4), "forwards": calls,
                             "overhead_fraction": round(1 - model_s / wall, 4),
                             "summary_fraction": round((summarise_s - model_s) / wall, 4),
                             "host_fraction": round(1 - summarise_s / wall, 4),
                             "host_ms_per_step": round(1000 * (wall - summarise_s) / max(1, calls), 3),
                             "peak_mib": peak})
            print(f"      wall {wall:.3f} s, model {model_s:.3f} s, overhead {100 * row['overhead_fraction']:.1f} % "
                  f"(summaries {100 * row['summary_fraction']:.1f} %, host {100 * row['host_fraction']:.1f} %)", flush=True)
    finally:
        module.__dict__.pop("run", None)


def reference_missing_reason() -> str | None:
    if not UPSTREAM.is_dir():
        return f"upstream reference code not found at {UPSTREAM}"
    sys.path.insert(0, str(TESTS))
    try:
        from tiny_checkpoints import upstream_missing_reason
    except Exception as error:  # noqa: BLE001 - e.g. pytest missing
        return f"cannot import tests/tiny_checkpoints.py: {type(error).__name__}: {error}"
    return upstream_missing_reason()


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


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
            lines.append("| " + " | ".join([row.get("label", ""), f"skipped: {row['skipped']}"] + [""] * (len(columns) - 2)) + " |")
            continue
        lines.append("| " + " | ".join(fmt(row.get(key)) for key, _ in columns) + " |")
    return "\n".join(lines)


def report(bench: Bench) -> str:
    rows = bench.rows
    by = lambda prefix: [r for r in rows if r["section"].startswith(prefix)]  # noqa: E731
    parts = []
    sections = [
        ("1", "1. Reference loop vs dlmsearch fast_dllm (tau 0.9)", [("label", "loop"), ("batch", "batch"), ("prompt", "prompt"), ("gen", "gen"), ("block", "block"),
            ("wall_s", "wall s"), ("tokens_per_s", "tokens/s"), ("steps_mean", "steps"), ("tokens_per_step", "tok/step"), ("tokens_equal_reference", "= ref"), ("peak_mib", "peak MiB")]),
        ("2", "2. One engine call: plain round (1 row) vs lookahead round (1 + K rows)", [("cache", "cache"), ("k", "K"), ("rows", "rows"), ("call_s", "s/call"),
            ("ratio_vs_plain", "x plain"), ("token_forwards_per_call", "token-fwd/call"), ("peak_mib", "peak MiB")]),
        ("3", "3. KV cache, fast_dllm tau 0.9", [("label", "cache"), ("batch", "batch"), ("prompt", "prompt"), ("gen", "gen"), ("block", "block"), ("wall_s", "wall s"),
            ("tokens_per_s", "tokens/s"), ("steps_mean", "steps"), ("token_forwards_mean", "token-fwd"), ("ratio_vs_none", "x none"), ("tokens_equal_none", "= none"), ("peak_mib", "peak MiB")]),
        ("4", "4. Host overhead, fast_dllm (no cache)", [("batch", "batch"), ("gen", "gen"), ("wall_s", "wall s"), ("model_s", "model s"), ("forwards", "forwards"),
            ("overhead_fraction", "overhead"), ("summary_fraction", "summaries"), ("host_fraction", "host"), ("host_ms_per_step", "host ms/fwd"), ("peak_mib", "peak MiB")]),
    ]
    for prefix, title, columns in sections:
        chosen = by(prefix)
        if chosen:
            parts.append(f"### {title}\n\n{table(chosen, columns)}")
    memory = [r for r in rows if "peak_mib" in r]
    if memory:
        kind = "CUDA max allocated" if bench.cuda else "CPU peak RSS"
        parts.append(f"### 5. Peak memory ({kind}, MiB)\n\n" + table(
            [{"what": f"{r['section'][2:]}: {r['label']}" + (f" b={r['batch']}" if "batch" in r else "") + (f" cache={r['cache']}" if "cache" in r and "cache=" not in r["label"] else ""),
              "peak_mib": r["peak_mib"]} for r in memory],
            [("what", "setting"), ("peak_mib", "peak MiB")]))
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
    ours = next((r for r in live if r["section"].startswith("1") and r["label"] == "dlmsearch fast_dllm" and r["batch"] == 1), None)
    if ref and ours:
        value = ours["tokens_per_s"] / ref["tokens_per_s"]
        out["dlmsearch / reference tokens/s, batch 1"] = {"value": round(value, 3), "goal": ">= 1.0", "met": value >= 1.0}
    k4 = next((r for r in live if r["section"].startswith("2") and r["k"] == 4 and r["cache"] == "none"), None)
    if k4:
        out["lookahead round K=4 / plain round (no cache)"] = {"value": k4["ratio_vs_plain"], "goal": "<= 1.15", "met": k4["ratio_vs_plain"] <= 1.15}
    dual = [r for r in live if r["section"].startswith("3") and r["cache"] == "dual"]
    if dual:
        first = dual[0]
        out[f"dual / none tokens/s, batch {first['batch']}"] = {"value": first["ratio_vs_none"], "goal": ">= 3", "met": (first["ratio_vs_none"] or 0) >= 3}
    over = [r for r in live if r["section"].startswith("4")]
    if over:
        big = max(over, key=lambda r: r["batch"])
        out[f"host overhead, batch {big['batch']}"] = {"value": big["overhead_fraction"], "goal": "<= 0.05", "met": big["overhead_fraction"] <= 0.05}
    return out


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def machine_info(device: str, dtype: torch.dtype) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": device, "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],  # a busy shared machine makes CPU timings noisy
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=torch.cuda.get_device_name(0), cuda=torch.version.cuda, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    else:
        name = platform.processor()
        try:
            name = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name"))
        except (OSError, StopIteration):
            pass
        info["device_name"] = name
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (auto: cuda if available); bf16 on cuda, fp32 on cpu")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default runs/bench_engine/<size>.json)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting after one warm-up (median reported)")
    parser.add_argument("--quick", action="store_true", help="short generations and small batches (tiny on 2 CPU cores: 2-3 min)")
    parser.add_argument("--compile", action="store_true", help="also run section 1 with module.run wrapped in torch.compile")
    parser.add_argument("--row-budget", type=int, default=64, help="engine rows per forward chunk")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (ignored on cuda)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=0.0, help="skip remaining settings once this many seconds have passed (0: no limit)")
    parser.add_argument("--sections", default="1,2,3,4", help="which sections to run (5, memory, comes with every row)")
    parser.add_argument("--dry-run", action="store_true", help="build the model on the meta device, print its size and the plan, exit")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
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
    print(f"bench_engine: size {args.size} ({params / 1e9:.3f} B parameters, {params * torch.finfo(dtype).bits / 8 / 2**30:.2f} GiB in "
          f"{str(dtype).replace('torch.', '')}), device {device}, repeats {args.repeats}{', quick' if args.quick else ''}", flush=True)
    if args.dry_run:
        print(json.dumps({"config": {k: getattr(meta.config, k) for k in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_length", "rope_theta")},
                          "parameters": params, "plan": plan}, indent=2))
        return 0
    del meta

    out = args.out or ROOT / "runs" / "bench_engine" / f"{args.size}.json"
    bench = Bench(args, device, dtype, out)
    bench.doc.update(machine=machine_info(device, dtype), args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                     plan=plan, model={"size": args.size, "parameters": params, **SIZES[args.size], "vocab_size": VOCAB, "mask_id": MASK_ID,
                                       "init": {"std": INIT_STD, "qk_component_std": QK_COMPONENT_STD, "logit_std": LOGIT_STD}})
    start = time.perf_counter()
    module = build_model(args.size, device, dtype, seed=args.seed)
    bench.sync()
    bench.doc["model"]["build_s"] = round(time.perf_counter() - start, 2)
    bench.doc["model"]["confidences"] = confidence_profile(module, device)
    print(f"model built in {bench.doc['model']['build_s']} s; masked-position confidences: {bench.doc['model']['confidences']}", flush=True)
    adapter = ModelAdapter(module=module, mask_id=MASK_ID, vocab_size=VOCAB, device=device, dtype=str(dtype).replace("torch.", ""), max_length=4096)
    bench.save()

    steps = [("1", "1. reference loop vs dlmsearch fast_dllm", lambda: section_reference(bench, module, adapter, plan["reference"])),
             ("2", "2. plain round vs lookahead round", lambda: section_lookahead(bench, adapter, plan["lookahead"])),
             ("3", "3. cache none / prefix / dual", lambda: section_cache(bench, adapter, plan["cache"])),
             ("4", "4. host overhead", lambda: section_overhead(bench, module, adapter, plan["overhead"]))]
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
