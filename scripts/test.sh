#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite on one CPU thread per test process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider tests
