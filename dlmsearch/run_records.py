"""Results records (one JSON object per item in ``results*.jsonl``): reading, summarising, pairing, writing.

One module for the runner (resume), the sweep collector, the model cards and the benchmark, so
that every reader applies the same rules: the last record of an id wins, a line torn by a crash
is skipped (and, where the runner asks, the file is rewritten without it), and records of items
that ended in error are kept or dropped as the caller says.

A run's directory also says which config wrote its records (``run.json``: :class:`RunIdentity`),
so that a rerun into it resumes only the same run (:func:`check_same_run`), and how far the run
got (its ``status``: running, finished, interrupted, or failed with its ``error``; :func:`write_status`).
``run.json`` is written when decoding starts: a run that failed before has none.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from dlmsearch.stats import sign_test, wilson_interval

Record = dict[str, Any]

# Per-record fields that measure time, not what was decoded: left out wherever records of two runs are compared.
TIMING_FIELDS = ("wall_seconds", "latency_seconds")

RUN_FILE = "run.json"

# Settings that decide how or where a run is carried out, never what its records say: a rerun
# with other values of these resumes the same records, so they are left out of a run's
# fingerprint. Every other setting is in it: the model, the task, the engine's sampling, the
# cache, the decoder, the seed, ``fallback`` (it decodes failed items) and ``deadline_s`` (it
# decides which samples finish with the base rule; its effect depends on the machine's speed,
# but another deadline is another experiment).
RESULT_NEUTRAL_KEYS: tuple[str, ...] = (
    "batch_size",  # samples decoded together: results do not depend on it (tests/test_run_records.py)
    "engine.row_budget",  # rows per forward chunk (auto: what the free memory allows): same steps and outputs
    "task.limit",  # how many items: a larger limit extends a run
    "out_dir",  # where the records are
    "examples",  # decoded items printed at the end
    "trace",  # whether trace.jsonl is written too (it then covers only the items decoded with it on)
    "hydra",  # Hydra's own settings (run directories, launchers), where a config carries them
)


def read_records(paths: Path | Sequence[Path], keep_errors: bool = True, repair: bool = False) -> dict[str, Record]:
    """``id -> record`` over the files in order (the last record of an id wins; torn lines skipped).

    ``keep_errors=False`` leaves out items whose last record is an error (the runner decodes
    them again). ``repair`` rewrites a single file without its torn lines, so that appended
    records start on a clean line.
    """
    files = [paths] if isinstance(paths, Path) else list(paths)
    records: dict[str, Record] = {}
    for path in files:
        if not path.exists():
            continue
        text = path.read_text()
        torn = False
        kept: dict[str, Record] = {}
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                torn = True
                continue
            if not isinstance(record, dict) or "id" not in record:
                continue
            kept.pop(str(record["id"]), None)
            kept[str(record["id"])] = record
        if repair and (torn or (text and not text.endswith("\n"))):
            write_records(path, kept.values())
        records.update(kept)
    if not keep_errors:
        records = {i: r for i, r in records.items() if not r.get("error")}
    return records


def write_records(path: Path, records: Iterable[Record]) -> None:
    """Replace ``path`` with these records, one line each."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile by nearest rank (numpy's ``inverted_cdf``), 0 for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), q, method="inverted_cdf")) if len(values) else 0.0


def judged(records: dict[str, Record] | Iterable[Record]) -> dict[str, bool]:
    """``id -> correct`` for decoded items the task could judge."""
    values = records.values() if isinstance(records, dict) else records
    return {str(r["id"]): bool(r["correct"]) for r in values if not r.get("error") and r.get("correct") is not None}


def accuracy_interval(records: dict[str, Record] | Iterable[Record]) -> tuple[int, int, float, float]:
    """Solved, judged, and the Wilson 95 % interval of the accuracy."""
    found = judged(records)
    solved = sum(found.values())
    low, high = wilson_interval(solved, len(found))
    return solved, len(found), low, high


def paired(mine: dict[str, bool], theirs: dict[str, bool]) -> dict[str, Any]:
    """Items judged in both: solved by both, by only one, by neither, and the exact sign test."""
    common = [i for i in mine if i in theirs]
    only_mine = sum(1 for i in common if mine[i] and not theirs[i])
    only_theirs = sum(1 for i in common if theirs[i] and not mine[i])
    both = sum(1 for i in common if mine[i] and theirs[i])
    return {
        "paired_items": len(common),
        "both": both,
        "only_config": only_mine,
        "only_baseline": only_theirs,
        "neither": len(common) - both - only_mine - only_theirs,
        "sign_p": sign_test(only_mine, only_theirs) if common else None,
    }


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1, "c": [2]}}`` as ``{"a.b": 1, "a.c": "[2]"}`` (lists as their JSON text, so
    that every value compares and prints as one cell: the sweep tables and the resume check)."""
    if isinstance(node, Mapping):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(node, list):
        return {prefix: json.dumps(node)}
    return {prefix: node}


def result_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config without :data:`RESULT_NEUTRAL_KEYS`: what a run's records depend on."""
    kept = json.loads(json.dumps(config, default=str))  # a deep copy of plain data
    for dotted in RESULT_NEUTRAL_KEYS:
        *parents, last = dotted.split(".")
        node = kept
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return kept


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """A short hash of :func:`result_config`: equal for configs whose records are the same."""
    text = json.dumps(result_config(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any], most: int = 3) -> str:
    """The dotted keys whose values differ, as ``key: old -> new``, the shallowest first (where the
    decoder's name sits), at most ``most`` of them and how many more."""
    before, after = flatten(result_config(old)), flatten(result_config(new))
    keys = list(dict.fromkeys([*before, *after]))
    changed = sorted(
        (k for k in keys if before.get(k, _ABSENT) != after.get(k, _ABSENT)),
        key=lambda k: (k.count("."), keys.index(k)),
    )
    shown = [f"{k}: {_short(k, before.get(k, _ABSENT))} -> {_short(k, after.get(k, _ABSENT))}" for k in changed[:most]]
    more = len(changed) - len(shown)
    return (
        ", ".join(shown) + (f" and {more} more" if more > 0 else "") if shown else "an empty section added or removed"
    )


_ABSENT = object()


def _short(key: str, value: Any, width: int = 40) -> str:
    """A value as a message shows it: strings bare, a ``_target_`` by its class name, long ones cut."""
    if value is _ABSENT:
        return "(absent)"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if key.endswith("_target_") and isinstance(value, str):
        text = value.rsplit(".", 1)[-1]
    return text if len(text) <= width else text[: width - 3] + "..."


@attrs.frozen
class RunIdentity:
    """What wrote a run's records: the fingerprint of its resolved config, that config (without
    the result-neutral keys) and the overrides it was composed with, kept in ``run.json``."""

    fingerprint: str
    config: dict[str, Any]
    overrides: list[str] = attrs.field(factory=list)

    @classmethod
    def of(cls, config: Mapping[str, Any], overrides: Sequence[str] = ()) -> RunIdentity:
        return cls(config_fingerprint(config), result_config(config), list(overrides))

    @classmethod
    def read(cls, out: Path) -> RunIdentity | None:
        """The identity stored in ``out`` (None: none, or a file this cannot read)."""
        try:
            stored = json.loads((out / RUN_FILE).read_text())
            return cls(str(stored["fingerprint"]), dict(stored["config"]), list(stored.get("overrides", [])))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, out: Path, status: str = "running") -> None:
        """Write ``out/run.json`` as the run starts decoding (``status`` running)."""
        _replace_run_file(out, {**attrs.asdict(self), "status": status})


def write_status(out: Path, status: str, error: BaseException | None = None) -> None:
    """Say in ``out/run.json`` how the run ended: ``finished``, ``interrupted`` (a signal; the same
    command resumes) or ``failed`` while decoding, with its error in one line (``error``)."""
    try:
        stored = json.loads((out / RUN_FILE).read_text())
    except (OSError, ValueError):
        return  # no run.json: this rank never started decoding, nothing to say
    stored.pop("error", None)
    stored["status"] = status
    if error is not None:
        text = str(error).strip()
        stored["error"] = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
    _replace_run_file(out, stored)


def _replace_run_file(out: Path, content: dict[str, Any]) -> None:
    """Replace ``out/run.json`` at once (each torchrun rank may write the same file)."""
    staging = out / f"{RUN_FILE}.{os.getpid()}.tmp"
    staging.write_text(json.dumps(content, indent=1) + "\n")
    staging.replace(out / RUN_FILE)


def legacy_identity(out: Path) -> RunIdentity | None:
    """For a directory written before ``run.json`` existed: the config its ``summary.json`` holds."""
    try:
        config = json.loads((out / "summary.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return RunIdentity.of(config) if isinstance(config, dict) else None


def check_same_run(out: Path, identity: RunIdentity, records: int) -> None:
    """Refuse, in one line, to resume ``records`` records that another config wrote.

    The stored ``run.json`` decides; a directory from before it existed is checked against the
    config in its ``summary.json`` (written at the end of every run), and refused when it has
    neither, since its records' config cannot be known. Without records nothing is refused.
    """
    if records == 0:
        return
    stored = RunIdentity.read(out) or legacy_identity(out)
    afresh = f"use another out_dir, or delete {out} to start afresh"
    if stored is None:
        raise ValueError(
            f"out_dir={out} holds {records} records but no {RUN_FILE} or summary.json to tell which config wrote them (written by an older dlmsearch): {afresh}"
        )
    if stored.fingerprint != identity.fingerprint:
        raise ValueError(
            f"out_dir={out} holds {records} records of another config ({config_changes(stored.config, identity.config)}): {afresh}"
        )


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate counters; accuracy only over items the task could judge.

    ``wall_seconds`` is the run's decoding wall time: the sum of the records' ``wall_seconds``,
    each sample's share of the steps it decoded in (a step's time split evenly among the samples
    it advanced; a sample decoded again alone adds that time), so it survives resumes and leaves
    out model loading and the work on samples a signal cut short. The latency percentiles are of
    the samples' ``latency_seconds``, from admission to finish (records from before it existed
    have none and are left out of them).
    """
    n = len(records)
    decoded = [r for r in records if not r.get("error")]
    judged = [r["correct"] for r in decoded if r["correct"] is not None]
    mean = lambda key: round(sum(r.get(key, 0) for r in decoded) / max(len(decoded), 1), 3)
    wall = sum(r["wall_seconds"] for r in records)
    latencies = [r["latency_seconds"] for r in decoded if "latency_seconds" in r]
    effective, length = (sum(r.get(key, 0) for r in decoded) for key in ("effective_tokens", "length"))
    return {
        "items": n,
        "accuracy": round(sum(judged) / len(judged), 4) if judged else None,
        "mean_steps": mean("steps"),
        "mean_row_forwards": mean("row_forwards"),
        "mean_token_forwards": mean("token_forwards"),
        "mean_tokens_committed": mean("tokens_committed"),
        "mean_length": mean("length"),  # the generations' columns, and the share of them before an end token:
        "effective_token_ratio": round(effective / length, 4) if length else None,
        "mean_live_particles": mean("live_particles") if any("live_particles" in r for r in decoded) else 1.0,
        "wall_seconds": round(wall, 2),
        "latency_p50_s": round(percentile(latencies, 50), 4),
        "latency_p95_s": round(percentile(latencies, 95), 4),
        "latency_p99_s": round(percentile(latencies, 99), 4),
        "samples_per_s": round(n / wall, 3) if wall else None,
        "tokens_per_s": round(sum(r.get("tokens_committed", 0) for r in decoded) / wall, 2) if wall else None,
        "errors": sum(1 for r in records if r.get("error")),
        "fallbacks": sum(1 for r in records if r.get("fallback")),
        "deadline_hits": sum(1 for r in records if r.get("deadline_hit")),
    }
