"""What stopping at the end of the answer saves, on the shipped Countdown model.

For each generation length and decoder, the same problems are decoded twice, with and without
``decoder.stop_at_eos``: accuracy, model calls and row-forwards of both, whether each item's
text is the same, and whether the full decode had filled the tail after the first end token
with end-of-text tokens anyway (then the tokens are the same too). The model's context is 128
tokens, so generation lengths past about 100 do not fit and are reported as such.

The table goes to ``--out`` (default ``runs/stop_at_eos/``; with ``--write-committed``, the committed
``experiments/results/countdown/small/stop_at_eos/``).

    python experiments/stop_at_eos.py --write-committed     # small tier, 256 problems (~10 min on 2 cores)
    python experiments/stop_at_eos.py --limit 16 --out /tmp/stop --runs /tmp/stop/runs   # a quick look
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from outputs import ROOT, RUNS, add_flag, resolve

from dlmsearch import run_records as records
from dlmsearch.config import compose
from dlmsearch.run import run

EOS, STOPS = 1401, (1401, 1405)  # the Countdown tokenizer's <|endoftext|> and <|eot_id|>


def tail_filled(trace_path: Path) -> dict[str, bool]:
    """Per item of a full decode: every position after the first end token holds EOS."""
    filled = {}
    for line in trace_path.read_text().splitlines():
        trace = json.loads(line)
        tokens = {p: t for event in trace["events"] for p, t in zip(event["positions"], event["tokens"])}
        ordered = [tokens[p] for p in sorted(tokens)]
        first = next((i for i, t in enumerate(ordered) if t in STOPS), len(ordered))
        filled[str(trace["id"])] = all(t == EOS for t in ordered[first + 1 :])
    return filled


def measure(
    runs: Path, preset: str, gen_length: int, stop: bool, limit: int | None, batch_size: int
) -> tuple[dict, dict[str, records.Record]]:
    run_dir = runs / f"{preset}_gen{gen_length}_{'stop' if stop else 'full'}"
    cfg = compose(
        [
            "model=countdown",
            "task=countdown",
            "model.device=cpu",
            f"+decoder={preset}",
            f"task.gen_length={gen_length}",
            f"task.limit={limit or 'null'}",
            f"batch_size={batch_size}",
            f"out_dir={run_dir}",
            "examples=0",
            "trace=true",
            f"decoder.stop_at_eos={str(stop).lower()}",
        ]
    )
    summary = run(cfg)
    return summary, records.read_records(run_dir / "results.jsonl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="the table (default runs/stop_at_eos/)")
    parser.add_argument(
        "--runs", type=Path, default=Path("runs/stop_at_eos"), help="the runs (resumable), apart from the results"
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 96, 128, 256])
    parser.add_argument("--presets", nargs="+", default=["llada", "fast_dllm"])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=256)
    add_flag(parser, "table in experiments/results/countdown/small/stop_at_eos/")
    args = parser.parse_args(argv)
    args.out = resolve(
        parser,
        args,
        args.out,
        ROOT / "experiments" / "results" / "countdown" / "small" / "stop_at_eos",
        RUNS / "stop_at_eos",
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for gen_length in args.lengths:
        for preset in args.presets:
            try:
                full, full_records = measure(args.runs, preset, gen_length, False, args.limit, args.batch_size)
            except ValueError as error:  # the canvas does not fit the model's context
                rows.append({"preset": preset, "gen_length": gen_length, "skipped": str(error).splitlines()[0]})
                print(f"gen {gen_length} {preset}: skipped ({rows[-1]['skipped']})", flush=True)
                continue
            stopped, stop_records = measure(args.runs, preset, gen_length, True, args.limit, args.batch_size)
            filled = tail_filled(args.runs / f"{preset}_gen{gen_length}_full" / "trace.jsonl")
            same_text = [stop_records[i]["output"] == r["output"] for i, r in full_records.items() if i in stop_records]
            pair = records.paired(records.judged(stop_records), records.judged(full_records))
            rows.append(
                {
                    "preset": preset,
                    "gen_length": gen_length,
                    "items": full["items"],
                    "accuracy_full": full["accuracy"],
                    "accuracy_stop": stopped["accuracy"],
                    "sign_p": pair["sign_p"],
                    "steps_full": full["mean_steps"],
                    "steps_stop": stopped["mean_steps"],
                    "row_forwards_full": full["mean_row_forwards"],
                    "row_forwards_stop": stopped["mean_row_forwards"],
                    "step_saving": round(full["mean_steps"] / max(stopped["mean_steps"], 1e-9), 2),
                    "same_text": round(sum(same_text) / len(same_text), 4),
                    "tail_already_eos": round(sum(filled.values()) / len(filled), 4),
                    "wall_full_s": full["wall_seconds"],
                    "wall_stop_s": stopped["wall_seconds"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stop_at_eos.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "| decoder | gen | accuracy full → stop | steps full → stop (saving) | row-forwards full → stop | same text | tail already EOS |",
        "|---|---:|---|---|---|---:|---:|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['preset']} | {r['gen_length']} | does not fit: {r['skipped']} | | | | |")
            continue
        lines.append(
            f"| {r['preset']} | {r['gen_length']} | {100 * r['accuracy_full']:.1f} % → {100 * r['accuracy_stop']:.1f} % | "
            f"{r['steps_full']} → {r['steps_stop']} (×{r['step_saving']}) | {r['row_forwards_full']} → {r['row_forwards_stop']} | "
            f"{100 * r['same_text']:.1f} % | {100 * r['tail_already_eos']:.1f} % |"
        )
    (args.out / "stop_at_eos.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {args.out}/stop_at_eos.{{json,md}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
