"""Variable-length decoding measured: fixed lengths against DAEDAL and rho-EOS started short.

Each arm is one ``python -m dlmsearch`` run on a shipped Countdown model (resumable: a run's
directory is reused), all with Fast-dLLM's 0.9 threshold as the commit rule so that only the
length differs. For each tier the table gives accuracy (95 % Wilson interval), mean token-forwards
(positions the model computed: what a longer canvas costs), model calls, the final length and the
effective-token ratio (the share of the generation before the first end token); the figure plots
accuracy against token-forwards.

    python experiments/length_policies.py --model countdown_varied --tiers validation --limit 64   # runs/length/ (tuning)
    python experiments/length_policies.py --model countdown_varied --tiers small --write-committed  # experiments/results/length/, docs/length_policies.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from outputs import ROOT, RUNS, add_flag, resolve

from dlmsearch.stats import wilson_interval

START, CEILING = 8, 64
GROW = (f"task.gen_length={START}", f"decoder.length.max_length={CEILING}")
ARMS: dict[str, list[str]] = {
    "fixed 8": ["+decoder=fast_dllm", "task.gen_length=8"],
    "fixed 16": ["+decoder=fast_dllm", "task.gen_length=16"],
    "fixed 32": ["+decoder=fast_dllm", "task.gen_length=32"],
    "fixed 64": ["+decoder=fast_dllm", "task.gen_length=64"],
    "daedal (published)": ["+decoder=daedal", *GROW],
    # tuned on the validation tier: the best accuracy there, ties broken by fewer token-forwards
    # (eos_check_tokens 4, 8, 16 and 32 all solved 70.3 % of 64 problems, at 300, 456, 485 and 723)
    "daedal (eos_check_tokens=4)": ["+decoder=daedal", *GROW, "decoder.length.eos_check_tokens=4"],
    "rho_eos (published)": ["+decoder=rho_eos", *GROW],
    # tuned on the validation tier (exp: 62.5 %, const: 67.2 %, linear: 39.1 % of 64 problems)
    "rho_eos (scheduler=const)": ["+decoder=rho_eos", *GROW, "decoder.length.scheduler=const"],
    "rho_eos (released density)": ["+decoder=rho_eos", *GROW, "decoder.length.density=tail_confidence"],
}


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def run_arm(name: str, tier: str, args: argparse.Namespace, runs: Path) -> dict:
    """One arm on one tier through the CLI (its run directory is reused, so an interrupted run resumes)."""
    out = runs / tier / slug(name)
    command = [
        sys.executable,
        "-m",
        "dlmsearch",
        f"model={args.model}",
        *([f"model.path={args.model_path}"] if args.model_path else []),
        "task=countdown",
        f"task.tier={tier}",
        f"task.block_length={args.block_length}",
        f"out_dir={out}",
        f"hydra.run.dir={out}",
        *([f"task.limit={args.limit}"] if args.limit else []),
        *ARMS[name],
    ]
    print("$", " ".join(command[1:]), flush=True)
    done = subprocess.run(command, cwd=ROOT, text=True, capture_output=True, check=False)
    if done.returncode:
        raise SystemExit(f"{name} on {tier} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    correct = sum(bool(r["correct"]) for r in records)
    low, high = wilson_interval(correct, len(records))
    return {
        "arm": name,
        "tier": tier,
        "items": len(records),
        "accuracy": correct / len(records),
        "low": low,
        "high": high,
        "token_forwards": summary["mean_token_forwards"],
        "steps": summary["mean_steps"],
        "length": summary.get("mean_length"),
        "effective_token_ratio": summary.get("effective_token_ratio"),
    }


def table(rows: list[dict]) -> str:
    head = "| tier | arm | items | accuracy (95 % CI) | token-forwards | model calls | length | effective-token ratio |"
    lines = [head, "|---|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['tier']} | {r['arm']} | {r['items']} | {100 * r['accuracy']:.1f} % "
            f"({100 * r['low']:.1f}–{100 * r['high']:.1f}) | {r['token_forwards']:.0f} | {r['steps']:.1f} | "
            f"{r['length']:.1f} | {r['effective_token_ratio']:.3f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Accuracy (95 % interval) against token-forwards per problem, one panel per tier, one legend entry per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers = sorted({r["tier"] for r in rows}, key=[r["tier"] for r in rows].index)
    figure, axes = plt.subplots(1, len(tiers), figsize=(8.5 * len(tiers), 5), squeeze=False)
    for axis, tier in zip(axes[0], tiers):
        for index, r in enumerate(r for r in rows if r["tier"] == tier):
            fixed = r["arm"].startswith("fixed")
            axis.errorbar(
                r["token_forwards"],
                100 * r["accuracy"],
                yerr=[[100 * (r["accuracy"] - r["low"])], [100 * (r["high"] - r["accuracy"])]],
                fmt="o" if fixed else "s^vD"[index % 4],
                color=str(0.2 + 0.15 * index) if fixed else None,
                capsize=3,
                label=f"{r['arm']}: {100 * r['accuracy']:.1f} % at {r['token_forwards']:.0f}",
            )
        axis.set_xscale("log")
        axis.set_xlabel("mean token-forwards per problem (log)")
        axis.set_ylabel("solved (%)")
        axis.set_title(
            f"Countdown {tier}: fixed lengths (grey) and length policies started at {START}, ceiling {CEILING}"
        )
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiers", nargs="+", default=["validation", "validation4"])
    parser.add_argument("--limit", type=int, default=None, help="the first N problems of each tier (default: all)")
    parser.add_argument("--model", default="countdown", help="a shipped Countdown model (model=...)")
    parser.add_argument("--model-path", default=None, help="the model's directory in place of the shipped one")
    parser.add_argument("--name", default=None, help="the runs' and tables' name (default: --model)")
    parser.add_argument("--block-length", type=int, default=8)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), help="which arms (default: all)")
    add_flag(parser, "table in experiments/results/length/ and docs/length_policies.png")
    args = parser.parse_args(argv)
    out = resolve(parser, args, None, ROOT / "experiments" / "results" / "length", RUNS / "length" / "tables")
    figure = ROOT / "docs" / "length_policies.png" if args.write_committed else out / "length_policies.png"
    name = args.name or args.model
    runs = RUNS / "length" / name
    rows = [run_arm(name, tier, args, runs) for tier in args.tiers for name in args.arms]
    out.mkdir(parents=True, exist_ok=True)
    text = table(rows)
    command = "python experiments/length_policies.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / f"length_policies_{name}.md").write_text(f"{text}\n\nMeasured by `{command}`.\n")
    (out / f"length_policies_{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, figure)
    print(text)
    print(f"wrote {out} and {figure}")


if __name__ == "__main__":
    main()
