#!/usr/bin/env bash
# GPU check, one H200, under 8 minutes in all: the tests marked `gpu`, then the engine benchmark
# (experiments/bench_engine.py) at 1b and 8b on random LLaDA-shaped weights. Everything printed
# goes to runs/gpu_check.txt as well; the benchmark's JSON to runs/bench_engine/<size>.json.
# Each step has a hard timeout, and the benchmark a softer --budget-s, after which it skips the
# settings it has not started and still writes its table and JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -f .venv/bin/activate ]; then
    . .venv/bin/activate
fi
mkdir -p runs
LOG=runs/gpu_check.txt
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1

status=0
step() {  # step NAME TIMEOUT_S COMMAND...: run with a timeout, report its exit status, keep going
    local name=$1 limit=$2
    shift 2
    echo
    echo "=== $name (timeout ${limit}s): $* ==="
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "=== $name: TIMED OUT after $((SECONDS - start))s ==="
    else
        echo "=== $name: exit $rc after $((SECONDS - start))s ==="
    fi
    return "$rc"
}

echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi
else
    echo "nvidia-smi: not found"
fi
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"

# pytest exits 5 when no test is marked `gpu`: not a failure.
step "pytest -m gpu" 70 python -m pytest -q -p no:cacheprovider -m gpu tests
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi

step "bench_engine 1b" 125 python experiments/bench_engine.py --size 1b --device cuda --budget-s 90 || status=1
step "bench_engine 8b" 240 python experiments/bench_engine.py --size 8b --device cuda --budget-s 170 || status=1

echo
echo "gpu_check finished in ${SECONDS}s, status $status (log: $LOG; JSON: runs/bench_engine/1b.json, runs/bench_engine/8b.json)"
exit "$status"
