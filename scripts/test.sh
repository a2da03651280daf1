#!/usr/bin/env bash
# Set up (scripts/setup.sh), run the whole test suite (one CPU thread per test process, one
# process per core with pytest-xdist), then check that the wheel installs and runs (scripts/check_wheel.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .            # the linter (pyproject.toml [tool.ruff]); its own line, so that set -e stops on it
ruff format --check .   # the layout
python -m pytest -q -p no:cacheprovider -n auto tests
bash scripts/check_wheel.sh
