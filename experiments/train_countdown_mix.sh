#!/usr/bin/env bash
# Continue the three shipped Countdown models, and the block model's full-attention ablation, on one
# mix of three- and four-number problems (issue 39): the same tokenizer, the same problems in the
# same order (one sampler, one seed), the same steps x batch, so the same budget in training tokens.
# Each run is resumable (the one TrainingLoop; checkpoints under runs/mix/, never committed).
#
#   bash experiments/train_countdown_mix.sh llada uniform     # the runs named, one after another
#   bash experiments/train_countdown_mix.sh                   # all four
#
# The ablation (block_full) is the block model trained with attention=full: the same blocks and per-block
# mask rates, every token attending to every other (decoded with model.full_attention=true).
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; echo "usage: bash experiments/train_countdown_mix.sh [llada|uniform|block|block_full ...]"; exit 0 ;;
esac
cd "$(dirname "$0")"
DATA=../dlmsearch/data
MIX="steps=1200 budget_minutes=null batch_size=128 lr=1.0e-3 min_lr=1.0e-4 warmup_steps=50
     checkpoint_every=300 threads=1 gen_length=24 curriculum.start_high=20 curriculum.four_fraction=0.5
     eval_tier=validation4"
run() {  # name, script, shipped model, extra overrides
  local name=$1 script=$2 model=$3; shift 3
  python "$script" out_dir=../runs/mix/"$name" init_from="$DATA/$model" $MIX "$@" 2>&1 | tr '\r' '\n' \
    | grep -v '^train:' > ../runs/mix/"$name".log || true
}
mkdir -p ../runs/mix
for one in ${@:-llada uniform block block_full}; do  # unquoted: "llada block" as one argument names two runs
  case $one in
    llada) run llada train_countdown.py countdown_model decode_block_length=8 ;;
    uniform) run uniform train_countdown_uniform.py countdown_uniform_model eval_generate=64 ;;
    block) run block train_countdown_block.py countdown_block_model block_length=4 ;;
    block_full) run block_full train_countdown_block.py countdown_block_model block_length=4 attention=full ;;
    *) echo "unknown run $one (llada, uniform, block, block_full)" >&2; exit 2 ;;
  esac
done
