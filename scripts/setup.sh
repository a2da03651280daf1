#!/usr/bin/env bash
# Create .venv and install dlmsearch with the CPU build of torch (no multi-GB CUDA download).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[dev]"
