"""A run's output directory: checked writable and claimed before any model loads, and left as it
was found where the run never started decoding (a failed start leaves no empty folders behind)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dlmsearch.run_records import RunIdentity, check_same_run, read_records

# What Hydra writes into a job's directory (and a sweep's) before the job runs.
HYDRA_FILES = frozenset({".hydra", "multirun.yaml"})


def check_writable(out: Path) -> Path | None:
    """Fail before any decoding when the output directory cannot be written.

    Creates ``out`` (and its parents) and writes and removes a probe file in it; any OSError
    (no permission, a read-only or full disk, a file where a directory should be) becomes one
    ValueError line naming the directory. Returns the outermost directory it created (None: ``out``
    was there), for :func:`removed_on_failure`.
    """
    out = Path(out)
    created = next((p for p in reversed((out, *out.parents)) if not p.exists()), None)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".dlmsearch-write-check-") as probe:
            probe.write(b"ok")
            probe.flush()
    except OSError as error:
        existing = next((p for p in (out, *out.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            reason = "it is a file" if existing == out else f"{existing} is a file"
        else:
            reason = error.strerror or str(error)
        raise ValueError(f"out_dir={out} cannot be written: {reason}") from error
    return created


@contextmanager
def removed_on_failure(out: Path) -> Iterator[None]:
    """:func:`check_writable` for ``out``; where the body raises, the directories it created are
    removed again if they hold nothing (the body is what a run does before it decodes)."""
    created = check_writable(out)
    try:
        yield
    except BaseException:
        if created is not None:
            discard_unused(Path(out), created.parent)
        raise


def claim(out: Path, identity: RunIdentity) -> RunIdentity:
    """Check that ``out``'s records come from this run's config (else one line and nothing
    decoded), before any model loads. Returns the identity ``run.json`` is to keep once decoding
    starts: the stored one where records are resumed under it, else this run's."""
    records = len(read_records(sorted(out.glob("results*.jsonl"))))
    check_same_run(out, identity, records)
    stored = RunIdentity.read(out)
    return identity if records == 0 or stored is None else stored


def discard_unused(directory: Path, stop: Path, own: frozenset[str] = HYDRA_FILES) -> None:
    """Remove ``directory`` where it holds nothing but Hydra's own files (``own``: a fresh job
    directory, an empty one), then each folder above it that is left so (the date folder, a
    sweep's), never ``stop`` or a folder above it (the working directory)."""
    directory, stop = directory.absolute(), stop.absolute()
    kept = {stop, *stop.parents}
    while directory not in kept and directory.is_dir() and all(p.name in own for p in directory.iterdir()):
        shutil.rmtree(directory)
        directory = directory.parent
