"""Copy a trained model into the package with a ``training.json`` that records how it was made
(read from the training run's own files), and draw its learning curve.

Without ``--write-committed`` the model goes to ``runs/ship_model/<train-dir name>/`` (a look at
what would ship); with it, to ``--dest`` (default: the shipped Sudoku model), and only then may
``--dest`` or ``--curve`` be committed paths:

    python experiments/ship_model.py --train-dir runs/sudoku_train --write-committed --command "python experiments/train_sudoku.py ..."
    python experiments/ship_model.py --train-dir runs/countdown_train --dest dlmsearch/data/countdown_model --write-committed \
        --curve docs/countdown_learning_curve.png --command "python experiments/train_countdown.py ..."
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
from pathlib import Path

import torch
from outputs import RUNS, add_flag, check, resolve

from dlmsearch.models.loading import shipped_sudoku_model_path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def plot_curve(losses: list[dict], evals: list[dict], path: Path) -> None:
    """Training loss (mean over 50-step windows) and each checkpoint's held-out accuracy, against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    steps, values = np.array([r["step"] for r in losses]), np.array([r["loss"] for r in losses])
    window = 50
    if len(values) >= window:
        left.plot(steps[window - 1 :], np.convolve(values, np.ones(window) / window, mode="valid"))
    left.set_xlabel("step")
    left.set_ylabel("training loss (50-step mean)")
    left.set_yscale("log")
    left.grid(alpha=0.3)
    if evals and "held_out_ce_by_noise" in evals[0]:  # the uniform-noise run: CE by noise level, generate's solve rate
        for level in evals[0]["held_out_ce_by_noise"]:
            right.plot(
                [e["step"] for e in evals],
                [e["held_out_ce_by_noise"][level] for e in evals],
                label=f"held-out CE, noise {level[1:]}",
            )
        right.set_yscale("log")
        right.set_ylabel("held-out cross-entropy (validation tier)")
        solved = right.twinx()
        solved.plot(
            [e["step"] for e in evals],
            [100 * e["generate"]["accuracy"] for e in evals],
            color="black",
            marker="o",
            label="generate() solved % (64 validation problems)",
        )
        solved.set_ylabel("solved % (transformers' generate)")
        solved.legend(loc="center right", fontsize=8)
    elif (
        evals and "held_out_masked_ce" in evals[0]
    ):  # the block-diffusion run: held-out masked cross-entropy at each checkpoint
        right.plot(
            [e["step"] for e in evals], [e["held_out_masked_ce"] for e in evals], marker="o", label="held-out masked CE"
        )
        right.set_yscale("log")
        right.set_ylabel("held-out masked cross-entropy (validation tier)")
    else:
        measured = [e for e in evals if isinstance(e["eval"], list)]
        for decoder in dict.fromkeys(m["decoder"] for e in measured for m in e["eval"]):
            points = [(e["step"], 100 * m["accuracy"]) for e in measured for m in e["eval"] if m["decoder"] == decoder]
            right.plot(*zip(*points), marker="o", label=decoder)
        right.set_ylabel(f"held-out accuracy % ({measured[0]['eval_tier'] if measured else ''} tier)")
    right.set_xlabel("step")
    right.grid(alpha=0.3)
    right.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-dir", type=Path, default=Path("runs/sudoku_train"))
    parser.add_argument(
        "--dest",
        type=Path,
        default=None,
        help="the model directory to write (default runs/ship_model/<train-dir name>; --write-committed: the shipped Sudoku model)",
    )
    parser.add_argument(
        "--command", default="python experiments/train_sudoku.py", help="the training command, recorded verbatim"
    )
    parser.add_argument(
        "--curve", type=Path, default=None, help="also draw loss and held-out accuracy against steps (PNG)"
    )
    add_flag(parser, "model in dlmsearch/data/ (and a --curve in docs/)")
    args = parser.parse_args(argv)
    check(parser, args, args.curve)
    args.dest = resolve(
        parser, args, args.dest, shipped_sudoku_model_path(), RUNS / "ship_model" / args.train_dir.resolve().name
    )
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    state = torch.load(args.train_dir / "checkpoint.pt", weights_only=False, map_location="cpu")
    losses = [json.loads(line) for line in (args.train_dir / "loss.jsonl").read_text().splitlines() if line]
    evals = [json.loads(line) for line in (args.train_dir / "eval.jsonl").read_text().splitlines() if line]
    args.dest.mkdir(parents=True, exist_ok=True)
    for file in sorted((args.train_dir / "model").iterdir()):  # weights, config, and the tokenizer where there is one
        if file.is_file() and not file.name.endswith(".tmp"):
            shutil.copy2(file, args.dest / file.name)
    tail = [r["loss"] for r in losses if r["step"] > state["step"] - 100]
    record = {
        "steps": state["step"],
        "train_seconds": round(state["train_seconds"], 1),
        "final_loss_last_100_steps": round(sum(tail) / len(tail), 4),
        "checkpoint_evals": evals,
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "command": args.command,
    }
    (args.dest / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    if args.curve:
        plot_curve(losses, evals, args.curve)
    print(f"shipped step {state['step']} ({state['train_seconds'] / 60:.1f} training minutes) to {args.dest}")


if __name__ == "__main__":
    main()
