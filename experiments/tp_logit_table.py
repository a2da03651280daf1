"""Tensor parallelism on CPU (gloo, 2 processes) against one process, per family: the largest logit
difference, whether every decode's tokens and counters agree, and the all-reduce bytes of one forward.

Writes each family's tiny sharp checkpoint (``tests/tp_worker.py``) into a temporary directory and
runs the worker under ``torchrun --standalone --nproc-per-node N`` for N = 1 and 2:

    python experiments/tp_logit_table.py

Bytes per forward (of 2 rows x 12 tokens, hidden 32, float32; DiffusionGemma: a decoder call of 2
canvases of 8): measured by the native blocks' all-reduce counter (2 per layer: o_proj, down_proj);
for DiffusionGemma (DTensor's RowwiseParallel) computed as sharded row-wise projections x rows x
tokens x hidden x 4 bytes (its replicated full-attention layer sends nothing), plus one all-reduce per
layer of routed experts in the MoE model (transformers' ``AllReduceEP``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from test_tensor_parallel import CASES, launch
from tp_worker import write_checkpoint

GEMMA_EXPERT_LAYERS = 3  # the MoE model's layers whose experts (by expert) add one all-reduce each
GEMMA_ROWWISE = (
    3 + 2
)  # decoder layers' down_proj (3) + the sliding layers' o_proj (2); the full layer's attention is replicated


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args(argv)
    print(
        "| family | max \\|Δlogit\\| (TP=2 vs TP=1, float32) | tokens & counters identical | all-reduce bytes per forward "
        "| parameter bytes per rank (TP=2 / TP=1) |"
    )
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for family in args.families:
            write_checkpoint(family, scratch / family)
        ones, twos = launch(args.families, scratch, 1, scratch), launch(args.families, scratch, 2, scratch)
    for family in args.families:
        one, two = ones[family], twos[family]
        difference = (one["logits"] - two["logits"]).abs().max().item()
        same = all(
            a["tokens"] == b["tokens"] and a["counters"] == b["counters"]
            for a, b in zip(one["decodes"], two["decodes"])
        )
        cases = ", ".join(f"{p}/{c}{' T=0.8' if o and 'temperature' in o[0] else ''}" for p, c, o in CASES[family][0])
        reduces = GEMMA_ROWWISE + (GEMMA_EXPERT_LAYERS if family.endswith("moe") else 0)
        sent = two["bytes_per_forward"] or reduces * 2 * 8 * 32 * 4
        held = f"{two['parameter_bytes']} / {one['parameter_bytes']}"
        print(f"| {family} | {difference:.2e} | {'yes' if same else 'NO'} ({cases}) | {sent} | {held} |")


if __name__ == "__main__":
    main()
