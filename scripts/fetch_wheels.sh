#!/usr/bin/env bash
# Download what scripts/gpu_check.sh needs on a bare offline GPU node, on a machine with a package
# index: the project's own wheel and its dependencies (not torch: the GPU image brings its own CUDA
# build), for CPython 3.10, 3.11 and 3.12 on x86-64 Linux.
#   bash scripts/fetch_wheels.sh DIR      # then copy DIR with the checkout; gpu_check.sh OUT --wheels DIR
set -euo pipefail
caller=$PWD  # DIR is relative to where the script is called from
cd "$(dirname "$0")/.."
usage="usage: scripts/fetch_wheels.sh DIR"
dir=
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) echo "$usage"; exit 0 ;;
        -*) echo "unknown option: $1; $usage" >&2; exit 2 ;;
        *) if [ -n "$dir" ]; then echo "more than one DIR ($dir, $1); $usage" >&2; exit 2; fi
           dir=$1 ;;
    esac
    shift
done
[ -n "$dir" ] || { echo "$usage" >&2; exit 2; }
[[ $dir = /* ]] || dir=$caller/$dir
mkdir -p "$dir"
python=$(command -v python3 || command -v python)
pip=("$python" -m pip -q)
"${pip[@]}" wheel --no-deps --wheel-dir "$dir" .
# Pure-Python packages, one wheel for every version (antlr4 4.9.3, which hydra-core pins, ships as source only: built here).
pure=(hydra-core==1.3.* 'omegaconf>=2.2,<2.4' antlr4-python3-runtime==4.9.3 attrs tqdm packaging pytest iniconfig pluggy pygments exceptiongroup typing-extensions hypothesis sortedcontainers)
"${pip[@]}" download --no-deps --dest "$dir" "${pure[@]}"
for source in "$dir"/*.tar.gz; do
    [ -e "$source" ] || continue
    "${pip[@]}" wheel --no-deps --wheel-dir "$dir" "$source" && rm "$source"
done
# Compiled packages, per version.
for version in 3.10 3.11 3.12; do
    "${pip[@]}" download --no-deps --only-binary=:all: --dest "$dir" --python-version "$version" --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any numpy safetensors PyYAML tomli
done
echo "wheels for scripts/gpu_check.sh in $dir: $(ls "$dir" | wc -l) files"
