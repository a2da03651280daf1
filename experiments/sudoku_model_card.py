"""Measure every decoder preset on both shipped Sudoku tiers and write the model card.

Each (tier, decoder) run goes through the normal runner into ``--runs/<tier>/<label>``, so an
interrupted card resumes where it stopped. Writes the card (``README.md`` beside the shipped
weights), a JSON table and an accuracy-vs-steps figure.

    python experiments/sudoku_model_card.py
    python experiments/sudoku_model_card.py --limit 20 --runs /tmp/card   # quick look
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dlmsearch.config import compose, decoder_presets
from dlmsearch.models.denoiser import BidirectionalDenoiser
from dlmsearch.models.loading import shipped_sudoku_model_path
from dlmsearch.run import run
from dlmsearch.tasks.sudoku_files import TIERS, load_puzzles, tier_path

ROOT = Path(__file__).resolve().parents[1]


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """``label=preset:override,override`` (overrides optional)."""
    label, _, rest = text.partition("=")
    preset, _, overrides = rest.partition(":")
    return label, preset, [o for o in overrides.split(",") if o]


def measure(tier: str, label: str, preset: str, overrides: list[str], args: argparse.Namespace) -> dict:
    cfg = compose([
        f"+decoder={preset}", f"task.tier={tier}", f"task.limit={args.limit or 'null'}", f"batch_size={args.batch_size}",
        f"out_dir={args.runs / tier / label}", f"model.path={args.model}", "examples=0", *overrides,
    ])
    summary = run(cfg)
    return {"tier": tier, "label": label, "preset": preset, "overrides": overrides,
            **{k: summary[k] for k in ("items", "accuracy", "mean_steps", "mean_row_forwards", "wall_seconds")}}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(TIERS), figsize=(6 * len(TIERS), 4.5), squeeze=False)
    for axis, tier in zip(axes[0], TIERS):
        for row in (r for r in rows if r["tier"] == tier):
            axis.scatter(row["mean_steps"], 100 * row["accuracy"], s=40)
            axis.annotate(row["label"], (row["mean_steps"], 100 * row["accuracy"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        axis.set_xscale("log")
        axis.set_xlabel("mean steps per puzzle (sequential model calls, log scale)")
        axis.set_ylabel("solved %")
        axis.set_title(f"{tier} tier")
        axis.grid(alpha=0.3)
    figure.suptitle("Shipped Sudoku denoiser: solve rate vs steps per decoder")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def card(rows: list[dict], args: argparse.Namespace, command: str) -> str:
    model = BidirectionalDenoiser.load(args.model)
    params = sum(p.numel() for p in model.parameters())
    c = model.config
    training = json.loads((args.model / "training.json").read_text()) if (args.model / "training.json").exists() else {}
    clue_stats = {t: [int((p.puzzle > 0).sum()) for p in load_puzzles(tier_path(t))] for t in TIERS}
    lines = [
        "# Sudoku denoiser shipped with dlmsearch",
        "",
        f"A {params / 1e6:.2f} M-parameter bidirectional transformer (d = {c.d_model}, {c.n_layers} layers, {c.n_heads} heads, "
        f"feed-forward {c.d_ff}; learned positions over 81 cells plus row, column and box embeddings; vocabulary of 9 digits "
        "+ mask, token = digit - 1, mask = 9) trained as a masked diffusion model: each cell of a solved grid is masked with "
        "probability t ~ U(0, 1), cross-entropy on the masked cells.",
        "",
        "## Training",
        "",
        "- Data: solved grids made by random validity-preserving transformations (digit relabelling, row/column "
        "permutations within bands/stacks, band/stack permutations, transposition) of 2000 solver-made grids; grids of the "
        "held-out tiers are excluded. The tiers come from solver-made grids of their own seed "
        "(`experiments/make_sudoku_tiers.py`).",
        "- AdamW (lr 1e-3, weight decay 0.01), batch 128, 100 warm-up steps, cosine decay to 5e-5 over the training budget.",
    ]
    if training:
        m = training["machine"]
        lines += [
            f"- {training['steps']} steps in {training['train_seconds'] / 60:.1f} minutes of training on {m['cores']} CPU cores "
            f"({m['cpu']}, torch {m['torch']}); final loss (mean of the last 100 steps) {training['final_loss_last_100_steps']}.",
            f"- Command: `{training['command']}`, then `python experiments/ship_sudoku_model.py`.",
            "",
            "Solve rate of the `llada` preset (confidence order) on the first 100 easy puzzles at each checkpoint:",
            "",
            "| step | training minutes | solved | mean steps |",
            "|---:|---:|---:|---:|",
        ]
        lines += [f"| {e['step']} | {e['train_seconds'] / 60:.1f} | {100 * e['eval']['solved']:.0f} % | {e['eval']['mean_steps']} |"
                  for e in training["checkpoint_evals"] if "solved" in e["eval"]]
    lines += [
        "",
        "## Decoders on the shipped held-out tiers",
        "",
        f"`easy`: {len(clue_stats['easy'])} puzzles, {min(clue_stats['easy'])}-{max(clue_stats['easy'])} clues; "
        f"`hard`: {len(clue_stats['hard'])} puzzles, {min(clue_stats['hard'])}-{max(clue_stats['hard'])} clues "
        f"(mean {sum(clue_stats['hard']) / len(clue_stats['hard']):.1f}), carved until no clue can be removed. "
        "Steps are sequential model calls; row-forwards are rows summed over calls (the compute of a search). "
        f"Wall seconds are for the whole tier, batch {args.batch_size}, {torch.get_num_threads()} CPU threads.",
        "",
        "Presets run with the Sudoku decoding defaults (`conf/decoding/sudoku.yaml`): "
        + ", ".join(f"{k} = {v}" for k, v in compose([]).decoding.items())
        + "; the extra rows (below the presets of each tier) list what they override.",
        "",
        "| tier | decoder | overrides | solved | mean steps | mean row-forwards | wall s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {r['tier']} | {r['label']} | {' '.join(r['overrides']) or '-'} | {100 * r['accuracy']:.1f} % | {r['mean_steps']:.1f} | "
              f"{r['mean_row_forwards']:.1f} | {r['wall_seconds']:.0f} |" for r in rows]
    lines += ["", f"Measured by `{command}`.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=shipped_sudoku_model_path())
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "model_card")
    parser.add_argument("--limit", type=int, default=None, help="puzzles per tier (default: all)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiers", nargs="+", default=list(TIERS))
    parser.add_argument("--variant", action="append", default=[], help="extra row: label=preset:override,override")
    parser.add_argument("--card", type=Path, default=None, help="default: README.md beside the model")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "sudoku_decoders.png")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = [(p, p, []) for p in decoder_presets()] + [parse_variant(v) for v in args.variant]
    rows = [measure(tier, label, preset, overrides, args) for tier in args.tiers for label, preset, overrides in variants]
    args.runs.mkdir(parents=True, exist_ok=True)
    (args.runs / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, args.figure)
    command = "python experiments/sudoku_model_card.py" + "".join(f" --variant '{v}'" for v in args.variant)
    (args.card or args.model / "README.md").write_text(card(rows, args, command))
    for r in rows:
        print(f"{r['tier']:5} {r['label']:24} solved {100 * r['accuracy']:5.1f} %  steps {r['mean_steps']:6.1f}  rows {r['mean_row_forwards']:7.1f}")


if __name__ == "__main__":
    main()
