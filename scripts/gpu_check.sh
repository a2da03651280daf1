#!/usr/bin/env bash
# The GPU check, for a bare offline GPU node: the tests marked `gpu`, then the engine benchmark
# (experiments/bench_engine.py) at 1b and 8b on random LLaDA-shaped weights, 8b once more with
# engine.compile (the lookahead round and the host overhead), then SDAR-4B- and LLaDA2.0-mini-shaped
# block-diffusion models (the block cache), then the adaptive KV caches on a Dream-7B-shaped model
# (the 8b run's cache section has the LLaDA-shaped ones); under 14 minutes on one H100/H200-class GPU. Every table, the log and a JSON summary go to OUT_DIR.
#   bash scripts/gpu_check.sh OUT_DIR [--wheels DIR]   # on the GPU node (torch with CUDA preinstalled)
#   bash scripts/gpu_check.sh OUT_DIR --dry-run        # the same script on CPU with the tiny model (~1 min; in the tests)
#   options in any order (--dry-run OUT_DIR works too); --no-time-limits: run the steps without their
#   per-step wall-clock limits (sized for a GPU node); the dry run never applies them (a busy CPU is slow).
#   PYTHON=/path/to/python bash scripts/gpu_check.sh ...  # a given interpreter (default: python3 on PATH)
# What the image lacks (hydra-core, omegaconf, antlr4, attrs, ...) is installed offline from
# --wheels DIR (scripts/fetch_wheels.sh makes it) or from ./wheels; the checkout is imported in place
# (PYTHONPATH), so nothing needs installing when the image has the dependencies. The upstream
# reference rows need ../shared/upstream (or $DLMSEARCH_UPSTREAM) and are skipped, with the reason, without it.
set -uo pipefail
caller=$PWD  # OUT_DIR and --wheels DIR are relative to where the script is called from
cd "$(dirname "$0")/.."
usage="usage: scripts/gpu_check.sh OUT_DIR [--dry-run] [--wheels DIR] [--no-time-limits]"
out=
dry=0
limits=1
wheels=wheels
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1 ;;
        --no-time-limits) limits=0 ;;
        --wheels) wheels=${2:?--wheels needs a directory}; shift; [[ $wheels = /* ]] || wheels=$caller/$wheels ;;
        --wheels=*) wheels=${1#--wheels=}; [[ $wheels = /* ]] || wheels=$caller/$wheels ;;
        -h|--help) echo "$usage"; exit 0 ;;
        -*) echo "unknown option: $1; $usage" >&2; exit 2 ;;
        *) if [ -n "$out" ]; then echo "more than one OUT_DIR ($out, $1); $usage" >&2; exit 2; fi
           out=$1 ;;
    esac
    shift
done
[ -n "$out" ] || { echo "$usage" >&2; exit 2; }
[[ $out = /* ]] || out=$caller/$out
[ "$dry" = 1 ] && limits=0  # the step limits are sized for a GPU node, not for a (busy) CPU
mkdir -p "$out"
out=$(cd "$out" && pwd)
LOG=$out/gpu_check.txt
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
if [ -z "${PYTHON:-}" ] && [ -f .venv/bin/activate ] && [ "$dry" = 1 ]; then
    . .venv/bin/activate  # the dry run in the test suite uses the project's environment
fi
python=${PYTHON:-$(command -v python3 || command -v python)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

missing=$("$python" - <<'PY'
import importlib.util
need = {"hydra": "hydra-core", "omegaconf": "omegaconf", "antlr4": "antlr4-python3-runtime==4.9.3", "attrs": "attrs", "tqdm": "tqdm",
        "numpy": "numpy", "safetensors": "safetensors", "yaml": "PyYAML", "pytest": "pytest", "hypothesis": "hypothesis"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PY
)
if [ -n "$missing" ]; then
    echo "installing offline from $wheels: $missing"
    if [ ! -d "$wheels" ]; then
        echo "missing packages ($missing) and no wheel directory $wheels: make one with scripts/fetch_wheels.sh DIR on a machine with a package index" >&2
        exit 3
    fi
    "$python" -m pip install --no-index --find-links "$wheels" $missing || exit 3
fi

status=0
step() {  # step NAME TIMEOUT_S COMMAND...: run with a timeout (none under --no-time-limits or --dry-run), report its exit status, keep going
    local name=$1 limit=$2
    shift 2
    [ "$limits" = 1 ] || limit=0  # 0: no limit
    echo
    echo "=== $name ($([ "$limit" = 0 ] && echo 'no time limit' || echo "timeout ${limit}s")): $* ==="
    local start=$SECONDS
    if [ "$limit" = 0 ]; then "$@"; else timeout --kill-after=10 "$limit" "$@"; fi
    local rc=$?
    if [ "$limit" != 0 ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }; then
        echo "=== $name: TIMED OUT after $((SECONDS - start))s ==="
    else
        echo "=== $name: exit $rc after $((SECONDS - start))s ==="
    fi
    STEPS="${STEPS:-}{\"step\": \"$name\", \"exit\": $rc, \"seconds\": $((SECONDS - start)), \"limit_s\": $([ "$limit" = 0 ] && echo null || echo "$limit")},"
    return "$rc"
}

echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')$([ "$dry" = 1 ] && echo ' (dry run: CPU, tiny model)')"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi || echo "nvidia-smi: not found"
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"

# pytest exits 5 when no test is selected (no GPU: every `gpu` test skips or none is collected): not a failure.
step "pytest -m gpu" 70 "$python" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py --junitxml="$out/pytest_gpu.xml"
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi

# tensor parallelism: memory per rank of the two models that need it (printed, CPU), then the TP=1 row (torchrun, one
# process, model.tensor_parallel=1) on the shipped Countdown model; a TP=2 row where two GPUs are visible
step "memory per rank (python -m dlmsearch.estimate)" 60 "$python" -m dlmsearch.estimate --preset llada2-flash diffusion-gemma-26b-a4b \
    --tp 1 2 4 8 --dtype bfloat16 --batch 8 --length 2048 --cache prefix || status=1
tp_device=$([ "$dry" = 1 ] && echo cpu || echo cuda); tp_items=$([ "$dry" = 1 ] && echo 2 || echo 64)
step "tensor parallel TP=1" 120 "$python" -m torch.distributed.run --standalone --nproc-per-node 1 -m dlmsearch model=countdown \
    model.device="$tp_device" model.tensor_parallel=1 task=countdown task.limit="$tp_items" +decoder=fast_dllm out_dir="$out/tp1" || status=1
if [ "$dry" != 1 ] && [ "$("$python" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    step "tensor parallel TP=2" 120 "$python" -m torch.distributed.run --standalone --nproc-per-node 2 -m dlmsearch model=countdown \
        model.device=cuda model.tensor_parallel=2 task=countdown task.limit=64 +decoder=fast_dllm out_dir="$out/tp2" || status=1
fi

if [ "$dry" = 1 ]; then
    step "bench_engine tiny (dry run)" 120 "$python" experiments/bench_engine.py --size tiny --device cpu --quick --repeats 1 --sections 2,4 \
        --out "$out/bench_tiny.json" || status=1
    step "bench_engine tiny, engine.compile (dry run)" 120 "$python" experiments/bench_engine.py --size tiny --device cpu --quick --repeats 1 \
        --sections 4 --compile --out "$out/bench_tiny_compile.json" || status=1
    sizes="tiny tiny_compile"
else
    step "bench_engine 1b" 100 "$python" experiments/bench_engine.py --size 1b --device cuda --budget-s 70 --out "$out/bench_1b.json" || status=1
    step "bench_engine 8b" 200 "$python" experiments/bench_engine.py --size 8b --device cuda --budget-s 150 --out "$out/bench_8b.json" || status=1
    step "bench_engine 8b, engine.compile" 110 "$python" experiments/bench_engine.py --size 8b --device cuda --budget-s 80 --sections 2,4 --compile \
        --out "$out/bench_8b_compile.json" || status=1
    # block diffusion at the real widths: SDAR-4B-shaped and LLaDA2.0-mini-shaped (16B MoE) random models, plain and K = 4
    # lookahead decodes with no cache, the exact block cache and its fused writes (bench_engine --size sdar_tiny / llada2_tiny on CPU)
    step "bench_engine sdar_4b" 100 "$python" experiments/bench_engine.py --size sdar_4b --device cuda --budget-s 70 --sections 2,3 \
        --out "$out/bench_sdar_4b.json" || status=1
    step "bench_engine llada2_mini" 160 "$python" experiments/bench_engine.py --size llada2_mini --device cuda --budget-s 110 --sections 3 \
        --out "$out/bench_llada2_mini.json" || status=1
    # the adaptive KV caches (dllm_cache, d2cache, elastic, dkv) beside none / prefix / dual on a Dream-7B-shaped model
    # (the 8b run's section 3 has the LLaDA-shaped rows)
    step "bench_engine dream_7b" 130 "$python" experiments/bench_engine.py --size dream_7b --device cuda --budget-s 100 --sections 3 \
        --out "$out/bench_dream_7b.json" || status=1
    sizes="1b 8b 8b_compile sdar_4b llada2_mini dream_7b"
fi

"$python" - "$out" "$status" "$SECONDS" "$dry" "[${STEPS%,}]" $sizes <<'PY'
import json, sys
from pathlib import Path
out, status, seconds, dry, steps, sizes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", json.loads(sys.argv[5]), sys.argv[6:]
bench = {}
for size in sizes:
    path = out / f"bench_{size}.json"
    if path.is_file():
        doc = json.loads(path.read_text())
        bench[size] = {"targets": doc.get("targets"), "rows": len(doc.get("rows", [])), "skipped": [r["label"] for r in doc.get("rows", []) if "skipped" in r]}
summary = {"status": status, "seconds": seconds, "dry_run": dry, "steps": steps, "bench": bench}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"\ngpu_check finished in {seconds}s, status {status}; {out}/summary.json, {out}/gpu_check.txt, " + ", ".join(f"{out}/bench_{s}.json" for s in sizes))
PY
exit "$status"
