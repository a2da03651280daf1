"""The block-diffusion Countdown model beside the LLaDA-format one: presets on the held-out tiers,
paired with each model's reference rule, and what the exact block cache does to search.

Both models answer the same problems with the same tokenizer and prompt (``model=countdown_block``
is an SDAR checkpoint decoded with ``cache=block``; ``model=countdown`` a LLaDA checkpoint, no
cache). Every row goes through the normal runner into ``--runs/<model>/<section>/<tier>/<label>``
(an interrupted card resumes), has a Wilson 95 % interval, and is paired (exact sign test) with
its model's reference rule on the same problems: ``sdar`` (SDAR's ``block_diffusion_generate``) for
the block model, ``llada`` (LLaDA's ``generate``) for the LLaDA-format one; the block model's
``sdar`` is also paired with the LLaDA-format model's ``llada`` (the quality bar). A preset a model
cannot run is one row saying why. The cache section decodes the block model with ``cache=none``
(full block-causal forwards), ``cache=block`` (the reference's separate writes) and
``cache=block cache.fuse_write=true``: token-forwards per row-forward is what one lookahead row costs.

The card, its rows and figure go to ``--out`` (default ``runs/block_model_card/``; with
``--write-committed``, the committed ``experiments/results/block/``).

    python experiments/block_model_card.py --write-committed                # the committed card (results/block/)
    python experiments/block_model_card.py --limit 32 --runs /tmp/bc --out /tmp/bc/card   # a quick look
    python experiments/block_model_card.py --block-model DIR                # another SDAR checkpoint (e.g. a run's model/)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from decoder_table import measure, paired, write_card
from outputs import RUNS, add_flag, check, resolve

from dlmsearch.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "block"
MODELS = {
    "block": ["model=countdown_block", "task=countdown", "model.device=cpu", "cache=block"],
    "llada": ["model=countdown", "task=countdown", "model.device=cpu"],
}
REFERENCE = {"block": "sdar", "llada": "llada"}
EVERY_TIER = ["sdar", "sdar_greedy", "llada2", "llada", "fast_dllm", "adalook", "entropy_bounded"]
SMALL_ONLY = [
    "sdar_static",
    "sdar_sequential",
    "llada21",
    "ete",
    "fixed_depth",
    "eb_sampler",
    "pc_sampler",
    "klass",
    "rcr",
    "remdm",
    "saber",
    "wino",
    "dream",
    "best_of_n",
    "beam",
    "smc",
]
NEEDS_FULL_ATTENTION = {"klass", "saber"}  # they read every position's distribution: cache=none on the block model
CACHE_ROWS = [
    (preset, label, overrides)
    for preset in ("sdar_greedy", "fast_dllm", "fixed_depth")
    for label, overrides in (
        ("none", ["cache=none"]),
        ("block", ["cache=block"]),
        ("block_fused", ["cache=block", "cache.fuse_write=true"]),
    )
]


def row(
    runs: Path,
    model: str,
    section: str,
    tier: str,
    label: str,
    preset: str,
    overrides: list[str],
    args: argparse.Namespace,
) -> dict:
    """One run (resumed if it already ran), or a row saying why the model cannot run the preset."""
    base = MODELS[model] + ([f"model.path={args.block_model}"] if model == "block" and args.block_model else [])
    if model == "block" and preset in NEEDS_FULL_ATTENTION and not any(o.startswith("cache=") for o in overrides):
        overrides = [*overrides, "cache=none"]
    started = time.monotonic()
    try:
        found = measure(
            runs / model / section / tier / label, tier, label, preset, overrides, base, args.limit, args.batch_size
        )
    except (ConfigError, ValueError) as error:
        return {
            "model": model,
            "section": section,
            "tier": tier,
            "label": label,
            "preset": preset,
            "overrides": overrides,
            "refused": str(error).splitlines()[-1],
        }
    return {**found, "model": model, "section": section, "decode_seconds": round(time.monotonic() - started, 1)}


def line(r: dict, reference: dict | None) -> str:
    if "refused" in r:
        return f"| {r['model']} | {r['tier']} | {r['label']} | refused: {r['refused']} |||||||||"
    wins, losses, p = paired(r, reference) if reference and reference is not r else (0, 0, 1.0)
    return (
        f"| {r['model']} | {r['tier']} | {r['label']} | {' '.join(r['overrides']) or '-'} | {100 * r['accuracy']:.1f} % | "
        f"{100 * r['wilson_low']:.1f}-{100 * r['wilson_high']:.1f} | {r['mean_steps']:.1f} | {r['mean_row_forwards']:.1f} | "
        f"{r['mean_token_forwards']:.0f} | {r['mean_token_forwards'] / r['mean_row_forwards']:.1f} | {wins} / {losses} | {p:.3g} | {r['wall_seconds']:.1f} |"
    )


HEADER = [
    "| model | tier | decoder | overrides | solved | 95 % interval | mean steps | mean row-forwards | mean token-forwards | token-forwards per row | only this / only reference | sign p | decode s |",
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def plot(rows: list[dict], tiers: list[str], path: Path) -> None:
    """Accuracy against mean token-forwards, one panel per tier, both models."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(tiers), figsize=(6 * len(tiers), 4.8), squeeze=False)
    for axis, tier in zip(axes[0], tiers):
        for model, marker in (("block", "o"), ("llada", "s")):
            points = [
                r
                for r in rows
                if r["tier"] == tier and r["model"] == model and "refused" not in r and r["section"] == "presets"
            ]
            axis.scatter(
                [r["mean_token_forwards"] for r in points],
                [100 * r["accuracy"] for r in points],
                marker=marker,
                label=f"{model} model",
            )
            for r in points:
                axis.annotate(
                    r["label"],
                    (r["mean_token_forwards"], 100 * r["accuracy"]),
                    fontsize=7,
                    xytext=(3, 2),
                    textcoords="offset points",
                )
        axis.set_xscale("log")
        axis.set_xlabel("mean token-forwards per problem (log)")
        axis.set_ylabel("solved %")
        axis.set_title(f"Countdown {tier}")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def model_card(directory: Path, table: list[str]) -> str:
    """The shipped block model's README: what it is, how it was trained (``training.json``), what it solves."""
    training = json.loads((directory / "training.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    machine = training["machine"]
    params = sum(
        t.numel()
        for t in __import__("safetensors.torch", fromlist=["load_file"])
        .load_file(str(directory / "model.safetensors"))
        .values()
    )
    lines = [
        "# Block-diffusion Countdown model shipped with dlmsearch",
        "",
        (
            f"A {params / 1e6:.2f} M-parameter block-diffusion model in SDAR's checkpoint format (`model_type: sdar`, Qwen3's parameter names: "
            f"hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, {config['num_attention_heads']} heads, {config['num_key_value_heads']} key/value heads, "
            f"head_dim {config['head_dim']}, q/k RMSNorm, SwiGLU MLP {config['intermediate_size']}, RoPE theta {config['rope_theta']:g}, untied head), attending "
            f"block-causally in blocks of {config['block_size']} (`block_size` in config.json). The tokenizer, prompt, answers and tiers are `model=countdown`'s "
            "(the LLaDA-format model's). It loads as any SDAR checkpoint: `model=sdar model.path=DIR`, or `model=countdown_block`, which is that plus the prompt "
            "it was trained on; decode it with `cache=block` (exact)."
        ),
        "",
        "## Training",
        "",
        (
            "- Data and curriculum: `model=countdown`'s (problems drawn on the fly, numbers 1-10 growing to 1-20, then 15 % from 1-100; no shipped tier's "
            "number triple is ever drawn); the rows are the prompt, the worked answer, `<|eot_id|>`, then `<|endoftext|>` to 16 response tokens."
        ),
        (
            "- Objective: block-diffusion SFT. Blocks of 4 by absolute position from the first prompt token (SDAR's canvas); each row is forwarded once "
            "as `[clean | noisy]`, every noisy block attending to itself and to the clean blocks before it (what decoding shows it); each response block "
            "draws its own mask rate t ~ U(0, 1); the loss is the masked tokens' cross-entropy weighted by 1/t over the response length; prompt tokens "
            "are never masked (`experiments/train_countdown_block.py`, tested in `tests/test_block_training.py`)."
        ),
        "- AdamW (lr 2e-3, betas 0.9/0.98, weight decay 0.01), batch 128, 200 warm-up steps, cosine decay to 1e-4 over the training budget.",
        (
            f"- {training['steps']} steps in {training['train_seconds'] / 60:.1f} minutes of training on {machine['cores']} CPU cores ({machine['cpu']}, "
            f"torch {machine['torch']}); loss (mean of the last 100 steps) {training['final_loss_last_100_steps']}."
        ),
        (
            f"- Command: `{training['command']}`, then `python experiments/ship_model.py --train-dir runs/countdown_block_train "
            "--dest dlmsearch/data/countdown_block_model --curve docs/countdown_block_learning_curve.png`."
        ),
        "",
        "Held-out masked cross-entropy at each checkpoint (128 problems of the `validation` tier, never trained on; mask rates 0.1, 0.3, ..., 0.9):",
        "",
        "| step | training minutes | numbers drawn up to | held-out masked CE |",
        "|---:|---:|---:|---:|",
        *[
            f"| {e['step']} | {e['train_seconds'] / 60:.1f} | {e['numbers_up_to']} | {e['held_out_masked_ce']:.4f} |"
            for e in training["checkpoint_evals"]
        ],
        "",
        "![learning curve](../../../docs/countdown_block_learning_curve.png)",
        "",
        "## Decoders on the held-out tiers, beside the LLaDA-format model",
        "",
        *table,
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=ROOT / "experiments" / "runs" / "block_card")
    parser.add_argument(
        "--out", type=Path, default=None, help="the card, rows and figure (default runs/block_model_card/)"
    )
    parser.add_argument(
        "--block-model", type=Path, default=None, help="an SDAR checkpoint directory instead of the shipped one"
    )
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiers", nargs="+", default=["small", "medium", "d1"])
    parser.add_argument(
        "--model-card", type=Path, default=None, help="also write the model's README.md into this (shipped) directory"
    )
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(MODELS),
        choices=list(MODELS),
        help="decode only these (the runs resume; the card needs both)",
    )
    add_flag(parser, "card in experiments/results/block/ (and a --model-card in dlmsearch/data/)")
    args = parser.parse_args(argv)
    check(parser, args, args.model_card and args.model_card / "README.md")
    args.out = resolve(parser, args, args.out, OUT, RUNS / "block_model_card")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows: list[dict] = []
    for model in args.models:
        for tier in args.tiers:
            for preset in EVERY_TIER + (SMALL_ONLY if tier == args.tiers[0] else []):
                rows.append(row(args.runs, model, "presets", tier, preset, preset, [], args))
    for preset, label, overrides in CACHE_ROWS if "block" in args.models else []:
        rows.append(row(args.runs, "block", "cache", args.tiers[0], f"{preset}_{label}", preset, overrides, args))
    references = {
        (r["model"], r["tier"]): r
        for r in rows
        if r["section"] == "presets" and r["label"] == REFERENCE[r["model"]] and "refused" not in r
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    command = "python experiments/block_model_card.py" + (f" --limit {args.limit}" if args.limit else "")
    lines = [
        (
            f"Measured by `{command}` (batch {args.batch_size}, {args.threads} CPU threads); paired columns: against the model's reference rule "
            f"(block: `sdar`, llada: `llada`) on the same problems."
        ),
        "",
        *HEADER,
    ]
    lines += [line(r, references.get((r["model"], r["tier"]))) for r in rows if r["section"] == "presets"]
    lines += [
        "",
        "The bar: the block model's `sdar` against the LLaDA-format model's `llada`, paired on the same problems.",
        "",
        "| tier | block sdar | llada-format llada | only sdar / only llada | sign p | token-forwards, sdar / llada |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for tier in args.tiers:
        a, b = references.get(("block", tier)), references.get(("llada", tier))
        if a and b:
            wins, losses, p = paired(a, b)
            lines.append(
                f"| {tier} | {100 * a['accuracy']:.1f} % | {100 * b['accuracy']:.1f} % | {wins} / {losses} | {p:.3g} | "
                f"{a['mean_token_forwards']:.0f} / {b['mean_token_forwards']:.0f} |"
            )
    lines += [
        "",
        (
            f"What the exact cache does ({args.tiers[0]} tier, block model): the same decoders with full block-causal forwards, the reference-style "
            "block cache, and the fused writes."
        ),
        "",
        *HEADER,
    ]
    lines += [line(r, None) for r in rows if r["section"] == "cache"]
    (args.out / "card.md").write_text("\n".join(lines) + "\n")
    if args.model_card:
        write_card(args.model_card / "README.md", model_card(args.model_card, lines))
    plot(rows, args.tiers, args.out / "accuracy_vs_token_forwards.png")
    print("\n".join(lines))
    print(f"wrote {args.out}/{{rows.json,card.md,accuracy_vs_token_forwards.png}}")


if __name__ == "__main__":
    main()
