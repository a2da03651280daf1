"""Where the experiment scripts write: a quick look never overwrites a committed result.

Every script here that can regenerate something committed (a table under ``experiments/results/``,
a figure under ``docs/``, a shipped model, tier or model card under ``dlmsearch/data/``) writes by
default under ``runs/`` (git-ignored). ``--write-committed`` writes the committed files instead, and
an output path given explicitly that is committed (under those three folders, or any path git
tracks) is refused without it:

    python experiments/serve_load.py                       # runs/serve_load/
    python experiments/serve_load.py --write-committed     # experiments/results/serve/ (what docs/serving.md shows)
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"
FLAG = "--write-committed"
# Folders whose every file is a committed result, figure or shipped file (git tracks the rest of the tree too).
COMMITTED = tuple(ROOT / p for p in ("docs", "experiments/results", "dlmsearch/data"))


def add_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--write-committed``: write ``what`` (the committed outputs) in place."""
    parser.add_argument(
        FLAG,
        dest="write_committed",
        action="store_true",
        help=f"regenerate the committed {what}; without it nothing git tracks is written (the default outputs go under runs/)",
    )


def committed(path: Path | str) -> bool:
    """Whether ``path`` (relative to the working directory) is a committed file or holds one."""
    path = Path(path).absolute().resolve()
    if any(path == c or c in path.parents for c in COMMITTED):
        return True
    if path != ROOT and ROOT not in path.parents:
        return False
    try:
        found = subprocess.run(
            ["git", "ls-files", "--", str(path.relative_to(ROOT)) or "."],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return found.returncode == 0 and bool(found.stdout.strip())


def check(parser: argparse.ArgumentParser, args: argparse.Namespace, *paths: Path | str | None) -> None:
    """Refuse (exit 2) any of ``paths`` that is committed unless ``--write-committed`` was given."""
    for path in paths:
        if path is not None and not args.write_committed and committed(path):
            parser.error(
                f"{path} is committed: add {FLAG} to regenerate it, or leave the path out to write under runs/"
            )


def resolve(
    parser: argparse.ArgumentParser, args: argparse.Namespace, given: Path | None, committed_path: Path, quick: Path
) -> Path:
    """An output path: ``given`` if given (checked), else ``committed_path`` with ``--write-committed``, else ``quick`` (under runs/)."""
    if given is not None:
        check(parser, args, given)
        return given
    return committed_path if args.write_committed else quick


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
