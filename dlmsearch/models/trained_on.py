"""What a checkpoint was trained to do, declared in its own directory (``trained_on.json``).

A task that leaves its generation length, block length, prompt template or tier unset takes
them from here (``conf/config.yaml``: ``trained_on``), so ``model=llada model.path=<a shipped
directory>`` decodes the way the model was trained, as ``model=countdown`` does; a directory
without the file declares nothing and the task's own defaults apply.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

FILE = "trained_on.json"
KEYS = {
    "template": str,  # the prompt format it was trained on ({target}, {numbers} for Countdown)
    "gen_length": int,  # the tokens it writes
    "block_length": int,  # the block size it decodes best with (a block model: its attention block)
    "tier": str,  # the task's problem set it was trained for
    "token_frequencies": str,  # PC-Sampler's prior, a file of the directory
}


def read_trained_on(path: str | None) -> dict[str, Any]:
    """The declared settings of the checkpoint at ``path`` (empty: no directory, or no file); a
    file name among them becomes a path inside the directory. Read once per version of the file
    (a config resolves one key per call, several times per composition)."""
    source = Path(path) / FILE if path else None
    if source is None or not source.is_file():
        return {}
    return dict(_read(str(source), source.stat().st_mtime_ns))


@functools.lru_cache(maxsize=32)
def _read(source: str, version: int) -> dict[str, Any]:
    """The checked settings of ``source`` (``version``: its modification time, so an edit is read again)."""
    path = Path(source).parent
    settings = json.loads(Path(source).read_text())
    for key, value in settings.items():
        if key not in KEYS:
            raise ValueError(f"{source}: unknown setting {key!r}; a checkpoint may declare {', '.join(KEYS)}")
        if not isinstance(value, KEYS[key]):
            raise ValueError(f"{source}: {key} must be a {KEYS[key].__name__}, got {value!r}")
    if "token_frequencies" in settings:
        settings["token_frequencies"] = str(Path(path) / settings["token_frequencies"])
    return settings


def write_trained_on(directory: Path, **settings: Any) -> None:
    """Declare what the checkpoint in ``directory`` was trained to do (the training scripts call it)."""
    unknown = set(settings) - set(KEYS)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; a checkpoint may declare {', '.join(KEYS)}")
    (directory / FILE).write_text(json.dumps(settings, indent=2) + "\n")
