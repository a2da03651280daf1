#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the default job: AdaLook on held-out Sudoku puzzles.
# Arguments are overrides for that run, e.g. the text default run (the shipped Countdown model; its
# tokenizer needs transformers, a core dependency that setup installs):
#   bash scripts/demo.sh model=countdown task=countdown
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
. .venv/bin/activate
python -m dlmsearch +decoder=adalook "$@"
