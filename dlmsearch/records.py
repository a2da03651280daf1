"""Results records (one JSON object per item in ``results*.jsonl``): reading, summarising, pairing, writing.

One module for the runner (resume), the sweep collector, the model cards and the benchmark, so
that every reader applies the same rules: the last record of an id wins, a line torn by a crash
is skipped (and, where the runner asks, the file is rewritten without it), and records of items
that ended in error are kept or dropped as the caller says.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlmsearch.stats import sign_test, wilson_interval

Record = dict[str, Any]


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
