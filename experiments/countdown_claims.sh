#!/usr/bin/env bash
# The measurements behind experiments/RESULTS.md's text section, with the shipped Countdown model:
# the model card (every preset on every tier, caches, block lengths, candidate rules, width
# search), the variance gate against fixed depth, the accuracy-vs-steps curve, and the paired
# comparisons of AdaLook, ETE and Fast-dLLM. Each run resumes from its own results.jsonl.
# Everything goes under $RUNS (default runs/countdown_claims; the tables in $RUNS/results, the card
# in $RUNS/card) unless --write-committed: then the tables go to experiments/results/countdown/, the
# card beside the shipped model and its figure to docs/.
#   bash experiments/countdown_claims.sh --write-committed
#   LIMIT=4 RUNS=/tmp/claims bash experiments/countdown_claims.sh   # a quick look
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  --write-committed) committed=--write-committed ;;
  "") committed= ;;
  *) echo "usage: bash experiments/countdown_claims.sh [--write-committed]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
limit=${LIMIT:-null}
runs=${RUNS:-runs/countdown_claims}
results=${RESULTS:-$([ -n "$committed" ] && echo experiments/results/countdown || echo "$runs/results")}
card=${CARD:+--card $CARD --figure ${CARD%.md}.png}
case "$(realpath -m "$results")/" in
  "$PWD"/experiments/results/*|"$PWD"/docs/*|"$PWD"/dlmsearch/data/*)
    [ -n "$committed" ] || { echo "$results is committed: add --write-committed to regenerate it" >&2; exit 2; } ;;
esac
base="model=countdown task=countdown model.device=cpu batch_size=256 task.limit=$limit"
card_limit=$([ "$limit" = null ] && echo "" || echo "--limit $limit")
export OMP_NUM_THREADS=1  # two processes, one core each (small models scale poorly across threads)
card_args="$card_limit --threads 1 --runs $runs/card"
python experiments/countdown_model_card.py $card_args --runs-only --tiers small --sections cache blocks &
first=$!
python experiments/countdown_model_card.py $card_args --runs-only --tiers d1 medium large --sections &
second=$!
wait $first
python -m dlmsearch -m +experiment=ablate_gate $base task.tier=small decoder.candidates.k=4 \
  ablate.arm=fixed_d1,fixed_d2,fixed_d3,gate_above_T1e-1_D3,gate_above_T1e0_D3,gate_below_T1e-1_D3,confdepth_D4 \
  hydra.sweep.dir=$runs/ablate_small &
first=$!
wait $second
python -m dlmsearch -m +experiment=budget_curve $base task.tier=small decoder=llada,fast_dllm,adalook \
  "curve.steps={p0: 16, p1: 12, p2: 8, p3: 4, p4: 2}" hydra.sweep.dir=$runs/budget_small &
second=$!
python experiments/countdown_model_card.py $card_args --runs-only --tiers small --sections candidates width
wait $first $second
python experiments/countdown_model_card.py $card_args $card $committed   # everything decoded: writes the card
for tier in small; do
  dir=$runs/equal_steps_$tier
  rm -rf "$dir" && mkdir -p "$dir"
  for preset in fast_dllm ete adalook llada; do ln -s "$(realpath "$runs")/card/presets/$tier/$preset" "$dir/$preset"; done
  python -m dlmsearch.sweeps.collect "$dir" --baseline fast_dllm --out "$results/$tier/equal_steps"
done
mkdir -p "$results/small/ablate"
cp "$runs/ablate_small"/sweep.{md,csv} "$runs/ablate_small"/*.png "$results/small/ablate/"
mkdir -p $results/small/budget_curve
cp "$runs/budget_small"/sweep.{md,csv} "$runs/budget_small"/*.png $results/small/budget_curve/
