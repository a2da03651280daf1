"""The decoders that revise commits (WINO, RCR, Saber, ReMDM) and the newer monotone rules
(EB-Sampler, KLASS, PC-Sampler) against Fast-dLLM, paired.

On the shipped Sudoku model (easy and hard tiers) and the shipped Countdown model (small tier),
every decoder decodes the same items (PC-Sampler with the authors' lambda: 0 on Sudoku, 1 on
Countdown, and on Countdown the model's own token-frequency prior); each row gives accuracy with its Wilson interval, mean
model calls and row-forwards, revisions per item, and the paired sign test against
``fast_dllm`` (items only it solves, items only ``fast_dllm`` solves, p). The ``llada`` rows at
the same number of steps as RCR are the equal-steps baseline (RCR is LLaDA's schedule with
revisions); EB-Sampler's gamma and Fast-dLLM's threshold are swept so that accuracy can be read
at equal steps from the curves (``revision_card.png``).

The card goes to ``--out`` (default ``runs/revision_card/``; with ``--write-committed``, the
committed ``experiments/results/revision/``).

    python experiments/revision_card.py --write-committed        # all three tiers (~15 min on 2 cores), the committed card
    python experiments/revision_card.py --limit 16 --out /tmp/rev   # a quick look
    python experiments/revision_card.py --only saber,rcr,wino       # some decoders (and fast_dllm, the baseline)
    python experiments/revision_card.py --only saber,rcr,wino --merge --write-committed   # ... their rows replaced in the committed card
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from decoder_table import measure, paired
from outputs import ROOT, RUNS, add_flag, resolve

SETTINGS = {
    "sudoku": ["task=sudoku"],
    "countdown": ["model=countdown", "task=countdown", "model.device=cpu"],
}
TIERS = [("sudoku", "easy"), ("sudoku", "hard"), ("countdown", "small")]


def variants(task: str) -> list[tuple[str, str, list[str]]]:
    """(label, preset, overrides) per decoder; Sudoku is one block of 81, Countdown 16 tokens in blocks of 8."""
    n = 81 if task == "sudoku" else 16
    half = n // 3 if task == "sudoku" else 8
    thresholds = (
        (0.95, 0.9) if task == "sudoku" else (0.7, 0.5)
    )  # the Sudoku model needs sure commits (its default: 0.99)
    rows = [
        ("fast_dllm", "fast_dllm", []),
        *[(f"fast_dllm τ={t}", "fast_dllm", [f"decoder.commit.threshold={t}"]) for t in thresholds],
        (f"llada steps={n}", "llada", [f"decoder.commit.steps={n}"]),
        (f"llada steps={half}", "llada", [f"decoder.commit.steps={half}"]),
        (f"rcr steps={n}", "rcr", [f"decoder.commit.steps={n}"]),
        (f"rcr steps={half}", "rcr", [f"decoder.commit.steps={half}"]),
        (f"remdm steps={n}", "remdm", [f"decoder.commit.steps={n}"]),
        ("saber", "saber", []),
        (f"klass steps={n}", "klass", [f"decoder.commit.steps={n}"]),
        *(
            [(f"klass steps={n} τ=0.99", "klass", [f"decoder.commit.steps={n}", "decoder.commit.confidence=0.99"])]
            if task == "sudoku"
            else []
        ),
        *[
            (f"wino τ1={t}", "wino", [f"decoder.commit.tau1={t}"])
            for t in ((0.7, 0.9, 0.99) if task == "sudoku" else (0.5, 0.7))
        ],
        (
            f"pc_sampler steps={n}",
            "pc_sampler",
            [f"decoder.commit.steps={n}", f"decoder.commit.decay={0.0 if task == 'sudoku' else 1.0}"],
        ),
        ("eb_sampler γ=0.01", "eb_sampler", ["decoder.commit.gamma=0.01"]),
        ("eb_sampler γ=0.1", "eb_sampler", ["decoder.commit.gamma=0.1"]),
        ("eb_sampler γ=1", "eb_sampler", ["decoder.commit.gamma=1.0"]),
    ]
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="the card (default runs/revision_card/)")
    parser.add_argument("--runs", type=Path, default=Path("runs/revision_card"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--only", default=None, help="comma-separated presets to run (fast_dllm is always run: the paired baseline)"
    )
    parser.add_argument(
        "--merge", action="store_true", help="replace these rows in the card already in --out, keep its other rows"
    )
    add_flag(parser, "card in experiments/results/revision/")
    args = parser.parse_args(argv)
    args.out = resolve(parser, args, args.out, ROOT / "experiments" / "results" / "revision", RUNS / "revision_card")
    if args.merge and not (args.out / "revision_card.json").is_file():
        parser.error(
            f"--merge: no card in {args.out} to merge into (--write-committed: the committed card in experiments/results/revision/)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = None if args.only is None else {"fast_dllm", *args.only.split(",")}
    table = []
    for task, tier in TIERS:
        baseline = None
        for label, preset, overrides in (v for v in variants(task) if only is None or v[1] in only):
            run_dir = (
                args.runs
                / f"{task}_{tier}"
                / label.replace(" ", "_").replace("=", "").replace("τ", "tau").replace("γ", "gamma")
            )
            row = measure(
                run_dir,
                tier,
                label,
                preset,
                overrides,
                SETTINGS[task],
                args.limit,
                args.batch_size,
                extras=lambda found: {
                    "mean_revisions": round(sum(r.get("revisions", 0) for r in found.values()) / max(len(found), 1), 2)
                },
            )
            row["task"] = task
            if baseline is None:
                baseline = row
            only_new, only_fast, p = paired(row, baseline)
            row.update(only_new=only_new, only_fast_dllm=only_fast, sign_p=p)
            table.append(row)
            print(
                f"{task}/{tier} {label}: {100 * row['accuracy']:.1f} % at {row['mean_steps']} steps, revisions {row['mean_revisions']}, "
                f"vs fast_dllm +{only_new}/-{only_fast} p={p:.3g}",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        table = merged(json.loads((args.out / "revision_card.json").read_text()), table)
    (args.out / "revision_card.json").write_text(json.dumps(table, indent=2) + "\n")
    lines = [
        "| tier | decoder | accuracy [95 % CI] | steps | row-forwards | revisions | vs fast_dllm: only new / only fast_dllm (p) |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['task']} {r['tier']} | {r['label']} | {100 * r['accuracy']:.1f} % [{100 * r['wilson_low']:.1f}, {100 * r['wilson_high']:.1f}] | "
            f"{r['mean_steps']} | {r['mean_row_forwards']} | {r['mean_revisions']} | "
            + ("—" if r["label"] == "fast_dllm" else f"{r['only_new']} / {r['only_fast_dllm']} (p = {r['sign_p']:.3g})")
            + " |"
        )
    (args.out / "revision_card.md").write_text("\n".join(lines) + "\n")
    plot(table, args.out / "revision_card.png")
    print("\n".join(lines))
    print(f"wrote {args.out}/revision_card.{{json,md,png}}")
    return 0


def merged(card: list[dict], fresh: list[dict]) -> list[dict]:
    """The card with its rows of the same tier and label replaced by the fresh ones (in place, in order)."""
    key = lambda r: (r["task"], r["tier"], r["label"])
    replacing = {key(r): r for r in fresh}
    return [replacing.get(key(r), r) for r in card] + [r for r in fresh if key(r) not in {key(c) for c in card}]


def plot(table: list[dict], path: Path) -> None:
    """Accuracy against mean model calls, one panel per tier, one series per decoder family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers = list(dict.fromkeys((r["task"], r["tier"]) for r in table))
    fig, axes = plt.subplots(1, len(tiers), figsize=(5 * len(tiers), 4), squeeze=False)
    for ax, (task, tier) in zip(axes[0], tiers):
        rows = [r for r in table if (r["task"], r["tier"]) == (task, tier)]
        for family in dict.fromkeys(r["preset"] for r in rows):
            points = sorted((r["mean_steps"], 100 * r["accuracy"]) for r in rows if r["preset"] == family)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=family)
        ax.set_xscale("log")
        ax.set_xlabel("mean model calls per item")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{task} {tier}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
