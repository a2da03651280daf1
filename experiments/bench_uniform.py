"""dlmsearch's uniform-noise decode, batched, against transformers' own ``generate`` one prompt at a time.

The same shipped DiffusionGemma-format model (``model=countdown_uniform``) and the same Countdown
prompts (the chat template, the model's trained length): transformers' ``generate`` at its
defaults runs them one by one (its loop has no continuous batching), dlmsearch's
``+decoder=diffusion_gemma`` runs them as one batch of ``--batch`` through its engine. Tokens/s counts
the answer's tokens up to and with the end token; the ratio is measured in one run (median of
``--repeats``). Both use the same attention (dlmsearch registers its own with transformers).

    python experiments/bench_uniform.py                   # 16 prompts, batch 16, 3 repeats, 1 thread
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dlmsearch.config import build, compose
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.rollout import RolloutEngine


def answer_length(tokens: list[int], stops: set[int]) -> int:
    """Tokens up to and with the first end token."""
    return next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = compose(
        ["model=countdown_uniform", "task=countdown", "+decoder=diffusion_gemma", f"task.limit={args.prompts}"]
    )
    adapter, task, decoder = build(cfg, "model"), build(cfg, "task"), build(cfg, "decoder")
    items = task.items()
    stops = set(adapter.stop_ids)
    model = adapter.module

    def reference() -> int:
        count = 0
        for item in items:
            out = model.generate(item.prompt[None], max_new_tokens=task.gen_length)
            count += answer_length(out.sequences[0, len(item.prompt) :].tolist(), stops)
        return count

    def ours() -> int:
        count = 0
        for start in range(0, len(items), args.batch):
            batch = items[start : start + args.batch]
            requests = [
                DecodeRequest(uid=start + i, prompt=it.prompt, generation=it.generation) for i, it in enumerate(batch)
            ]
            for result in decoder.decode(RolloutEngine(adapter), requests, task.block_length):
                count += answer_length(result.tokens.tolist(), stops)
        return count

    rates: dict[str, list[float]] = {"generate, one at a time": [], f"dlmsearch, batch {args.batch}": []}
    for _ in range(args.repeats):
        for name, run in zip(rates, (reference, ours)):
            started = time.perf_counter()
            tokens = run()
            rates[name].append(tokens / (time.perf_counter() - started))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, value in medians.items():
        print(f"{name}: {value:.1f} tokens/s (median of {args.repeats})")
    first, second = medians.values()
    print(f"ratio dlmsearch / generate: {second / first:.2f}x ({args.prompts} prompts, {args.threads} thread(s))")


if __name__ == "__main__":
    main()
