#!/usr/bin/env bash
# Create .venv and install torch first, then dlmsearch (its `torch>=2.2` is then already met, so
# nothing else pulls a torch build, e.g. a multi-GB CUDA one).
#   bash scripts/setup.sh        # with the dev extras (tests, lm-eval, plotting): what scripts/test.sh needs
#   bash scripts/setup.sh demo   # what the README's commands need: the package and its dependencies (transformers included) and the server's (the serve extra)
# Which torch: DLMSEARCH_TORCH (pip requirement(s), default "torch==2.13.0") from DLMSEARCH_TORCH_INDEX
# (an index URL; default: pip's configured indexes). On Linux, PyPI's torch wheel is the CUDA build;
# for the CPU build there:
#   DLMSEARCH_TORCH_INDEX=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
#   DLMSEARCH_TORCH="torch==2.5.1" bash scripts/setup.sh demo   # another version
# PYTHON=/path/to/python3.X: the interpreter for .venv (default python3; Python >= 3.10).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=dev
while [ $# -gt 0 ]; do
    case "$1" in
        demo|dev) mode=$1 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "usage: scripts/setup.sh [demo|dev]  (unknown argument: $1)" >&2; exit 2 ;;
    esac
    shift
done
python=${PYTHON:-python3}  # PYTHON=/path/to/python3.X: another interpreter for .venv
if ! command -v "$python" >/dev/null 2>&1; then
    echo "setup.sh: $python not found (PYTHON=/path/to/python3.X bash scripts/setup.sh)" >&2
    exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "setup.sh: dlmsearch needs Python >= 3.10; $python is $("$python" --version 2>&1) (PYTHON=/path/to/python3.X bash scripts/setup.sh)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ] && ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "setup.sh: $python cannot create a virtual environment (no venv/ensurepip module; on Debian/Ubuntu: apt install python3-venv)" >&2
    exit 1
fi
torch_spec=${DLMSEARCH_TORCH:-torch==2.13.0}
read -ra torch_reqs <<< "$torch_spec"
index_args=()
if [ -n "${DLMSEARCH_TORCH_INDEX:-}" ]; then
    index_args=(--index-url "$DLMSEARCH_TORCH_INDEX")
fi
where="the indexes pip is configured with"
[ -z "${DLMSEARCH_TORCH_INDEX:-}" ] || where=$DLMSEARCH_TORCH_INDEX
echo "setup.sh: installing ${torch_spec} from ${where}, then dlmsearch ($mode), into .venv (another torch: DLMSEARCH_TORCH=..., DLMSEARCH_TORCH_INDEX=URL; the CPU build where PyPI serves CUDA: DLMSEARCH_TORCH_INDEX=https://download.pytorch.org/whl/cpu)"
"$python" -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet ${index_args[@]+"${index_args[@]}"} "${torch_reqs[@]}"
if [ "$mode" = demo ]; then
    python -m pip install --quiet -e ".[serve]"   # the serve extra: python -m dlmsearch.serve (FastAPI, uvicorn, prometheus_client)
else
    python -m pip install --quiet -e ".[dev]"
    # The block-diffusion families' reference modeling files need older transformers (SDAR: 4.52, whose LossKwargs 4.57+
    # dropped; LLaDA2.0: 4.57): private copies for the parity tests' subprocess (tests/block_reference.py), beside the
    # venv's own transformers, never imported by dlmsearch
    for pinned in "4.52.4 tokenizers>=0.21,<0.22" "4.57.6 tokenizers>=0.22,<0.23"; do
        read -r version tokenizers <<< "$pinned"
        reference=.venv/reference/transformers-$version
        if [ ! -d "$reference/transformers" ]; then
            python -m pip install --quiet --no-deps --target "$reference" "transformers==$version" "$tokenizers" "huggingface-hub>=0.34,<1.0"
        fi
    done
fi
python -c "import torch; print(f'setup.sh: .venv has torch {torch.__version__} (CUDA {torch.version.cuda or \"none\"})')"
