"""``python -m dlmsearch.estimate``: memory per rank under tensor parallelism, one markdown table per model.

    python -m dlmsearch.estimate --preset llada2-flash diffusion-gemma-26b-a4b --tp 1 2 4 8 \\
        --dtype bfloat16 --batch 8 --length 2048 --cache prefix
    python -m dlmsearch.estimate --config /models/LLaDA2.0-mini/config.json

Errors (an unknown preset, a missing config file, N not dividing the heads, key/value heads or
experts) are one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dlmsearch.estimate.architecture import Architecture, EstimateError, architecture
from dlmsearch.estimate.known_models import PRESETS, preset
from dlmsearch.estimate.rank_memory import DTYPE_BYTES
from dlmsearch.estimate.table import memory_table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dlmsearch.estimate",
        description="Weights, replicated weights and KV cache per rank under N-way tensor (and expert) parallelism.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", nargs="+", metavar="PATH", help="config.json files (or their directories)")
    source.add_argument("--preset", nargs="+", metavar="NAME", help=f"known public shapes: {', '.join(PRESETS)}")
    parser.add_argument("--tp", nargs="+", type=int, default=[1, 2, 4, 8], metavar="N", help="parallel degrees")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16")
    parser.add_argument("--batch", type=int, default=1, help="rows decoded together")
    parser.add_argument("--length", type=int, default=2048, help="tokens per row, prompt included")
    parser.add_argument("--cache", choices=("none", "prefix"), default="prefix", help="KV cache of every position")
    return parser


def _read_config(path: str) -> dict[str, Any]:
    file = Path(path).expanduser()
    file = file / "config.json" if file.is_dir() else file
    if not file.is_file():
        raise EstimateError(f"--config {path}: no such file")
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EstimateError(f"--config {path}: not a JSON file ({error})") from error
    if not isinstance(config, dict):
        raise EstimateError(f"--config {path}: holds a JSON {type(config).__name__}, not an object")
    return config


def _models(args: argparse.Namespace) -> list[Architecture]:
    if args.preset:
        return [preset(name) for name in args.preset]
    return [architecture(_read_config(path), path) for path in args.config]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.batch < 1 or args.length < 1:
            raise EstimateError(f"--batch {args.batch} --length {args.length}: both must be at least 1")
        tables = [
            memory_table(model, args.tp, args.dtype, args.batch, args.length, args.cache) for model in _models(args)
        ]
    except EstimateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
