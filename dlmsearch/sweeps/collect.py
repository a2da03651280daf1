"""Collect a sweep directory into ``sweep.csv``, ``sweep.md`` and two plots.

``python -m dlmsearch.sweeps.collect SWEEP_DIR [--baseline SPEC] [--group-by KEYS] [--connect]``

A run is any directory under SWEEP_DIR holding ``results*.jsonl`` (Hydra multirun job
directories; a plain ``out_dir`` works too). Its configuration is read from
``.hydra/overrides.yaml`` (the overrides that differ between runs name the run) and from the
resolved config in ``summary.json`` (or ``.hydra/config.yaml`` while a run is unfinished).
Numbers come from the per-item records, so an unfinished run counts what it has.

- accuracy: solved / judged items, with a Wilson 95 % interval;
- steps, row-forwards, token-forwards (where the records count them): means over decoded items;
- wall: the items' summed shares of the steps they decoded in (as in ``summary.json``);
- Pareto fronts (max accuracy, min cost) over mean steps and over mean row-forwards;
- paired against the baseline on the items both judged: solved by only one of the two, and the
  exact two-sided sign test over those discordant items.

``--baseline`` names a run by its label (``arm=fixed_d1 k=4``), its directory name, or
overrides it must carry (``decoder=llada curve.point=p0``; a leading ``+`` is ignored). Without
it, the baseline named by the sweep's own ``collect_sweep`` callback (in ``multirun.yaml``) is
used, if any.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import attrs
import yaml

from dlmsearch import run_records as result_records
from dlmsearch.stats import pareto_front, wilson_interval

CONFIG_SECTIONS = ("decoder", "decoding", "task", "model", "engine", "seed", "batch_size", "deadline_s", "fallback")
COSTS = {
    "mean_steps": "mean steps (sequential model calls)",
    "mean_row_forwards": "mean row-forwards (rows summed over calls)",
}
PLOTS = {"mean_steps": "accuracy_vs_steps.png", "mean_row_forwards": "accuracy_vs_row_forwards.png"}


class SweepError(ValueError):
    """A sweep directory or a baseline that cannot be collected; the message says why."""


@attrs.define
class Run:
    """One configuration of a sweep: where it lives, how it was configured, what it measured."""

    directory: Path
    name: str  # directory relative to the sweep
    job: int | None
    overrides: dict[str, str]  # normalised key (no leading +/~) -> value as written
    config: dict[str, Any]  # flattened resolved config (the CONFIG_SECTIONS)
    records: dict[str, dict[str, Any]]  # id -> last record
    label: str = ""
    group: str = ""

    @property
    def decoded(self) -> list[dict[str, Any]]:
        return [r for r in self.records.values() if not r.get("error")]

    @property
    def judged(self) -> dict[str, bool]:
        return result_records.judged(self.records)

    def metrics(self) -> dict[str, Any]:
        decoded, judged = self.decoded, self.judged
        solved = sum(judged.values())

        def mean(key: str) -> float | None:
            if not decoded or any(key not in r for r in decoded):
                return None
            return sum(r[key] for r in decoded) / len(decoded)

        low, high = wilson_interval(solved, len(judged)) if judged else (None, None)
        return {
            "items": len(self.records),
            "judged": len(judged),
            "solved": solved,
            "accuracy": solved / len(judged) if judged else None,
            "wilson_low": low,
            "wilson_high": high,
            "mean_steps": mean("steps"),
            "mean_row_forwards": mean("row_forwards"),
            "mean_token_forwards": mean("token_forwards"),
            "wall_seconds": sum(r.get("wall_seconds", 0.0) for r in self.records.values()),
            "errors": sum(1 for r in self.records.values() if r.get("error")),
        }


def read_records(directory: Path) -> dict[str, dict[str, Any]]:
    """The records of ``results*.jsonl`` (the last per id wins, torn lines skipped); read only."""
    return result_records.read_records(sorted(directory.glob("results*.jsonl")))


def normalise_key(key: str) -> str:
    return key.lstrip("+~")


def parse_overrides(lines: Iterable[str]) -> dict[str, str]:
    """``key=value`` strings into a dict with normalised keys (``+decoder`` and ``decoder`` alike)."""
    parsed = {}
    for line in lines:
        key, _, value = str(line).partition("=")
        parsed[normalise_key(key.strip())] = value.strip()
    return parsed


def read_config(directory: Path) -> dict[str, Any]:
    """The run's resolved config (its CONFIG_SECTIONS), flattened; empty if none was saved."""
    summary = directory / "summary.json"
    config = None
    if summary.exists():
        try:
            config = json.loads(summary.read_text()).get("config")
        except json.JSONDecodeError:
            config = None
    if config is None and (directory / ".hydra" / "config.yaml").exists():
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        loaded = OmegaConf.load(directory / ".hydra" / "config.yaml")
        config = {}
        for section in CONFIG_SECTIONS:  # resolve what can be resolved outside the Hydra app
            if section in loaded:
                try:
                    config[section] = (
                        OmegaConf.to_container(loaded[section], resolve=True)
                        if OmegaConf.is_config(loaded[section])
                        else loaded[section]
                    )
                except OmegaConfBaseException:  # e.g. ${hydra:...}, which only the Hydra app resolves
                    config[section] = (
                        OmegaConf.to_container(loaded[section], resolve=False)
                        if OmegaConf.is_config(loaded[section])
                        else loaded[section]
                    )
    if not isinstance(config, dict):
        return {}
    return result_records.flatten({k: v for k, v in config.items() if k in CONFIG_SECTIONS})


def job_number(directory: Path) -> int | None:
    match = re.match(r"(\d+)", directory.name)
    return int(match.group(1)) if match else None


def find_runs(sweep: Path) -> list[Run]:
    """Every directory under ``sweep`` with results, in job order."""
    if not sweep.is_dir():
        raise SweepError(f"{sweep} is not a directory")
    # symbolic links are followed: a directory of links to runs of several sweeps compares them
    directories = sorted(
        {
            Path(root)
            for root, _, files in os.walk(sweep, followlinks=True)
            if any(fnmatch(f, "results*.jsonl") for f in files)
        }
    )
    runs = []
    for directory in directories:
        overrides_path = directory / ".hydra" / "overrides.yaml"
        overrides = parse_overrides(yaml.safe_load(overrides_path.read_text()) or []) if overrides_path.exists() else {}
        name = str(directory.relative_to(sweep)) if directory != sweep else directory.name
        runs.append(
            Run(directory, name, job_number(directory), overrides, read_config(directory), read_records(directory))
        )
    if not runs:
        raise SweepError(f"no runs under {sweep} (no results*.jsonl)")
    runs.sort(key=lambda r: (r.job is None, r.job if r.job is not None else 0, r.name))
    return runs


def varying(maps: Sequence[dict[str, Any]]) -> list[str]:
    """Keys whose value is not the same in every map (missing counts as a value), in first-seen order."""
    keys: dict[str, None] = {}
    for m in maps:
        keys.update(dict.fromkeys(m))
    return [k for k in keys if len({json.dumps(m.get(k), sort_keys=True, default=str) for m in maps}) > 1]


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each key's shortest dotted suffix that no other key shares (``decoder.candidates.k`` -> ``k``)."""
    names = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(other != key and (other == suffix or other.endswith("." + suffix)) for other in keys):
                names[key] = suffix
                break
        else:
            names[key] = key
    return names


def label_runs(runs: list[Run], group_by: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """Name every run by its varying overrides (its directory when none vary); group by keys of
    its overrides or resolved config. Returns the varying override and config keys."""
    override_keys = varying([r.overrides for r in runs])
    config_keys = [k for k in varying([r.config for r in runs]) if k not in override_keys]
    names = short_names(override_keys)
    for run in runs:
        parts = [f"{names[k]}={run.overrides[k]}" for k in override_keys if k in run.overrides]
        run.label = " ".join(parts) if parts and len(runs) > 1 else run.name
        values = []
        for key in group_by:
            value = run.overrides.get(normalise_key(key), run.config.get(key))
            if value is not None:
                value = str(value)
                values.append(value.rsplit(".", 1)[-1] if key.endswith("_target_") else value)
        run.group = " ".join(values)
    labels = [r.label for r in runs]
    for run in runs:  # identical labels (a sweep with repeated overrides): add the directory
        if labels.count(run.label) > 1:
            run.label = f"{run.label} [{run.name}]"
    return override_keys, config_keys


def find_baseline(runs: list[Run], spec: str) -> Run:
    """The run ``spec`` names: a label, a directory name, or overrides it carries (all of them)."""
    spec = spec.strip()
    for pick in (lambda r: r.label == spec, lambda r: r.name == spec or r.directory.name == spec):
        hits = [r for r in runs if pick(r)]
        if len(hits) == 1:
            return hits[0]
    wanted = parse_overrides(re.split(r"[\s,]+", spec)) if "=" in spec else None
    if wanted:
        hits = [r for r in runs if all(r.overrides.get(k) == v for k, v in wanted.items())]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise SweepError(f"baseline '{spec}' matches {len(hits)} runs: {'; '.join(r.label for r in hits)}")
    raise SweepError(f"baseline '{spec}' matches no run; runs: {'; '.join(r.label for r in runs)}")


def paired(run: Run, baseline: Run) -> dict[str, Any]:
    """Items judged by both: solved by both, by only one, by neither; the exact sign test."""
    return result_records.paired(run.judged, baseline.judged)


@attrs.define
class Sweep:
    """A collected sweep: its runs, their metrics and pairings, ready to write."""

    directory: Path
    runs: list[Run]
    rows: list[dict[str, Any]]
    override_keys: list[str]
    config_keys: list[str]
    baseline: Run | None
    fronts: dict[str, list[int]]  # cost -> row indices on its Pareto front
    title: str


def collect(sweep_dir: Path | str, baseline: str | None = None, group_by: Sequence[str] = ()) -> Sweep:
    """Read a sweep directory and compute everything the outputs show."""
    sweep_dir = Path(sweep_dir)
    runs = find_runs(sweep_dir)
    override_keys, config_keys = label_runs(runs, group_by)
    base = find_baseline(runs, baseline) if baseline else None
    rows = []
    for run in runs:
        row: dict[str, Any] = {"job": run.job, "dir": run.name, "label": run.label, "group": run.group}
        row.update({k: run.overrides.get(k) for k in override_keys})
        row.update({k: run.config.get(k) for k in config_keys})
        row.update(run.metrics())
        row["baseline"] = run is base
        if base is not None:
            row.update(paired(run, base))
        rows.append(row)
    fronts = {}
    for cost in COSTS:
        usable = [i for i, r in enumerate(rows) if r["accuracy"] is not None and r[cost] is not None]
        front = pareto_front([rows[i][cost] for i in usable], [rows[i]["accuracy"] for i in usable])
        fronts[cost] = [usable[i] for i in front]
        for i, row in enumerate(rows):
            row[f"pareto_{cost.removeprefix('mean_')}"] = i in fronts[cost]
    experiments = {r.overrides.get("experiment") for r in runs} - {None}
    title = f"{'/'.join(sorted(experiments))} sweep" if experiments else f"sweep {sweep_dir.name}"
    return Sweep(sweep_dir, runs, rows, override_keys, config_keys, base, fronts, title)


def write_csv(sweep: Sweep, path: Path) -> None:
    columns: dict[str, None] = {}
    for row in sweep.rows:
        columns.update(dict.fromkeys(row))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        for row in sweep.rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if value >= 1e-3 else f"{value:.1e}"


def table(sweep: Sweep) -> list[str]:
    """The comparison table's markdown lines: one row per configuration (sweep.md's first table;
    a multirun prints it when it ends)."""
    lines = [
        "| # | config | judged | solved | accuracy (95 % CI) | steps | row-forwards | token-forwards | wall s | front |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|:---:|",
    ]
    for row in sweep.rows:
        accuracy = (
            "–"
            if row["accuracy"] is None
            else f"{100 * row['accuracy']:.1f} % [{100 * row['wilson_low']:.1f}, {100 * row['wilson_high']:.1f}]"
        )
        front = ("S" if row["pareto_steps"] else "") + ("R" if row["pareto_row_forwards"] else "")
        name = f"**{row['label']}** (baseline)" if row["baseline"] else row["label"]
        errors = f" ({row['errors']} errors)" if row["errors"] else ""
        lines.append(
            f"| {row['job'] if row['job'] is not None else ''} | {name}{errors} | {row['judged']} | {row['solved']} | {accuracy} | "
            f"{_num(row['mean_steps'], 2)} | {_num(row['mean_row_forwards'], 2)} | {_num(row['mean_token_forwards'], 0)} | "
            f"{_num(row['wall_seconds'], 1)} | {front} |"
        )
    return lines


def write_markdown(sweep: Sweep, path: Path, plots: Sequence[str], note: str = "") -> None:
    rows, base = sweep.rows, sweep.baseline
    sizes = sorted({r["judged"] for r in rows})
    lines = [
        f"# {sweep.title}",
        "",
        (
            f"`{sweep.directory}`: {len(rows)} configurations, {'/'.join(map(str, sizes))} judged items each. "
            "Accuracy: solved / judged with its Wilson 95 % interval. Steps: sequential model calls; "
            "row-forwards: rows summed over calls; token-forwards: positions the model computed (means over "
            "decoded items). Wall: the items' summed shares of their batches' time. Front: on the Pareto front "
            "(max accuracy, min cost) over steps (S) and row-forwards (R)."
        ),
        "",
    ]
    if sweep.override_keys:
        lines += [f"Configurations differ in: {', '.join(f'`{k}`' for k in sweep.override_keys)}.", ""]
    lines += [*table(sweep), ""]
    for image in plots:
        lines += [f"![{image.removesuffix('.png').replace('_', ' ')}]({image})", ""]
    if note:
        lines += [note, ""]
    lines += ["## Paired against the baseline", ""]
    if base is None:
        lines += ["No baseline named (`--baseline`): no paired tests.", ""]
    else:
        lines += [
            (
                f"Every configuration against **{base.label}** (`{base.name}`) on the items both judged: solved by both, "
                "by only one of the two, by neither, and the exact two-sided sign-test p-value over the items only one "
                "solved (binomial, p = 1/2). Δ: accuracy difference on those items, in points."
            ),
            "",
            "| # | config | items | both | only config | only baseline | neither | Δ points | sign-test p |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in rows:
            if row["baseline"]:
                continue
            n = row["paired_items"]
            delta = "–" if not n else f"{100 * (row['only_config'] - row['only_baseline']) / n:+.1f}"
            lines.append(
                f"| {row['job'] if row['job'] is not None else ''} | {row['label']} | {n} | {row['both']} | {row['only_config']} | "
                f"{row['only_baseline']} | {row['neither']} | {delta} | {_p(row['sign_p'])} |"
            )
        lines.append("")
    path.write_text("\n".join(lines))


def plot(sweep: Sweep, cost: str, path: Path, connect: bool = False) -> None:
    """Accuracy (with Wilson intervals) against ``cost``: one marker per configuration, colour by
    group, the Pareto front as a step line, front points and the baseline labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in sweep.rows if r["accuracy"] is not None and r[cost] is not None]
    fig, ax = plt.subplots(figsize=(9, 5.8), dpi=110)
    _plot_groups(ax, plt, rows, cost, connect)
    _plot_front(ax, sweep, rows, cost)
    _mark_baseline(ax, rows, cost)
    _label_axes(ax, sweep, cost)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_groups(ax: Any, plt: Any, rows: list[dict[str, Any]], cost: str, connect: bool) -> None:
    """One marker and colour per group, so configurations that differ in one setting read as a series."""
    groups = list(dict.fromkeys(r["group"] for r in rows))
    colours = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20")
    markers = "osD^v<>Ph*X"
    for g, group in enumerate(groups):
        members = sorted(((r[cost], r) for r in rows if r["group"] == group), key=lambda pair: pair[0])
        xs = [x for x, _ in members]
        ys = [100 * r["accuracy"] for _, r in members]
        low = [y - 100 * r["wilson_low"] for y, (_, r) in zip(ys, members)]
        high = [100 * r["wilson_high"] - y for y, (_, r) in zip(ys, members)]
        colour = colours(g % colours.N)
        ax.errorbar(
            xs,
            ys,
            yerr=[low, high],
            fmt=markers[g % len(markers)],
            color=colour,
            ms=6,
            alpha=0.85,
            elinewidth=0.8,
            capsize=2,
            label=group or None,
            linestyle="-" if connect else "none",
            lw=0.9,
        )


def _plot_front(ax: Any, sweep: Sweep, rows: list[dict[str, Any]], cost: str) -> None:
    """The Pareto front as a step line with its points labelled: the configurations worth choosing."""
    front = sweep.fronts[cost]
    if not front:
        return
    fx = [sweep.rows[i][cost] for i in front]
    fy = [100 * sweep.rows[i]["accuracy"] for i in front]
    right = max(r[cost] for r in rows)
    ax.step(
        fx + [right * 1.02],
        fy + [fy[-1]],
        where="post",
        color="black",
        lw=1.4,
        alpha=0.7,
        zorder=1,
        label="Pareto front (max accuracy, min cost)",
    )
    for i in front:
        row = sweep.rows[i]
        ax.annotate(
            row["label"],
            (row[cost], 100 * row["accuracy"]),
            xytext=(4, -10),
            textcoords="offset points",
            fontsize=7,
        )


def _mark_baseline(ax: Any, rows: list[dict[str, Any]], cost: str) -> None:
    """A red ring round the baseline, the point every paired test compares against."""
    base = next((r for r in rows if r["baseline"]), None)
    if base is not None:
        ax.scatter(
            [base[cost]],
            [100 * base["accuracy"]],
            s=200,
            facecolors="none",
            edgecolors="red",
            lw=1.5,
            zorder=5,
            label=f"baseline: {base['label']}",
        )


def _label_axes(ax: Any, sweep: Sweep, cost: str) -> None:
    """Axis names, title, grid and (where anything is labelled) the legend, so the figure reads on its own."""
    ax.set_xlabel(COSTS[cost])
    ax.set_ylabel("accuracy (%), Wilson 95 % interval")
    ax.set_title(f"{sweep.title}: accuracy vs {COSTS[cost].split(' (')[0].removeprefix('mean ')}")
    ax.grid(True, alpha=0.3)
    handles, _names = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=8, loc="best", framealpha=0.85)


def write_all(sweep: Sweep, out: Path | None = None, connect: bool = False) -> list[Path]:
    """sweep.csv, the plots and sweep.md into ``out`` (the sweep directory by default)."""
    out = Path(out) if out is not None else sweep.directory
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "sweep.csv"]
    write_csv(sweep, written[0])
    plots = []
    try:
        import matplotlib  # noqa: F401  (the plot extra: pip install -e ".[plot]")
    except ImportError:
        note = 'Plots need matplotlib: `pip install -e ".[plot]"`, then `python -m dlmsearch.sweeps.collect` again.'
    else:
        note = ""
        for cost, name in PLOTS.items():
            if any(r["accuracy"] is not None and r[cost] is not None for r in sweep.rows):
                plot(sweep, cost, out / name, connect)
                plots.append(name)
                written.append(out / name)
    write_markdown(sweep, out / "sweep.md", plots, note)
    written.append(out / "sweep.md")
    return written


def callback_settings(sweep_dir: Path) -> dict[str, Any]:
    """The ``collect_sweep`` callback's settings saved in the sweep's ``multirun.yaml``, if any."""
    path = sweep_dir / "multirun.yaml"
    if not path.exists():
        return {}
    try:
        saved = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}
    callbacks = ((saved.get("hydra") or {}).get("callbacks") or {}) if isinstance(saved, dict) else {}
    for settings in callbacks.values():
        if isinstance(settings, dict) and str(settings.get("_target_", "")).endswith("CollectSweep"):
            return settings
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlmsearch.sweeps.collect", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun directory (or any directory of runs)")
    parser.add_argument(
        "--baseline", help="label, directory name, or overrides of the run to pair every config against"
    )
    parser.add_argument(
        "--group-by", help="comma-separated override or config keys that colour the plots (e.g. decoder.name)"
    )
    parser.add_argument(
        "--connect", action="store_true", default=None, help="join each group's points by cost (curves)"
    )
    parser.add_argument("--out", type=Path, help="where to write (default: the sweep directory)")
    args = parser.parse_args(argv)
    saved = callback_settings(args.sweep_dir)
    baseline = args.baseline if args.baseline is not None else saved.get("baseline")
    group_by = args.group_by.split(",") if args.group_by else list(saved.get("group_by") or [])
    connect = args.connect if args.connect is not None else bool(saved.get("connect", False))
    try:
        sweep = collect(args.sweep_dir, baseline or None, group_by)
    except SweepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    written = write_all(sweep, args.out, connect)
    print(f"{len(sweep.rows)} runs collected: {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
