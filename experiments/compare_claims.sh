#!/usr/bin/env bash
# Pair the runs behind experiments/RESULTS.md on the same puzzles: for each tier, directories of
# links to runs of different sweeps, collected by the sweep collector into experiments/results/.
# Run after the sweeps and the model card listed at the top of RESULTS.md. The tables go to
# runs/claims/results/ unless --write-committed: then to the committed experiments/results/.
#   bash experiments/compare_claims.sh --write-committed
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  --write-committed) results=experiments/results ;;
  "") results=runs/claims/results ;;
  *) echo "usage: bash experiments/compare_claims.sh [--write-committed]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
for tier in easy hard; do
  ablate=$PWD/runs/claims/ablate_$tier fixed=$PWD/runs/claims/fixed_best_score_$tier card=$PWD/runs/model_card/$tier
  links() {  # links NAME label=run_dir ...
    local dir=runs/claims/compare_${tier}_$1; shift
    rm -rf "$dir" && mkdir -p "$dir"
    for pair in "$@"; do ln -s "${pair#*=}" "$dir/${pair%%=*}"; done
  }
  links direction_T0.1 above=$ablate/4_gate_above_T1e-1_D3_k4 below=$ablate/5_gate_below_T1e-1_D3_k4
  links direction_T1 above=$ablate/6_gate_above_T1e0_D3_k4 below=$ablate/7_gate_below_T1e0_D3_k4
  links adaptive_vs_fixed gate_above_T0.1_D3=$ablate/4_gate_above_T1e-1_D3_k4 gate_above_T1_D3=$ablate/6_gate_above_T1e0_D3_k4 \
    confdepth_D4=$ablate/8_confdepth_D4_k4 fixed_d1_ete=$fixed/0_fixed_d1_k4 fixed_d2=$fixed/1_fixed_d2_k4 \
    fixed_d3=$fixed/2_fixed_d3_k4 fixed_d4=$fixed/3_fixed_d4_k4
  links equal_steps fast_dllm=$card/fast_dllm llada=$card/llada ete=$ablate/0_fixed_d1_k4 \
    adalook_T0.1=$ablate/4_gate_above_T1e-1_D3_k4 adalook_T1=$ablate/6_gate_above_T1e0_D3_k4
  for spec in direction_T0.1:above direction_T1:above adaptive_vs_fixed:gate_above_T0.1_D3 equal_steps:fast_dllm; do
    python -m dlmsearch.sweeps.collect "runs/claims/compare_${tier}_${spec%%:*}" --baseline "${spec#*:}" --out "$results/$tier/${spec%%:*}"
  done
  for sweep in ablate fixed_best_score; do
    mkdir -p "$results/$tier/$sweep"
    cp "runs/claims/${sweep}_$tier"/sweep.{md,csv} "runs/claims/${sweep}_$tier"/*.png "$results/$tier/$sweep/"
  done
done
