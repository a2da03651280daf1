#!/usr/bin/env bash
# Create .venv and install dlmsearch with the CPU build of torch (no multi-GB CUDA download).
#   bash scripts/setup.sh        # with the dev extras (tests, lm-eval, plotting): what scripts/test.sh needs
#   bash scripts/setup.sh demo   # only what the default job needs
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
if [ "${1:-dev}" = demo ]; then
  python -m pip install --quiet -e .
else
  python -m pip install --quiet -e ".[dev]"
fi
