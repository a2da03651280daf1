"""Copy a trained Sudoku denoiser into the package (``dlmsearch/data/sudoku_model``) with a
``training.json`` that records how it was made (read from the training run's own files).

    python experiments/ship_sudoku_model.py --train-dir runs/sudoku_train --command "python experiments/train_sudoku.py ..."
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
from pathlib import Path

import torch

from dlmsearch.models.loading import shipped_sudoku_model_path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train-dir", type=Path, default=Path("runs/sudoku_train"))
    parser.add_argument("--dest", type=Path, default=shipped_sudoku_model_path())
    parser.add_argument("--command", default="python experiments/train_sudoku.py", help="the training command, recorded verbatim")
    args = parser.parse_args()
    state = torch.load(args.train_dir / "checkpoint.pt", weights_only=False, map_location="cpu")
    losses = [json.loads(line) for line in (args.train_dir / "loss.jsonl").read_text().splitlines() if line]
    evals = [json.loads(line) for line in (args.train_dir / "eval.jsonl").read_text().splitlines() if line]
    args.dest.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(args.train_dir / "model" / name, args.dest / name)
    tail = [r["loss"] for r in losses if r["step"] > state["step"] - 100]
    record = {
        "steps": state["step"],
        "train_seconds": round(state["train_seconds"], 1),
        "final_loss_last_100_steps": round(sum(tail) / len(tail), 4),
        "checkpoint_evals": evals,
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()},
        "command": args.command,
    }
    (args.dest / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"shipped step {state['step']} ({state['train_seconds'] / 60:.1f} training minutes) to {args.dest}")


if __name__ == "__main__":
    main()
