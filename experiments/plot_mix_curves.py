"""The learning curves of the mix runs (``experiments/train_countdown_mix.sh``) in one figure: each
model's training cross-entropy on its corrupted positions, its held-out cross-entropy, and the
held-out solve rates its checkpoints measured (``validation4``, four-number problems never trained on).

    python experiments/plot_mix_curves.py --write-committed    # experiments/results/paradigm/learning_curves.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from outputs import RUNS, add_flag, check, resolve

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "paradigm" / "learning_curves.png"
TRAINED = ROOT / "runs" / "mix"
CORRUPTED = {"llada": "masked_ce", "block": "masked_ce", "block_full": "masked_ce", "uniform": "noised_ce"}
WINDOW = 50


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


def plot(runs: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (train, held, solved) = plt.subplots(1, 3, figsize=(18, 4.8))
    for name, key in CORRUPTED.items():
        losses, evals = read(runs / name / "loss.jsonl"), read(runs / name / "eval.jsonl")
        if len(losses) >= WINDOW:
            steps, values = np.array([r["step"] for r in losses]), np.array([r[key] for r in losses])
            train.plot(steps[WINDOW - 1 :], np.convolve(values, np.ones(WINDOW) / WINDOW, mode="valid"), label=name)
        ce = [(e["step"], e.get("held_out_masked_ce", e.get("held_out_ce"))) for e in evals]
        if ce and ce[0][1] is not None:
            held.plot(*zip(*ce), marker="o", label=name)
        for e in evals:
            e["solved"] = {m["decoder"]: m["accuracy"] for m in e.get("eval", [])} | (
                {"generate": e["generate"]["accuracy"]} if "generate" in e else {}
            )
        for decoder in dict.fromkeys(d for e in evals for d in e["solved"]):
            points = [(e["step"], 100 * e["solved"][decoder]) for e in evals if decoder in e["solved"]]
            solved.plot(*zip(*points), marker="o", label=f"{name}: {decoder}")
    train.set_ylabel(f"training CE on corrupted positions ({WINDOW}-step mean)")
    held.set_ylabel("held-out CE (fixed noise levels 0.1-0.9)")
    solved.set_ylabel("held-out solved % (validation4)")
    for axis, title in zip((train, held, solved), ("training", "held-out cross-entropy", "held-out solve rate")):
        axis.set_xlabel("step (batch 128, the same problems in the same order for every model)")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    train.set_yscale("log")
    held.set_yscale("log")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=TRAINED)
    parser.add_argument("--out", type=Path, default=None)
    add_flag(parser, "figure in experiments/results/paradigm/")
    args = parser.parse_args(argv)
    check(parser, args)
    out = resolve(parser, args, args.out, OUT, RUNS / "paradigm_card" / "learning_curves.png")
    plot(args.runs, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
