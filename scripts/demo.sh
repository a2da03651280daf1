#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the default job: AdaLook on held-out Sudoku puzzles.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
. .venv/bin/activate
python -m dlmsearch +decoder=adalook "$@"
