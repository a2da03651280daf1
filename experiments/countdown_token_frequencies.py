"""The Countdown model's token-frequency prior for PC-Sampler, counted over its training distribution.

PC-Sampler defers frequent, trivial tokens by a frequency table of the model's training corpus;
the shipped Countdown model was trained on drawn problems, so the table counts the response
tokens (worked answer, ``<|eot_id|>``, the ``<|endoftext|>`` fill) of problems drawn as training
draws them at the end of its curriculum. Written in PC-Sampler's format.

    python experiments/countdown_token_frequencies.py                     # runs/countdown_token_frequencies/token_frequencies.json
    python experiments/countdown_token_frequencies.py --write-committed   # dlmsearch/data/countdown_model/token_frequencies.json
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from outputs import RUNS, add_flag, resolve
from train_countdown import EOS_ID, EOT_ID, ProblemSampler, held_out_triples

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with every output path resolved (under runs/ unless --write-committed)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=20000)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the JSON file (default runs/countdown_token_frequencies/token_frequencies.json)",
    )
    add_flag(parser, "table shipped beside the Countdown model")
    args = parser.parse_args(argv)
    args.out = resolve(
        parser,
        args,
        args.out,
        ROOT / "dlmsearch" / "data" / "countdown_model" / "token_frequencies.json",
        RUNS / "countdown_token_frequencies" / "token_frequencies.json",
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cfg = OmegaConf.load(ROOT / "experiments" / "conf" / "train" / "countdown.yaml")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ROOT / "dlmsearch" / "data" / "countdown_model"))
    sampler = ProblemSampler(cfg.curriculum, np.random.default_rng(12345), held_out_triples())
    counts: Counter[int] = Counter()
    for _ in range(args.problems):
        _, answer = sampler.draw(1.0)
        response = tokenizer(answer, add_special_tokens=False)["input_ids"] + [EOT_ID]
        counts.update(response + [EOS_ID] * (cfg.gen_length - len(response)))
    args.out.write_text(
        json.dumps(
            {
                "num_token": sum(counts.values()),
                "p_baseline_dict": {str(k): v for k, v in sorted(counts.items())},
                "source": f"{args.problems} training draws of experiments/train_countdown.py (end of curriculum)",
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.out}: {len(counts)} token ids, {sum(counts.values())} tokens")
    if args.write_committed:  # the block model shares the tokenizer and answers: the same table in its directory
        block_copy = ROOT / "dlmsearch" / "data" / "countdown_block_model" / "token_frequencies.json"
        shutil.copyfile(args.out, block_copy)
        print(f"copied to {block_copy}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
