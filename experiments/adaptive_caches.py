"""The adaptive KV caches side by side with Fast-dLLM's and none, under fast_dllm and adalook.

Two parts, each writing its rows as it goes (JSON lines; a rerun skips rows already there):

* ``countdown``: the shipped Countdown model (``model=countdown task=countdown``, gen 16, block 8)
  on the ``small``, ``medium`` and ``d1`` tiers, through the normal runner: accuracy with its
  Wilson interval, the paired sign test against ``cache=none`` (same decoder, same problems),
  steps, token-forwards, wall seconds;
* ``random``: a tiny random LLaDA and a Dream-shaped one (GQA, q/k/v bias, shifted logits) at gen
  256 / block 32, 4 prompts of 48-96 tokens decoded in one batch: token-forwards, decode seconds,
  tokens/s, the share of generated tokens equal to the uncached decode's (accuracy means nothing on
  random weights), the columns each policy recomputed per layer, and the most its store held.

* ``block``: the block-diffusion Countdown model under its exact block cache: how much of its
  token-forwards are columns a policy could still skip (:func:`block_part`).

Then ``adaptive_caches.md`` (the tables) and ``accuracy_vs_token_forwards.png``, all in ``--out``:
by default ``runs/adaptive_caches/all/`` (``runs/adaptive_caches/limit<N>/`` with ``--limit N``), with
``--write-committed`` the committed ``experiments/results/adaptive_caches/``. Rows already in
``--out`` for the same ``--limit`` are not measured again.

    python experiments/adaptive_caches.py --write-committed   # every part, then the committed tables and figure
    python experiments/adaptive_caches.py --limit 64          # a quick look: 64 problems per tier (countdown, block)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import attrs
import torch
from bench.random_model import MASK_ID, PROMPT_ID_LIMIT, VOCAB, initialise, model_config
from decoder_table import measure, paired
from outputs import RUNS, add_flag, check

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.transformer import BidirectionalTransformer
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.rollout import RolloutEngine

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_OUT = ROOT / "experiments" / "results" / "adaptive_caches"
CACHES = ["none", "prefix", "dual", "dllm_cache", "d2cache", "elastic", "dkv"]
DECODERS = ["fast_dllm", "adalook"]
TIERS = ["small", "medium", "d1"]
BASE = ["model=countdown", "task=countdown", "model.device=cpu"]
GEN, BLOCK, PROMPTS = 256, 32, [48, 64, 80, 96]


def done_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def append(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k not in ("solved_ids", "ids", "tokens")}), flush=True)


def same_limit(rows: list[dict], limit: int | None) -> list[dict]:
    """The rows measured with ``limit`` problems per tier (rows without the key were measured on every problem)."""
    return [r for r in rows if r.get("limit") == limit]


def countdown(limit: int | None, runs: Path, out: Path) -> None:
    path = out / "countdown.jsonl"
    have = {(r["tier"], r["label"]) for r in same_limit(done_rows(path), limit)}
    for tier in TIERS:
        for decoder in DECODERS:
            for cache in CACHES:
                label = f"{decoder}/{cache}"
                if (tier, label) in have:
                    continue
                row = measure(runs / tier / decoder / cache, tier, label, decoder, [f"cache={cache}"], BASE, limit, 256)
                append(path, {**row, "decoder": decoder, "cache": cache, **({"limit": limit} if limit else {})})


def random_adapter(family: str) -> ModelAdapter:
    """The tiny random model (experiments/bench/random_model.py), LLaDA- or Dream-shaped."""
    config = model_config("tiny")
    if family == "dream":
        config = attrs.evolve(config, num_kv_heads=2, qkv_bias=True, rope_in_float32=False, rope_theta=1e6)
    model = BidirectionalTransformer(config)
    initialise(model, seed=0)
    return ModelAdapter(module=model.eval(), mask_id=MASK_ID, vocab_size=VOCAB, shift_logits=family == "dream")


def random_part(out: Path) -> None:
    path = out / "random.jsonl"
    have = {(r["family"], r["decoder"], r["cache"]) for r in done_rows(path)}
    generator = torch.Generator().manual_seed(0)
    requests = [
        DecodeRequest(
            uid=i,
            prompt=torch.randint(0, PROMPT_ID_LIMIT, (n,), generator=generator),
            generation=torch.full((GEN,), MASK_ID),
        )
        for i, n in enumerate(PROMPTS)
    ]
    for family in ("llada", "dream"):
        adapter = random_adapter(family)
        for decoder_name in DECODERS:
            if all((family, decoder_name, cache) in have for cache in CACHES):
                continue
            decoder = build(compose([f"+decoder={decoder_name}", "decoding=text", f"task.gen_length={GEN}"]), "decoder")
            reference = next(
                (
                    torch.tensor(r["tokens"])
                    for r in done_rows(path)
                    if (r["family"], r["decoder"], r["cache"]) == (family, decoder_name, "none") and "tokens" in r
                ),
                None,
            )
            for cache in CACHES:
                if (family, decoder_name, cache) in have and (cache != "none" or reference is not None):
                    continue
                policy = (
                    build(compose([f"model={family}", "model.path=unused", f"cache={cache}"]), "cache")
                    if cache not in ("none", "prefix", "dual")
                    else cache
                )
                engine = RolloutEngine(adapter=adapter, cache=policy, row_budget=64)
                started = time.perf_counter()
                results = decoder.decode(engine, requests, BLOCK)
                seconds = time.perf_counter() - started
                tokens = torch.stack([r.tokens for r in results])
                if cache == "none":
                    reference = tokens
                    if (family, decoder_name, cache) in have:  # measured before its tokens were kept
                        rewrite_none(path, family, decoder_name, tokens)
                        continue
                cost = engine.layerwise_cost()
                append(
                    path,
                    {
                        "family": family,
                        "decoder": decoder_name,
                        "cache": cache,
                        "decode_seconds": seconds,
                        "tokens_per_second": tokens.numel() / seconds,
                        "mean_steps": sum(r.steps for r in results) / len(results),
                        "mean_token_forwards": sum(r.token_forwards for r in results) / len(results),
                        "agreement": float((tokens == reference).float().mean()),
                        "recomputed_per_layer": cost.get("layer_recompute_share"),
                        "store_peak_mib": cost.get("cache_store_peak_mb", 0.0),
                        **({"tokens": tokens.tolist()} if cache == "none" else {}),
                    },
                )


def rewrite_none(path: Path, family: str, decoder: str, tokens: torch.Tensor) -> None:
    """Keep the uncached decode's tokens in its row, so that a resumed run need not decode it again."""
    rows = [
        {**r, "tokens": tokens.tolist()} if (r["family"], r["decoder"], r["cache"]) == (family, decoder, "none") else r
        for r in done_rows(path)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def block_part(limit: int | None, out: Path) -> None:
    """The block-diffusion Countdown model under its exact block cache: what is left for a policy.

    The finished blocks' keys and values are exact (they never attend to later blocks), so the
    four policies' savings on stale columns do not exist there; what remains is the block being
    decoded, recomputed whole at each of its steps. For the decoders that take one forward per
    step (each committing at least one token), the steps of a block are the distinct calls that
    committed in it; of the block columns those steps computed, ``committed`` were already decided
    (the most Elastic-Cache, dLLM-Cache or d2Cache could skip) and ``settled`` were decided before
    the previous step (the most dKV-Cache's delayed caching could skip); both also as shares of
    all the token-forwards (the prompt's and the finished blocks' writes included).
    """
    from dlmsearch.run import Decoding

    path = out / "block.jsonl"
    have = {(r["tier"], r["decoder"]) for r in same_limit(done_rows(path), limit)}
    for tier in TIERS:
        for decoder_name in ("sdar_greedy", "sdar"):  # fast_dllm decodes this model as sdar_greedy does
            if (tier, decoder_name) in have:
                continue
            cfg = compose(
                [
                    "model=countdown_block",
                    "task=countdown",
                    f"task.tier={tier}",
                    "cache=block",
                    "model.device=cpu",
                    f"+decoder={decoder_name}",
                    f"task.limit={limit or 'null'}",
                ]
            )
            adapter = build(cfg, "model")
            engine, task = build(cfg, "engine", adapter=adapter), build(cfg, "task")
            decoding = Decoding(build(cfg, "decoder"), engine, task, None, None, None)
            items = task.items()
            decoding.prepare(items)
            block = int(cfg.task.block_length)
            computed = committed = settled = forwards = 0
            for start in range(0, len(items), 64):
                chunk = items[start : start + 64]
                for item, result in zip(
                    chunk, decoding.results(decoding.decoder, chunk, list(range(start, start + len(chunk))))
                ):
                    calls = result.commit_call[: len(item.generation)]
                    blocks = (len(item.prompt) + torch.arange(len(calls))) // block
                    for b in blocks.unique():
                        own = calls[blocks == b]
                        steps = own.unique()
                        computed += len(own) * len(steps)
                        committed += int((own[None, :] < steps[:, None]).sum())
                        settled += int((own[None, :] < torch.cat([steps[:1], steps[:-1]])[:, None]).sum())
                    forwards += result.token_forwards
            append(
                path,
                {
                    "tier": tier,
                    "decoder": decoder_name,
                    "problems": len(items),
                    "mean_token_forwards": forwards / len(items),
                    "mean_block_columns": computed / len(items),
                    "already_committed": committed / computed,
                    "committed_before_previous_step": settled / computed,
                    "committed_of_token_forwards": committed / forwards,
                    "settled_of_token_forwards": settled / forwards,
                    **({"limit": limit} if limit else {}),
                },
            )


def _policy_settings(cache: str, family: str) -> str:
    if cache in ("none", "prefix", "dual"):
        return "-"
    policy = build(compose([f"model={family}", "model.path=unused", f"cache={cache}"]), "cache")
    return ", ".join(f"{f.name}={getattr(policy, f.name)}" for f in attrs.fields(type(policy)))


def tables(out: Path, limit: int | None) -> None:
    lines = [
        "# Adaptive KV caches side by side",
        "",
        "Measured by `python experiments/adaptive_caches.py` (CPU, one process; wall times swing by about 30 % between runs).",
        "",
    ]
    rows = same_limit(done_rows(out / "countdown.jsonl"), limit)
    if rows:
        lines += [
            f"## The shipped Countdown model (gen 16, block 8; {limit or 256} problems per tier)",
            "",
            "Paired: problems solved only with this cache / only with `cache=none` (same decoder), exact sign test.",
            "",
            "| tier | decoder | cache | solved | 95 % interval | only this / only none | sign p | mean steps | mean token-forwards | wall s |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in rows:
            base = next(
                r for r in rows if r["tier"] == row["tier"] and r["decoder"] == row["decoder"] and r["cache"] == "none"
            )
            only, only_base, p = paired(row, base)
            lines.append(
                f"| {row['tier']} | {row['decoder']} | {row['cache']} | {100 * row['accuracy']:.1f} % | {100 * row['wilson_low']:.1f}-{100 * row['wilson_high']:.1f} "
                f"| {only} / {only_base} | {p:.3g} | {row['mean_steps']:.1f} | {row['mean_token_forwards']:.0f} | {row['wall_seconds']:.0f} |"
            )
    rows = done_rows(out / "random.jsonl")
    if rows:
        lines += [
            "",
            f"## Tiny random models (4 prompts of {PROMPTS[0]}-{PROMPTS[-1]} tokens, gen {GEN}, block {BLOCK})",
            "",
            (
                "Agreement: the share of generated tokens equal to the uncached decode's. Per layer: the share of the "
                "forwarded canvases' columns each layer recomputed. Store: the most the policy's store held (MiB, float32)."
            ),
            "",
            "| model | decoder | cache | settings | agreement | mean steps | mean token-forwards | decode s | tokens/s | per layer | store MiB |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|",
        ]
        for row in rows:
            per_layer = (
                "-"
                if row["recomputed_per_layer"] is None
                else " ".join(f"{v:.2f}" for v in row["recomputed_per_layer"])
            )
            lines.append(
                f"| {row['family']} | {row['decoder']} | {row['cache']} | {_policy_settings(row['cache'], row['family'])} | {100 * row['agreement']:.1f} % "
                f"| {row['mean_steps']:.1f} | {row['mean_token_forwards']:.0f} | {row['decode_seconds']:.1f} | {row['tokens_per_second']:.0f} | {per_layer} | {row['store_peak_mib']:.1f} |"
            )
    rows = same_limit(done_rows(out / "block.jsonl"), limit)
    if rows:
        lines += [
            "",
            "## The block-diffusion Countdown model under its exact block cache (`model=countdown_block cache=block`, blocks of 4)",
            "",
            (
                "Block columns: the decoded block's columns its steps computed (per problem). Committed: the share of them already decided "
                "(the most a within-block policy could skip); before the previous step: dKV-Cache's delayed share. Both also as shares of all token-forwards."
            ),
            "",
            "| tier | decoder | mean token-forwards | block columns | committed | before the previous step | committed / token-forwards | before previous / token-forwards |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in rows:
            lines.append(
                f"| {row['tier']} | {row['decoder']} | {row['mean_token_forwards']:.1f} | {row['mean_block_columns']:.1f} | {100 * row['already_committed']:.1f} % "
                f"| {100 * row['committed_before_previous_step']:.1f} % | {100 * row['committed_of_token_forwards']:.1f} % | {100 * row['settled_of_token_forwards']:.1f} % |"
            )
    (out / "adaptive_caches.md").write_text("\n".join(lines) + "\n")
    plot(same_limit(done_rows(out / "countdown.jsonl"), limit), out / "accuracy_vs_token_forwards.png")
    print(f"wrote {out / 'adaptive_caches.md'}")


def plot(rows: list[dict], path: Path) -> None:
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(TIERS), figsize=(6 * len(TIERS), 4.8), squeeze=False)
    markers = {"fast_dllm": "o", "adalook": "s"}
    colours = dict(zip(CACHES, plt.get_cmap("tab10").colors))
    for axis, tier in zip(axes[0], TIERS):
        for row in (r for r in rows if r["tier"] == tier):
            x, y = row["mean_token_forwards"], 100 * row["accuracy"]
            axis.errorbar(
                x,
                y,
                yerr=[[y - 100 * row["wilson_low"]], [100 * row["wilson_high"] - y]],
                fmt=markers[row["decoder"]],
                color=colours[row["cache"]],
                label=f"{row['decoder']}/{row['cache']}",
                capsize=2,
            )
        axis.set_xlabel("mean token-forwards per problem")
        axis.set_ylabel("solved % (Wilson 95 %)")
        axis.set_title(f"Countdown {tier}")
        axis.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=7, fontsize=8)
    figure.suptitle("Accuracy against token-forwards: caches under fast_dllm (circles) and adalook (squares)")
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with ``out`` and ``runs`` resolved: a quick look never reads or writes the committed rows."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--parts", nargs="+", default=["countdown", "random", "block"], choices=["countdown", "random", "block"]
    )
    parser.add_argument("--limit", type=int, default=None, help="Countdown problems per tier (default: all 256)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the rows, tables and figure (default runs/adaptive_caches/all/, or .../limit<N>/ with --limit N)",
    )
    parser.add_argument(
        "--runs",
        type=Path,
        default=None,
        help="the runner's output directories (resumable; default runs/adaptive_caches/<all or limit<N>>/runs)",
    )
    add_flag(parser, "rows, tables and figure in experiments/results/adaptive_caches/")
    args = parser.parse_args(argv)
    check(parser, args, args.out, args.runs)
    scratch = RUNS / "adaptive_caches" / (f"limit{args.limit}" if args.limit else "all")
    if args.out is None:
        args.out = COMMITTED_OUT if args.write_committed else scratch
    if args.runs is None:
        args.runs = scratch / "runs"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if "countdown" in args.parts:
        countdown(args.limit, args.runs, args.out)
    if "random" in args.parts:
        random_part(args.out)
    if "block" in args.parts:
        block_part(args.limit, args.out)
    tables(args.out, args.limit)


if __name__ == "__main__":
    main()
