"""Draw the decode order of one Sudoku puzzle from a run made with ``trace=true``.

Each blank cell shows its digit, coloured by the model call that committed it; cells committed
by a lookahead branch (depth >= 1) carry their depth. Clues are grey.

    python -m dlmsearch +decoder=adalook trace=true task.limit=5 out_dir=runs/trace_demo
    python experiments/plot_sudoku_trace.py runs/trace_demo --item 0      # runs/sudoku_trace.png
    python experiments/plot_sudoku_trace.py runs/trace_demo --item 2 --out docs/sudoku_trace.png --write-committed   # the README's figure
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from outputs import RUNS, add_flag, check


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run directory with results.jsonl and trace.jsonl")
    parser.add_argument("--item", type=int, default=0, help="which item of the run (0-based)")
    parser.add_argument("--out", type=Path, default=RUNS / "sudoku_trace.png")
    add_flag(parser, "figure (an --out under docs/)")
    args = parser.parse_args(argv)
    check(parser, args, args.out)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = [json.loads(line) for line in (args.run / "results.jsonl").read_text().splitlines()]
    traces = {t["id"]: t for t in map(json.loads, (args.run / "trace.jsonl").read_text().splitlines())}
    record = results[args.item]
    events = traces[record["id"]]["events"]
    call_of, depth_of = {}, {}
    for event in events:
        for position, depth in zip(event["positions"], event["depth"]):
            call_of[position], depth_of[position] = event["call"], depth
    last_call = max(call_of.values())
    figure, axis = plt.subplots(figsize=(6.2, 6.6))
    colours = plt.get_cmap("viridis")
    for cell, digit in enumerate(record["output"]):
        row, col = divmod(cell, 9)
        if cell in call_of:
            shade = colours(call_of[cell] / max(1, last_call))
            axis.add_patch(plt.Rectangle((col, 8 - row), 1, 1, color=shade, alpha=0.55))
            axis.text(col + 0.5, 8 - row + 0.5, digit, ha="center", va="center", fontsize=15, weight="bold")
            label = f"{call_of[cell]}" + (f"·d{depth_of[cell]}" if depth_of[cell] > 0 else "")
            axis.text(col + 0.05, 8 - row + 0.06, label, fontsize=6.5)
        else:
            axis.add_patch(plt.Rectangle((col, 8 - row), 1, 1, color="0.85"))
            axis.text(col + 0.5, 8 - row + 0.5, digit, ha="center", va="center", fontsize=15, color="0.35")
    for line in range(10):
        width = 2.5 if line % 3 == 0 else 0.6
        axis.plot([0, 9], [line, line], color="black", lw=width)
        axis.plot([line, line], [0, 9], color="black", lw=width)
    axis.set_xlim(0, 9)
    axis.set_ylim(0, 9)
    axis.set_aspect("equal")
    axis.axis("off")
    verdict = "solved" if record["correct"] else "not solved"
    axis.set_title(
        f"{record['id']}: {verdict} in {record['steps']} steps, {record['row_forwards']} row-forwards\n"
        "colour / number = model call that committed the cell; ·dN = lookahead depth",
        fontsize=9,
    )
    figure.colorbar(
        plt.cm.ScalarMappable(cmap=colours, norm=plt.Normalize(1, last_call)),
        ax=axis,
        fraction=0.04,
        label="model call",
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=130, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
