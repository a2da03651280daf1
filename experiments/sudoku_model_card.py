"""Measure every decoder preset on both shipped Sudoku tiers and write the model card.

Each (tier, decoder) run goes through the normal runner into ``--runs/<tier>/<label>``, so an
interrupted card resumes where it stopped. Writes the card (``README.md`` beside the shipped
weights) with Wilson 95 % intervals and exact sign tests against ``--baseline`` on the same
puzzles, a JSON table, an accuracy-vs-steps figure, and, for the width presets
(``--width``) at each population size (``--particles``), accuracy against row-forwards.

Everything is written under ``--runs`` (default ``runs/model_card/``) unless ``--write-committed``:
then the card is the shipped model's ``README.md`` and the figures are ``docs/sudoku_decoders.png``
and ``docs/sudoku_width.png`` (the width figure goes beside ``--figure`` unless ``--width-figure``).

    python experiments/sudoku_model_card.py --write-committed                 # the shipped card and the README's figures
    python experiments/sudoku_model_card.py --limit 20 --runs /tmp/card       # quick look (everything under /tmp/card)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from decoder_table import measure as measure_run
from decoder_table import paired, parse_variant, plot_accuracy_vs_steps, write_card
from outputs import add_flag, check

from dlmsearch.config import compose, decoder_presets
from dlmsearch.models.denoiser import BidirectionalDenoiser
from dlmsearch.models.loading import shipped_sudoku_model_path
from dlmsearch.tasks.sudoku_files import TIERS, load_puzzles, tier_path

TEXT_ONLY = ("dream",)  # presets whose schedule is meant for text (one block of the whole generation)

ROOT = Path(__file__).resolve().parents[1]


def measure(tier: str, label: str, preset: str, overrides: list[str], args: argparse.Namespace) -> dict:
    return measure_run(
        args.runs / tier / label,
        tier,
        label,
        preset,
        overrides,
        [f"model.path={args.model}"],
        args.limit,
        args.batch_size,
    )


def plot_width(rows: list[dict], widths: list[str], baseline: str, path: Path) -> None:
    """Solve rate against mean row-forwards, one line per width preset over its population sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(TIERS), figsize=(6.5 * len(TIERS), 4.8), squeeze=False)
    for axis, tier in zip(axes[0], TIERS):
        tier_rows = [r for r in rows if r["tier"] == tier]
        for preset in widths:
            line = sorted(
                (r for r in tier_rows if r["preset"] == preset and r.get("particles")), key=lambda r: r["particles"]
            )
            if not line:
                continue
            x, y = [r["mean_row_forwards"] for r in line], [100 * r["accuracy"] for r in line]
            errors = [
                [100 * (r["accuracy"] - r["wilson_low"]) for r in line],
                [100 * (r["wilson_high"] - r["accuracy"]) for r in line],
            ]
            axis.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=preset)
            for r in line:
                axis.annotate(
                    f"P={r['particles']}",
                    (r["mean_row_forwards"], 100 * r["accuracy"]),
                    textcoords="offset points",
                    xytext=(4, -10),
                    fontsize=7,
                )
        for r in (r for r in tier_rows if r["label"] == baseline):
            axis.scatter(
                [r["mean_row_forwards"]],
                [100 * r["accuracy"]],
                marker="*",
                s=160,
                color="black",
                zorder=5,
                label=baseline,
            )
            axis.axvline(
                2 * r["mean_row_forwards"], color="grey", linestyle=":", linewidth=1, label=f"2x {baseline} rows"
            )
        axis.set_xscale("log")
        axis.set_xlabel("mean row-forwards per puzzle (every particle and branch, log scale)")
        axis.set_ylabel("solved % (Wilson 95 % interval)")
        axis.set_title(f"{tier} tier")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Width search on the shipped Sudoku denoiser: population size P = 1, 2, 4, 8")
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
        (
            f"A {params / 1e6:.2f} M-parameter bidirectional transformer (d = {c.d_model}, {c.n_layers} layers, {c.n_heads} heads, "
            f"feed-forward {c.d_ff}; learned positions over 81 cells plus row, column and box embeddings; vocabulary of 9 digits "
            "+ mask, token = digit - 1, mask = 9) trained as a masked diffusion model: each cell of a solved grid is masked with "
            "probability t ~ U(0, 1), cross-entropy on the masked cells."
        ),
        "",
        "## Training",
        "",
        (
            "- Data: solved grids made by random validity-preserving transformations (digit relabelling, row/column "
            "permutations within bands/stacks, band/stack permutations, transposition) of 2000 solver-made grids; grids of the "
            "held-out tiers are excluded. The tiers come from solver-made grids of their own seed "
            "(`experiments/make_sudoku_tiers.py`)."
        ),
        "- AdamW (lr 1e-3, weight decay 0.01), batch 128, 100 warm-up steps, cosine decay to 5e-5 over the training budget.",
    ]
    if training:
        m = training["machine"]
        lines += [
            (
                f"- {training['steps']} steps in {training['train_seconds'] / 60:.1f} minutes of training on {m['cores']} CPU cores "
                f"({m['cpu']}, torch {m['torch']}); final loss (mean of the last 100 steps) {training['final_loss_last_100_steps']}."
            ),
            f"- Command: `{training['command']}`, then `python experiments/ship_model.py`.",
            "",
            "Solve rate of the `llada` preset (confidence order) on the first 100 easy puzzles at each checkpoint:",
            "",
            "| step | training minutes | solved | mean steps |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {e['step']} | {e['train_seconds'] / 60:.1f} | {100 * e['eval']['solved']:.0f} % | {e['eval']['mean_steps']} |"
            for e in training["checkpoint_evals"]
            if "solved" in e["eval"]
        ]
    lines += [
        "",
        "## Decoders on the shipped held-out tiers",
        "",
        (
            f"`easy`: {len(clue_stats['easy'])} puzzles, {min(clue_stats['easy'])}-{max(clue_stats['easy'])} clues; "
            f"`hard`: {len(clue_stats['hard'])} puzzles, {min(clue_stats['hard'])}-{max(clue_stats['hard'])} clues "
            f"(mean {sum(clue_stats['hard']) / len(clue_stats['hard']):.1f}), carved until no clue can be removed. "
            "Steps are sequential model calls; row-forwards are rows summed over calls (the compute of a search). "
            f"Wall seconds are for the whole tier, batch {args.batch_size}, {torch.get_num_threads()} CPU threads."
        ),
        "",
        "Presets run with the Sudoku decoding defaults (`conf/decoding/sudoku.yaml`): "
        + ", ".join(f"{k} = {v}" for k, v in compose([]).decoding.items())
        + "; the extra rows (below the presets of each tier) list what they override.",
        "",
        (
            f"Intervals are Wilson 95 %; the paired columns compare each decoder with `{args.baseline}` on the same puzzles "
            "(solved only by this decoder / only by the baseline, and the exact two-sided sign-test p-value). "
            "Live particles: the population's particles still decoding, averaged over a puzzle's rounds (1 without a population)."
        ),
        "",
        "| tier | decoder | overrides | solved | 95 % interval | mean steps | mean row-forwards | live particles | only this / only base | sign p | wall s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {r["tier"]: r for r in rows if r["label"] == args.baseline}
    for r in rows:
        if (
            "particles" in r
            and not r["overrides"]
            and any(o["label"] == r["label"] and "particles" not in o for o in rows)
        ):
            continue  # the sweep point at the preset's own size is the preset's row above
        wins, losses, p = paired(r, base[r["tier"]]) if r["tier"] in base else (0, 0, 1.0)
        lines.append(
            f"| {r['tier']} | {r['label']} | {' '.join(r['overrides']) or '-'} | {100 * r['accuracy']:.1f} % | "
            f"{100 * r['wilson_low']:.1f}-{100 * r['wilson_high']:.1f} | {r['mean_steps']:.1f} | {r['mean_row_forwards']:.1f} | "
            f"{r['mean_live_particles']:.2f} | {wins} / {losses} | {p:.3g} | {r['wall_seconds']:.0f} |"
        )
    lines += ["", f"Measured by `{command}`.", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=shipped_sudoku_model_path())
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "model_card")
    parser.add_argument("--limit", type=int, default=None, help="puzzles per tier (default: all)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiers", nargs="+", default=list(TIERS))
    parser.add_argument("--variant", action="append", default=[], help="extra row: label=preset:override,override")
    parser.add_argument(
        "--card", type=Path, default=None, help="default: README.md in --runs (--write-committed: beside the model)"
    )
    parser.add_argument(
        "--figure", type=Path, default=None, help="default: sudoku_decoders.png in --runs (--write-committed: in docs/)"
    )
    parser.add_argument("--baseline", default="llada", help="the label every decoder is paired with")
    parser.add_argument(
        "--presets", nargs="*", default=None, help="presets to measure (default: every preset meant for Sudoku)"
    )
    parser.add_argument(
        "--width", nargs="*", default=["best_of_n", "verified_best_of_n"], help="width presets swept over --particles"
    )
    parser.add_argument("--particles", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--width-figure", type=Path, default=None, help="default: sudoku_width.png beside --figure")
    add_flag(parser, "model card (README.md beside the model) and figures in docs/")
    args = parser.parse_args(argv)
    check(parser, args, args.card, args.figure, args.width_figure)
    card_path = args.card or (args.model / "README.md" if args.write_committed else args.runs / "README.md")
    figure = args.figure or (ROOT / "docs" if args.write_committed else args.runs) / "sudoku_decoders.png"
    width_figure = args.width_figure or figure.parent / "sudoku_width.png"
    check(parser, args, card_path, args.runs / "table.json")
    args.card_given, args.card, args.figure, args.width_figure = args.card, card_path, figure, width_figure
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    card_path, figure, width_figure = args.card, args.figure, args.width_figure
    torch.set_num_threads(args.threads)
    presets = args.presets if args.presets is not None else [p for p in decoder_presets() if p not in TEXT_ONLY]
    variants = [(p, p, []) for p in presets] + [parse_variant(v) for v in args.variant]
    default_size = {w: int(compose([f"+decoder={w}"]).decoder.population.size) for w in args.width}
    # a sweep point at the preset's own size is the preset's run (measured once)
    sizes = [
        (w, w, [], n) if n == default_size[w] else (f"{w}_P{n}", w, [f"decoder.population.size={n}"], n)
        for w in args.width
        for n in args.particles
    ]
    rows = [
        measure(tier, label, preset, overrides, args) for tier in args.tiers for label, preset, overrides in variants
    ]
    rows += [
        {**measure(tier, label, preset, overrides, args), "particles": n}
        for tier in args.tiers
        for label, preset, overrides, n in sizes
    ]
    args.runs.mkdir(parents=True, exist_ok=True)
    (args.runs / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot_accuracy_vs_steps(
        [r for r in rows if "particles" not in r],
        list(TIERS),
        "Shipped Sudoku denoiser: solve rate vs steps per decoder",
        "puzzle",
        figure,
    )
    plot_width(rows, args.width, args.baseline, width_figure)
    command = "python experiments/sudoku_model_card.py" + "".join(f" --variant '{v}'" for v in args.variant)
    if args.presets is not None:
        command += " --presets " + " ".join(args.presets)
    if args.card_given is not None:
        given = args.card_given
        command += f" --card {given.relative_to(ROOT) if given.is_absolute() and ROOT in given.parents else given}"
    write_card(card_path, card(rows, args, command))
    print(f"wrote {card_path}, {figure}, {width_figure} and {args.runs / 'table.json'}")
    for r in rows:
        print(
            f"{r['tier']:5} {r['label']:28} solved {100 * r['accuracy']:5.1f} %  steps {r['mean_steps']:6.1f}  rows {r['mean_row_forwards']:7.1f}"
        )


if __name__ == "__main__":
    main()
