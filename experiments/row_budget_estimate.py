"""``engine.row_budget: auto``'s per-row estimate against the measured peak, on CPU.

For the engine benchmark's random LLaDA-shaped models (``tiny`` and ``1b``), one forward of a few
rows and the engine's vocabulary-sized summaries (softmax, a tempered softmax): the peak resident
memory above the weights (Linux ``VmHWM`` after ``clear_refs``) against ``rows x row_bytes``.

    python experiments/row_budget_estimate.py                # about a minute on 2 cores, ~8 GB of memory for 1b
    python experiments/row_budget_estimate.py --sizes tiny   # a few seconds

Prints its table; writes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench.random_model import MASK_ID, VOCAB, build_model

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.engine.row_budget import model_shape, row_bytes


def peak_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status (Linux only)")


SHAPES = {"tiny": (16, 64, 64), "1b": (4, 200, 128)}  # size -> (rows, prompt, gen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes", nargs="+", choices=list(SHAPES), default=list(SHAPES), help="the benchmark's model sizes to measure"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    for size in args.sizes:
        rows, prompt, gen = SHAPES[size]
        module = build_model(size, "cpu", torch.float32)
        adapter = ModelAdapter(module=module, mask_id=MASK_ID, vocab_size=VOCAB)
        tokens = torch.randint(0, 1000, (rows, prompt + gen))
        tokens[:, prompt:] = MASK_ID
        attention = torch.ones_like(tokens, dtype=torch.bool)
        with torch.no_grad():
            adapter.window_logits(tokens[:1], attention[:1], prompt, prompt + gen)  # warm-up
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current resident size
            base = peak_bytes()
            logits, _ = adapter.window_logits(tokens, attention, prompt, prompt + gen)
            torch.softmax(logits, -1), torch.softmax(logits / 0.7, -1)
            peak = peak_bytes() - base
        estimate = rows * row_bytes(model_shape(module), prompt + gen, gen, 4, False)
        print(
            f"{size}: {rows} rows of {prompt}+{gen} tokens: estimate {estimate / 2**20:.0f} MiB, "
            f"measured peak above the weights {peak / 2**20:.0f} MiB (estimate / peak {estimate / max(peak, 1):.2f})",
            flush=True,
        )
        del module, adapter, logits
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
