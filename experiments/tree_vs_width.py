"""Tree search against width search at equal forwards: accuracy against row-forwards per problem.

For one (model, task, tier): ``llada`` sets the unit (its mean row-forwards per problem, ``L``); the
single-path presets (``llada``, ``fast_dllm``, ``adalook``) run once; the width presets run at
population sizes ``--particles``; the tree presets run at budgets ``b * L`` for each ``b`` in
``--budgets`` (``decoder.tree.budget``; simulations per search ``b`` for ``mcts`` and ``gumbel_mcts``,
which search every step, ``2 b`` for ``mcts_macro``; ``mcts_verified`` keeps its preset's twelve,
chosen on the validation tiers, plus ``--verified-overrides``). At each budget the best width run
that spends at most ``b * L`` is the comparison: Wilson 95 % intervals and exact sign tests on the
same problems.

At equal cost: for each ``verified_best_of_n`` size, ``mcts_verified`` with its budget set to what that
run spent per problem (rounded up; ``mcts_verified_eq_P<size>``), paired with it. Each tree run also
reports how many problems it decoded exactly as ``llada`` did (what its search changed).

``--presets`` keeps only the named presets (``llada`` always runs: it sets the unit).
Every run goes through the normal runner into ``--runs/<label>``, so an interrupted study resumes. A
preset the model refuses (the tree presets on a uniform-noise model) is left out of the curve, and its
refusal is written under the table. Writes ``--runs/table.json``, ``--runs/table.md`` and the figure (``--figure``).

    python experiments/tree_vs_width.py --task sudoku --tier hard --limit 64 --verified-overrides decoder.tree.completion_steps=8 --figure docs/tree_vs_width_sudoku.png
    python experiments/tree_vs_width.py --task countdown --model countdown --tier small --figure docs/tree_vs_width_countdown.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from decoder_table import measure, paired

SINGLE = ("llada", "fast_dllm", "adalook")
WIDTH = ("best_of_n", "beam", "smc", "verified_best_of_n")
TREES = ("mcts", "mcts_verified", "gumbel_mcts", "mcts_macro")
SIMULATIONS_PER_BUDGET = {"mcts": 1, "gumbel_mcts": 1, "mcts_verified": None, "mcts_macro": 2}  # None: the preset's


def runs_for(args: argparse.Namespace, unit: float) -> list[tuple[str, str, list[str], str, float | None]]:
    """(label, preset, overrides, family, budget multiple) for every run after ``llada``."""
    plan: list[tuple[str, str, list[str], str, float | None]] = [(p, p, [], "single", None) for p in SINGLE[1:]]
    for preset in WIDTH:
        for size in args.particles:
            plan.append((f"{preset}_P{size}", preset, [f"decoder.population.size={size}"], "width", None))
    for preset in TREES:
        for multiple in args.budgets:
            overrides = [f"decoder.tree.budget={int(multiple * unit)}"]
            per_budget = SIMULATIONS_PER_BUDGET[preset]
            if per_budget is None:
                overrides += args.verified_overrides
            else:
                overrides.append(f"decoder.tree.simulations={max(1, int(per_budget * multiple))}")
            plan.append((f"{preset}_x{multiple:g}", preset, overrides, "tree", multiple))
    return [run for run in plan if args.presets is None or run[1] in args.presets]


def outputs(run: Path) -> dict[str, str]:
    """``id -> output`` of a run's decoded items."""
    found = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]
    return {str(r["id"]): r.get("output") for r in found if not r.get("error")}


def matched(rows: list[dict]) -> list[dict]:
    """Each ``mcts_verified_eq_P<size>`` run against the ``verified_best_of_n_P<size>`` whose spend set its budget."""
    found = []
    for row in (r for r in rows if r["label"].startswith("mcts_verified_eq_P")):
        width = next(r for r in rows if r["label"] == row["label"].replace("mcts_verified_eq", "verified_best_of_n"))
        only_tree, only_width, p = paired(row, width)
        found.append(
            {
                "tree": row["label"],
                "accuracy": row["accuracy"],
                "rows": row["mean_row_forwards"],
                "width": width["label"],
                "width_accuracy": width["accuracy"],
                "width_rows": width["mean_row_forwards"],
                "only_tree": only_tree,
                "only_width": only_width,
                "sign_p": p,
            }
        )
    return found


def compare(rows: list[dict], unit: float, budgets: list[float]) -> list[dict]:
    """At each budget, each tree run against the most accurate width run within that budget."""
    found = []
    for multiple in budgets:
        width = [r for r in rows if r["family"] == "width" and r["mean_row_forwards"] <= multiple * unit * 1.05]
        best = max(width, key=lambda r: (r["accuracy"], -r["mean_row_forwards"]), default=None)
        for row in (r for r in rows if r["family"] == "tree" and r["multiple"] == multiple):
            entry = {
                "budget": multiple,
                "tree": row["label"],
                "accuracy": row["accuracy"],
                "rows": row["mean_row_forwards"],
            }
            if best is not None:
                only_tree, only_width, p = paired(row, best)
                entry |= {
                    "width": best["label"],
                    "width_accuracy": best["accuracy"],
                    "width_rows": best["mean_row_forwards"],
                }
                entry |= {"only_tree": only_tree, "only_width": only_width, "sign_p": p}
            found.append(entry)
    return found


def plot(rows: list[dict], unit: float, title: str, path: Path) -> None:
    """Accuracy (95 % interval) against row-forwards per problem in units of ``llada``'s, one line per preset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 5))
    presets = sorted({r["preset"] for r in rows}, key=lambda p: (p not in TREES, p))
    for preset in presets:
        mine = sorted((r for r in rows if r["preset"] == preset), key=lambda r: r["mean_row_forwards"])
        x = [r["mean_row_forwards"] / unit for r in mine]
        y = [100 * r["accuracy"] for r in mine]
        low = [100 * (r["accuracy"] - r["wilson_low"]) for r in mine]
        high = [100 * (r["wilson_high"] - r["accuracy"]) for r in mine]
        style = "-o" if preset in TREES else ("--s" if preset in WIDTH else "^")
        axis.errorbar(x, y, yerr=[low, high], fmt=style, capsize=3, label=preset, alpha=0.85)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("row-forwards per problem (× llada's)")
    axis.set_ylabel("solved (%), 95 % Wilson interval")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def markdown(rows: list[dict], comparisons: list[dict], unit: float, refused: dict[str, str]) -> str:
    """The study's tables: every run, the equal-cost pairs, the per-budget comparisons and the refusals."""
    lines = [
        "| run | solved (95 % CI) | steps | row-forwards (× llada) | as llada decoded |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: r["mean_row_forwards"]):
        same = f"{r['same_as_llada']} / {r['items']}" if "same_as_llada" in r else ""
        lines.append(
            f"| `{r['label']}` | {100 * r['accuracy']:.1f} % [{100 * r['wilson_low']:.1f}, {100 * r['wilson_high']:.1f}] "
            f"| {r['mean_steps']:.1f} | {r['mean_row_forwards']:.1f} ({r['mean_row_forwards'] / unit:.2f}×) | {same} |"
        )
    equal = [c for c in comparisons if "budget" not in c]
    if equal:
        lines += [
            "",
            "| at equal cost: tree run | solved | rows | width run | solved | rows | only tree / only width | sign p |",
        ]
        lines.append("|---|---:|---:|---|---:|---:|---:|---:|")
        for c in equal:
            lines.append(
                f"| `{c['tree']}` | {100 * c['accuracy']:.1f} % | {c['rows']:.1f} | `{c['width']}` | "
                f"{100 * c['width_accuracy']:.1f} % | {c['width_rows']:.1f} | {c['only_tree']} / {c['only_width']} | {c['sign_p']:.3g} |"
            )
    per_budget = [c for c in comparisons if "budget" in c]
    if per_budget:
        lines += [
            "",
            "| budget | tree run | solved | rows | best width within budget | solved | rows | only tree / only width | sign p |",
            "|---:|---|---:|---:|---|---:|---:|---:|---:|",
        ]
    for c in per_budget:
        width = (
            f"`{c['width']}` | {100 * c['width_accuracy']:.1f} % | {c['width_rows']:.1f} | {c['only_tree']} / {c['only_width']} | {c['sign_p']:.3g}"
            if "width" in c
            else "none | | | |"
        )
        lines.append(f"| {c['budget']:g}× | `{c['tree']}` | {100 * c['accuracy']:.1f} % | {c['rows']:.1f} | {width} |")
    if refused:
        lines += ["", "Refused on this model:", ""]
        lines += [f"- `{preset}`: {reason}" for preset, reason in sorted(refused.items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="sudoku", choices=("sudoku", "countdown"))
    parser.add_argument("--model", default=None, help="model config (default: the task's shipped model)")
    parser.add_argument("--tier", default="hard")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--budgets", type=float, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--particles", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument(
        "--verified-overrides",
        nargs="*",
        default=[],
        help="overrides for every mcts_verified run (Sudoku: completion steps)",
    )
    parser.add_argument(
        "--presets", nargs="+", default=None, help="only these presets besides llada (default: all of them)"
    )
    parser.add_argument("--runs", type=Path, default=None, help="default: runs/tree_vs_width/<model>_<tier>")
    parser.add_argument("--figure", type=Path, default=None, help="default: <runs>/tree_vs_width.png")
    args = parser.parse_args()
    model = args.model or args.task
    runs = args.runs or Path("runs/tree_vs_width") / f"{model}_{args.tier}"
    base = [f"model={model}", f"task={args.task}"]

    def one(label: str, preset: str, overrides: list[str]) -> dict:
        return measure(runs / label, args.tier, label, preset, overrides, base, args.limit, args.batch_size)

    refused: dict[str, str] = {}

    def attempt(label: str, preset: str, overrides: list[str], family: str, multiple: float | None) -> None:
        """Measure one run into ``rows``, or note the model's refusal of its preset (asked once per preset)."""
        if preset in refused:
            return
        try:
            rows.append({**one(label, preset, overrides), "family": family, "multiple": multiple})
        except ValueError as error:  # the plan's refusal (a ConfigError is one too): one line naming why
            refused[preset] = str(error).splitlines()[0]
            print(f"{label}: refused: {refused[preset]}", flush=True)
            return
        print(
            f"{label}: {100 * rows[-1]['accuracy']:.1f} % at {rows[-1]['mean_row_forwards'] / unit:.2f}× llada's rows",
            flush=True,
        )

    rows = [{**one("llada", "llada", []), "family": "single", "multiple": None}]
    unit = rows[0]["mean_row_forwards"]
    for label, preset, overrides, family, multiple in runs_for(args, unit):
        attempt(label, preset, overrides, family, multiple)
    paired_runs = args.presets is None or "mcts_verified" in args.presets
    for row in [r for r in rows if paired_runs and r["label"].startswith("verified_best_of_n_P")]:
        label = row["label"].replace("verified_best_of_n", "mcts_verified_eq")
        overrides = [f"decoder.tree.budget={math.ceil(row['mean_row_forwards'])}", *args.verified_overrides]
        attempt(label, "mcts_verified", overrides, "tree", None)
    base = outputs(runs / "llada")
    for row in (r for r in rows if r["family"] == "tree"):
        mine = outputs(runs / row["label"])
        row["same_as_llada"] = sum(1 for i, text in mine.items() if base.get(i) == text)
    comparisons = compare(rows, unit, args.budgets) + matched(rows)
    (runs / "table.json").write_text(
        json.dumps({"unit": unit, "rows": rows, "comparisons": comparisons, "refused": refused}, indent=1)
    )
    (runs / "table.md").write_text(markdown(rows, comparisons, unit, refused))
    plot(
        rows,
        unit,
        f"model={model}, task={args.task} ({args.tier}, {rows[0]['items']} problems)",
        args.figure or runs / "tree_vs_width.png",
    )
    print((runs / "table.md").read_text())


if __name__ == "__main__":
    main()
