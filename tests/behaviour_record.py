"""A record of what every preset decodes, to show that a change of structure changes nothing.

For every decoder preset: the first puzzles of both shipped Sudoku tiers with the shipped model,
and mixed-length prompts with sharp random text models of both families (no cache, and the
prefix and dual caches for the threshold and lookahead presets). Each item is recorded as a
digest of its tokens and commit record (call, depth, branch) and its counters (steps,
row-forwards, token-forwards). ``tests/test_behaviour.py`` compares a fresh record with the one
committed in ``tests/data/behaviour.json``; after a change that is *meant* to alter decoding,
write it again and say why in the commit:

    python tests/behaviour_record.py --write
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import NoRepeatVerifier, make_requests, text_decoder
from family_models import GEN, MASK_ID, adapter_for

from dlmsearch.config import build, compose, decoder_presets
from dlmsearch.models.loading import load_denoiser
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.tasks.sudoku import SudokuTask

RECORD = Path(__file__).resolve().parent / "data" / "behaviour.json"
PUZZLES = 6
CACHED = ("fast_dllm", "adalook", "best_of_n")
# The block-diffusion families' own presets are pinned by their parity with the reference loops
# (tests/test_block_diffusion_parity.py) and tests/test_block_diffusion.py, not recorded here.
BLOCK_PRESETS = frozenset(
    {"sdar", "sdar_greedy", "sdar_static", "sdar_sequential", "entropy_bounded", "llada2", "llada21"}
)


def recorded_presets() -> list[str]:
    """Every masked-diffusion preset but the block families' (uniform-noise presets run only on a
    uniform-noise model: pinned by their parity with transformers' generate, tests/test_diffusion_gemma_parity.py)."""
    return [p for p in decoder_presets("mask") if p not in BLOCK_PRESETS]


def digest(result) -> list:
    parts = [result.tokens, result.commit_call, result.commit_depth, result.commit_branch]
    text = ";".join(",".join(str(int(v)) for v in t.tolist()) for t in parts)
    return [hashlib.sha1(text.encode()).hexdigest()[:16], result.steps, result.row_forwards, result.token_forwards]


def record() -> dict[str, list]:
    torch.set_num_threads(1)
    out: dict[str, list] = {}
    sudoku = load_denoiser(None, 9, 10)
    for tier in ("easy", "hard"):
        task = SudokuTask(tier=tier, limit=PUZZLES)
        items = task.items()
        requests = [DecodeRequest(uid=u, prompt=i.prompt, generation=i.generation) for u, i in enumerate(items)]
        verifier = task.verifier([i.question for i in items])
        for preset in recorded_presets():
            decoder = build(compose([f"+decoder={preset}"]), "decoder")
            try:
                results = decoder.decode(RolloutEngine(adapter=sudoku), requests, task.block_length, verifier=verifier)
            except ValueError:  # a combination the plan refuses (a length policy on a model without an end token)
                out[f"sudoku/{tier}/{preset}"] = ["refused"]
                continue
            out[f"sudoku/{tier}/{preset}"] = [digest(r) for r in results]
    for family in ("llada", "dream"):
        adapter = adapter_for(family, True)
        requests = make_requests(
            [3, 0, 5, 2], GEN, seed=1, fixed=2, mask_id=MASK_ID
        )  # the text models' own mask: every request decodes
        # a length policy reads the model's end token: the tiny model's id 51 (predicted at a third of its positions)
        with_end = attrs.evolve(adapter, stop_ids=[51])
        for preset in recorded_presets():
            for cache in ("none", "prefix", "dual") if preset in CACHED else ("none",):
                varies = build(compose([f"+decoder={preset}"]), "decoder").length.changes
                engine = RolloutEngine(adapter=with_end if varies else adapter, cache=cache)
                try:
                    ceiling = ("decoder.length.max_length=40",) if varies else ()  # not the published 2048
                    results = text_decoder(preset, *ceiling, gen_length=GEN).decode(
                        engine, requests, 8, verifier=NoRepeatVerifier()
                    )
                except ValueError:  # a combination the decoder refuses (WINO's shadow block on Dream's shifted logits)
                    out[f"text/{family}/{preset}/{cache}"] = ["refused"]
                    continue
                out[f"text/{family}/{preset}/{cache}"] = [digest(r) for r in results]
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"write {RECORD}")
    args = parser.parse_args()
    found = record()
    if args.write:
        RECORD.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(found)} entries to {RECORD}")
    else:
        print(json.dumps(found, indent=1, sort_keys=True))
