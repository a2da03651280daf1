#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh virtual environment, and run the default
# job on a few puzzles from another directory: the package must carry its configs and data.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$work" --one-top-level=src  # build from the tracked files only
python3 -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/src"
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --upgrade pip
# the torch scripts/setup.sh installs (DLMSEARCH_TORCH, DLMSEARCH_TORCH_INDEX), first, as there
read -ra torch_reqs <<< "${DLMSEARCH_TORCH:-torch==2.13.0}"
"$work/venv/bin/python" -m pip install --quiet ${DLMSEARCH_TORCH_INDEX:+--index-url "$DLMSEARCH_TORCH_INDEX"} "${torch_reqs[@]}"
torch_version() { "$work/venv/bin/python" -c "import importlib.metadata as m; print(m.version('torch'))"; }
torch_before=$(torch_version)
wheel=$(ls "$work"/dist/dlmsearch-*.whl)
"$work/venv/bin/python" -m pip install --quiet "$wheel"  # its dependencies, transformers included
torch_after=$(torch_version)
if [ "$torch_after" != "$torch_before" ]; then
    echo "installing the wheel replaced torch $torch_before with $torch_after: a dependency range pulls another torch build" >&2
    exit 1
fi
cd "$work"
"$work/venv/bin/python" -m dlmsearch +decoder=adalook task.limit=4 batch_size=4 out_dir="$work/run" | tee "$work/out.txt"
grep -q "adalook on sudoku: 4 items" "$work/out.txt"
# the README's text default run: the shipped Countdown model and its tokenizer (transformers, a core dependency)
"$work/venv/bin/python" -m dlmsearch +decoder=adalook model=countdown task=countdown task.limit=4 out_dir="$work/text" | tee "$work/text.txt"
grep -q "adalook on countdown: 4 items" "$work/text.txt"
# the shipped block-diffusion Countdown model (SDAR's format) with the exact block cache
"$work/venv/bin/python" -m dlmsearch +decoder=sdar model=countdown_block task=countdown cache=block task.limit=4 out_dir="$work/block" | tee "$work/block.txt"
grep -q "sdar on countdown (cache block): 4 items" "$work/block.txt"
# the shipped uniform-noise Countdown model (DiffusionGemma's format, through transformers' own modules)
"$work/venv/bin/python" -m dlmsearch +decoder=diffusion_gemma model=countdown_uniform task=countdown task.limit=4 out_dir="$work/uniform" | tee "$work/uniform.txt"
grep -q "diffusion_gemma on countdown (cache encoder): 4 items" "$work/uniform.txt"
wheel_mb=$(( $(stat -c %s "$wheel") / 1048576 ))
[ "$wheel_mb" -lt 30 ] || { echo "the wheel is ${wheel_mb} MB, over 30 MB"; exit 1; }
echo "wheel check passed: $(ls "$work"/dist)"
