"""What the model cards share: run one (tier, decoder) through the normal runner, pair it with a
baseline on the same items, and draw accuracy against steps.

Each run goes through :func:`dlmsearch.run.run` into its own directory, so an interrupted card
resumes where it stopped, and every number in a card is one a ``python -m dlmsearch`` run gives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dlmsearch import run_records as records
from dlmsearch.config import compose
from dlmsearch.run import run


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """``label=preset:override,override`` (overrides optional)."""
    label, _, rest = text.partition("=")
    preset, _, overrides = rest.partition(":")
    return label, preset, [o for o in overrides.split(",") if o]


def measure(
    out_dir: Path,
    tier: str,
    label: str,
    preset: str,
    overrides: list[str],
    base: list[str],
    limit: int | None,
    batch_size: int,
    extras: Callable[[dict[str, records.Record]], dict] | None = None,
) -> dict:
    """One decoder on one tier: accuracy with its Wilson interval, counters, and the ids it got right.
    ``extras`` adds fields computed from the run's records (read once)."""
    cfg = compose(
        [
            *base,
            f"+decoder={preset}",
            f"task.tier={tier}",
            f"task.limit={limit or 'null'}",
            f"batch_size={batch_size}",
            f"out_dir={out_dir}",
            "examples=0",
            *overrides,
        ]
    )
    summary = run(cfg)
    found = records.read_records(out_dir / "results.jsonl")
    solved = records.judged(found)
    _, _, low, high = records.accuracy_interval(found)
    return {
        "tier": tier,
        "label": label,
        "preset": preset,
        "overrides": overrides,
        "solved_ids": sorted(i for i, ok in solved.items() if ok),
        "ids": sorted(solved),
        "wilson_low": low,
        "wilson_high": high,
        "mean_live_particles": summary.get("mean_live_particles", 1.0),
        **{k: summary[k] for k in ("items", "accuracy", "mean_steps", "mean_row_forwards", "wall_seconds")},
        "mean_token_forwards": summary.get("mean_token_forwards"),
        **(extras(found) if extras else {}),
    }


def paired(row: dict, baseline: dict) -> tuple[int, int, float]:
    """Items solved only by ``row``, only by ``baseline``, and the exact sign test's p-value."""
    assert row["ids"] == baseline["ids"], "paired tests need the same items"
    found = records.paired(
        {i: i in row["solved_ids"] for i in row["ids"]}, {i: i in baseline["solved_ids"] for i in baseline["ids"]}
    )
    return found["only_config"], found["only_baseline"], found["sign_p"]


def plot_accuracy_vs_steps(rows: list[dict], tiers: list[str], title: str, unit: str, path: Path) -> None:
    """One panel per tier: each decoder's accuracy against its mean steps (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(tiers), figsize=(6 * len(tiers), 4.5), squeeze=False)
    for axis, tier in zip(axes[0], tiers):
        for row in (r for r in rows if r["tier"] == tier):
            axis.scatter(row["mean_steps"], 100 * row["accuracy"], s=40)
            axis.annotate(
                row["label"],
                (row["mean_steps"], 100 * row["accuracy"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
            )
        axis.set_xscale("log")
        axis.set_xlabel(f"mean steps per {unit} (sequential model calls, log scale)")
        axis.set_ylabel("solved %")
        axis.set_title(f"{tier} tier")
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


if __name__ == "__main__":  # a module the model cards import; run, it only explains itself
    import argparse

    argparse.ArgumentParser(
        description=__doc__ + "\nImported by the model-card scripts; nothing to run on its own.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args()


ASKING = "## Asking it"


def write_card(path: Path, text: str) -> None:
    """Write a generated model card, keeping its hand-written "Asking it" section (the prompt the
    model expects, with requests ``tests/test_shipped_doors.py`` sends) before "## Training"."""
    old = path.read_text() if path.exists() else ""
    start = old.find(ASKING)
    if start >= 0 and ASKING not in text:
        end = old.find("\n## ", start + len(ASKING))
        section = old[start : end + 1 if end >= 0 else len(old)].rstrip("\n") + "\n\n"
        at = text.find("## Training")
        text = text[:at] + section + text[at:] if at >= 0 else text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
