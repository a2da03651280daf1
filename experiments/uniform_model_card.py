"""The uniform-noise (DiffusionGemma-format) Countdown model beside the LLaDA-format and block models.

``model=countdown_uniform`` answers the same problems with the same tokenizer and prompt as
``model=countdown`` (LLaDA format) and ``model=countdown_block`` (SDAR format). Every row goes
through the normal runner into ``--runs/<section>/<tier>/<label>`` (an interrupted card resumes),
has a Wilson 95 % interval and is paired (exact sign test) on the same problems with the
uniform model's reference rule (``diffusion_gemma``: transformers' own loop and defaults) and
with the LLaDA-format model's ``llada`` (the issue's bar: within 10 points on the small tier).
The other two models' rows are read from the committed block card
(``experiments/results/block/rows.json``: ``llada`` and ``sdar`` on each tier, the same 256
problems). Presets that have no meaning on uniform noise are rows saying why.

    python experiments/uniform_model_card.py --write-committed --model-card dlmsearch/data/countdown_uniform_model
    python experiments/uniform_model_card.py --limit 32 --runs /tmp/uc --out /tmp/uc/card    # a quick look
    python experiments/uniform_model_card.py --model DIR        # another DiffusionGemma checkpoint (e.g. a run's model/)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from block_model_card import HEADER, line
from decoder_table import measure, paired, write_card
from outputs import RUNS, add_flag, check, resolve

from dlmsearch.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "uniform"
OTHERS = ROOT / "experiments" / "results" / "block" / "rows.json"
BASE = ["model=countdown_uniform", "task=countdown", "model.device=cpu"]
UNIFORM_WIDTH = [
    "decoder/commit=uniform_noise",
    "decoder/population/score=log_probability",
    "decoder.sampling.confidence=sampling",
    "decoder.stop_at_eos=true",
]
LOOKAHEAD = [*UNIFORM_WIDTH[:1], *UNIFORM_WIDTH[2:], "decoder.scorer.threshold=0.9"]
EVERY_TIER = [
    ("diffusion_gemma", "diffusion_gemma", []),
    ("best_of_n", "best_of_n", UNIFORM_WIDTH),
    ("smc", "smc", UNIFORM_WIDTH),
    ("beam", "beam", UNIFORM_WIDTH),
    ("verified_best_of_n", "verified_best_of_n", UNIFORM_WIDTH),
    ("ete", "ete", LOOKAHEAD),
    ("adalook", "adalook", LOOKAHEAD),
    ("fixed_depth", "fixed_depth", LOOKAHEAD),
]
SMALL_ONLY = [
    ("no_stopping", "diffusion_gemma", ["decoder.commit.stopping=false"]),
    ("llada", "llada", []),
]


def row(runs: Path, tier: str, label: str, preset: str, overrides: list[str], args: argparse.Namespace) -> dict:
    """One run (resumed if it already ran), or a row saying why the model cannot run the preset."""
    base = BASE + ([f"model.path={args.model}"] if args.model else [])
    started = time.monotonic()
    try:
        found = measure(
            runs / "presets" / tier / label, tier, label, preset, overrides, base, args.limit, args.batch_size
        )
    except (ConfigError, ValueError) as error:
        refused = str(error).splitlines()[-1]
        return {
            "model": "uniform",
            "section": "presets",
            "tier": tier,
            "label": label,
            "preset": preset,
            "overrides": overrides,
            "refused": refused,
        }
    return {**found, "model": "uniform", "section": "presets", "decode_seconds": round(time.monotonic() - started, 1)}


def others(tiers: list[str]) -> dict[tuple[str, str], dict]:
    """The LLaDA-format model's ``llada`` and the block model's ``sdar`` per tier, from the committed block card."""
    rows = json.loads(OTHERS.read_text())
    wanted = {("llada", "llada"), ("block", "sdar")}
    return {
        (r["model"], r["tier"]): r
        for r in rows
        if r["section"] == "presets"
        and (r["model"], r["label"]) in wanted
        and r["tier"] in tiers
        and "refused" not in r
    }


def plot(rows: list[dict], bars: dict, tiers: list[str], path: Path) -> None:
    """Accuracy against mean token-forwards, one panel per tier: the uniform model's rows and the other two models' reference rules."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(tiers), figsize=(6 * len(tiers), 4.8), squeeze=False)
    for axis, tier in zip(axes[0], tiers):
        points = [r for r in rows if r["tier"] == tier and "refused" not in r]
        axis.scatter(
            [r["mean_token_forwards"] for r in points],
            [100 * r["accuracy"] for r in points],
            marker="^",
            label="uniform model",
        )
        for r in points:
            axis.annotate(
                r["label"],
                (r["mean_token_forwards"], 100 * r["accuracy"]),
                fontsize=7,
                xytext=(3, 2),
                textcoords="offset points",
            )
        for (model, bar_tier), r in bars.items():
            if bar_tier == tier:
                marker = "s" if model == "llada" else "o"
                axis.scatter(
                    [r["mean_token_forwards"]],
                    [100 * r["accuracy"]],
                    marker=marker,
                    label=f"{model} model, {r['label']}",
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
    """The shipped uniform-noise model's README: what it is, how it was trained (``training.json``), what it solves."""
    from safetensors.torch import load_file

    training = json.loads((directory / "training.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    text = config["text_config"]
    machine = training["machine"]
    params = sum(t.numel() for t in load_file(str(directory / "model.safetensors")).values())
    lines = [
        "# Uniform-noise Countdown model shipped with dlmsearch",
        "",
        (
            f"A {params / 1e6:.2f} M-parameter DiffusionGemma checkpoint (`model_type: diffusion_gemma`, transformers' "
            f"`DiffusionGemmaForBlockDiffusion`: hidden {text['hidden_size']}, {text['num_hidden_layers']} layers "
            f"({', '.join(text['layer_types'])}; sliding window {text['sliding_window']}), {text.get('num_experts') or 0} experts "
            f"top-{text.get('top_k_experts') or 0}, canvas {config['canvas_length']}, self-conditioning). The tokenizer, prompt, answers and tiers "
            "are `model=countdown`'s. It loads as any DiffusionGemma checkpoint: `model=diffusion_gemma model.path=DIR`, or "
            "`model=countdown_uniform`; decode it with `+decoder=diffusion_gemma` (its `generation_config.json` holds transformers' defaults), "
            "or with transformers' own `generate`."
        ),
        "",
        "## Training",
        "",
        (
            "- Data and curriculum: `model=countdown`'s (problems drawn on the fly, numbers 1-10 growing to 1-20, then 15 % from 1-100; no shipped "
            "tier's number triple is ever drawn); the answer is one canvas of 16 tokens (the worked answer, `<|eot_id|>`, `<|endoftext|>` to the end)."
        ),
        (
            "- Objective: the standard uniform-noise (D3PM-uniform / MDLM-style) denoising objective as DiffusionGemma's decoder is used: per row a noise "
            "level t ~ U(0, 1); each canvas position is replaced, with probability t, by an id drawn uniformly from the vocabulary; the loss is the "
            "cross-entropy of the clean token at all 16 positions (replaced or not) given the encoder's cache of the prompt. Self-conditioning as "
            "Analog Bits trains it: for half of the rows a first pass without it gives logits that, detached, are the second pass's "
            "self-conditioning input; the loss is the second pass's (`experiments/train_countdown_uniform.py`, `tests/test_uniform_training.py`). "
            "Noted: training feeds raw logits as the self-conditioning input, while generation feeds the tempered ones."
        ),
        "- AdamW (lr 2e-3, weight decay 0.01), batch 128, 200 warm-up steps, cosine decay to 1e-4 over the training budget.",
        (
            f"- {training['steps']} steps in {training['train_seconds'] / 60:.1f} minutes of training (one CPU thread of {machine['cores']} cores, "
            f"{machine['cpu']}, torch {machine['torch']}); loss (mean of the last 100 steps) {training['final_loss_last_100_steps']}."
        ),
        f"- Command: `{training['command']}`.",
        "",
        (
            "At each checkpoint: held-out cross-entropy at fixed noise levels (128 problems of the `validation` tier, never trained on) "
            "and transformers' `generate` on 64 validation problems:"
        ),
        "",
        "| step | training minutes | numbers drawn up to | held-out CE, t = 0.1 / 0.5 / 0.9 | generate solved |",
        "|---:|---:|---:|---:|---:|",
        *[
            f"| {e['step']} | {e['train_seconds'] / 60:.1f} | {e['numbers_up_to']} | "
            f"{e['held_out_ce_by_noise']['t0.1']:.3f} / {e['held_out_ce_by_noise']['t0.5']:.3f} / {e['held_out_ce_by_noise']['t0.9']:.3f} | "
            f"{100 * e['generate']['accuracy']:.1f} % |"
            for e in training["checkpoint_evals"]
        ],
        "",
        "![learning curve](../../../docs/countdown_uniform_learning_curve.png)",
        "",
        "## Decoders on the held-out tiers, beside the LLaDA-format and block models",
        "",
        *table,
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=ROOT / "experiments" / "runs" / "uniform_card")
    parser.add_argument(
        "--out", type=Path, default=None, help="the card, rows and figure (default runs/uniform_model_card/)"
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="a DiffusionGemma checkpoint directory instead of the shipped one"
    )
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiers", nargs="+", default=["small", "medium", "d1"])
    parser.add_argument(
        "--model-card", type=Path, default=None, help="also write the model's README.md into this (shipped) directory"
    )
    add_flag(parser, "card in experiments/results/uniform/ (and a --model-card in dlmsearch/data/)")
    args = parser.parse_args(argv)
    check(parser, args, args.model_card and args.model_card / "README.md")
    args.out = resolve(parser, args, args.out, OUT, RUNS / "uniform_model_card")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [
        row(args.runs, tier, label, preset, overrides, args)
        for tier in args.tiers
        for label, preset, overrides in EVERY_TIER + (SMALL_ONLY if tier == args.tiers[0] else [])
    ]
    bars = others(args.tiers)
    reference = {r["tier"]: r for r in rows if r["label"] == "diffusion_gemma" and "refused" not in r}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    command = "python experiments/uniform_model_card.py" + (f" --limit {args.limit}" if args.limit else "")
    lines = [
        (
            f"Measured by `{command}` (batch {args.batch_size}, {args.threads} CPU threads). Paired columns: against the uniform "
            "model's reference rule `diffusion_gemma` on the same problems. Steps are model calls (one encoder call per canvas "
            "plus the decoder calls); decoder forwards are steps minus the canvas's encoder call."
        ),
        "",
        *HEADER,
        *[line(r, reference.get(r["tier"])) for r in rows],
        "",
        "Beside the other formats (their rows from `experiments/results/block/rows.json`), paired on the same problems:",
        "",
        "| tier | uniform `diffusion_gemma` | LLaDA-format `llada` | only uniform / only llada | sign p | block `sdar` | only uniform / only sdar | sign p | token-forwards uniform / llada / sdar |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for tier in args.tiers:
        mine, llada, block = reference.get(tier), bars.get(("llada", tier)), bars.get(("block", tier))
        if not (mine and llada and block) or mine["ids"] != llada["ids"]:
            continue
        wins_l, losses_l, p_l = paired(mine, llada)
        wins_b, losses_b, p_b = paired(mine, block)
        lines.append(
            f"| {tier} | {100 * mine['accuracy']:.1f} % | {100 * llada['accuracy']:.1f} % | {wins_l} / {losses_l} | {p_l:.3g} | "
            f"{100 * block['accuracy']:.1f} % | {wins_b} / {losses_b} | {p_b:.3g} | "
            f"{mine['mean_token_forwards']:.0f} / {llada['mean_token_forwards']:.0f} / {block['mean_token_forwards']:.0f} |"
        )
    (args.out / "card.md").write_text("\n".join(lines) + "\n")
    if args.model_card:
        write_card(args.model_card / "README.md", model_card(args.model_card, lines))
    plot(rows, bars, args.tiers, args.out / "accuracy_vs_token_forwards.png")
    print("\n".join(lines))
    print(f"wrote {args.out}/{{rows.json,card.md,accuracy_vs_token_forwards.png}}")


if __name__ == "__main__":
    main()
