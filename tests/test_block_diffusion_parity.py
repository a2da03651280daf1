"""Parity with the block-diffusion families' reference loops, batched: SDAR's
``block_diffusion_generate`` (``../shared/upstream/sdar``) and LLaDA2.0's
``LLaDA2MoeModelLM.generate`` (``../shared/upstream/llada2``).

A tiny checkpoint of each is built by the family's own classes (in the transformers its modeling
file needs, in a subprocess: ``tests/block_reference.py``) and decoded there one prompt at a time,
with dlmsearch's counter-based draws put in place of its multinomial. dlmsearch loads the same
directory natively and decodes all prompts in one batch (mixed lengths, so they align to blocks
differently) with ``cache=block``: tokens must be identical. SDAR's loop makes exactly one model
call more per sample (it writes the last block's keys and values too, which nothing reads);
LLaDA2's loop has no cache (each step forwards the canvas up to the block's end), so it makes
exactly the calls of ``cache=block`` with ``fuse_write=true``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from block_reference import TRANSFORMERS, VERSIONS, missing_reason
from conftest import TINY_LLADA2

from dlmsearch.core.sampling import Sampling
from dlmsearch.models.loading import load_text_model
from dlmsearch.search.components.revision import TokenEditing
from dlmsearch.search.components.sdar_rules import BlockDiffusionSchedule
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.cache_policy import BlockCache
from dlmsearch.search.engine.rollout import RolloutEngine

needs_sdar = pytest.mark.skipif(missing_reason("sdar") is not None, reason=missing_reason("sdar") or "")
needs_llada2 = pytest.mark.skipif(missing_reason("llada2") is not None, reason=missing_reason("llada2") or "")

SEED, MASK, EOS, BLOCK = 11, 999, 998, 4
PROMPT_LENGTHS = [5, 11, 8, 6]  # prompt tails of 1, 3, 0 and 2 tokens in their last block
TINY_SDAR = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "block_size": BLOCK,
    "seed": 3,
    "sharpness": 8.0,
    "mask_id": MASK,
    "eos_id": EOS,
}
WHOLE_BLOCK_PROMPTS = [8, 4, 12]  # no prompt tokens in the first decoded block
# (strategy, denoising steps, sampling, generation length, prompt lengths): SDAR's three strategies, sampled as
# its loop always samples, with top-p and top-k. Fewer steps than the block (k_t > 1) only where the reference
# never meets a step with fewer masks left than k_t: there its topk takes given or committed positions too and
# writes fresh draws over them (dynamic after a step that committed more than k_t; any rule in a block that
# holds prompt tokens); dlmsearch commits masked positions only, so those settings are left out.
CASES = [
    ("low_confidence_dynamic", 4, {"temperature": 1.0}, 12, PROMPT_LENGTHS),
    ("low_confidence_dynamic", 4, {"temperature": 0.7, "top_p": 0.9}, 12, PROMPT_LENGTHS),
    ("low_confidence_dynamic", 4, {"temperature": 1.0, "top_k": 5}, 8, PROMPT_LENGTHS),
    ("low_confidence_static", 4, {"temperature": 1.0}, 12, PROMPT_LENGTHS),
    ("low_confidence_static", 4, {"temperature": 0.7, "top_p": 0.9}, 8, PROMPT_LENGTHS),
    ("low_confidence_static", 2, {"temperature": 1.0, "top_k": 5}, 12, WHOLE_BLOCK_PROMPTS),
    ("sequential", 4, {"temperature": 1.0}, 12, PROMPT_LENGTHS),
    ("sequential", 2, {"temperature": 1.0, "top_k": 5}, 8, WHOLE_BLOCK_PROMPTS),
]
THRESHOLD = 0.9


def prompts(lengths: list[int], case: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(100 + case)
    return [torch.randint(0, 990, (n,), generator=generator).tolist() for n in lengths]


def reference_requests(stop: list[int] | None = None) -> list[dict]:
    """Every case's prompts as requests to the reference loop (uid = case * 10 + prompt)."""
    requests = []
    for case, (strategy, steps, sampling, gen_length, lengths) in enumerate(CASES):
        for index, prompt in enumerate(prompts(lengths, case)):
            requests.append(
                {
                    "uid": case * 10 + index,
                    "prompt": prompt,
                    "mask_id": MASK,
                    "gen_length": gen_length,
                    "block_length": BLOCK,
                    "steps": steps,
                    "remasking": strategy,
                    "threshold": THRESHOLD,
                    **sampling,
                    **({"stop": stop} if stop else {}),
                }
            )
    return requests


def run_reference(
    directory: Path, requests: list[dict], build: dict | None, scratch: Path, family: str = "sdar"
) -> dict[int, dict]:
    spec, answer = scratch / "spec.json", scratch / "answer.json"
    spec.write_text(
        json.dumps({"family": family, "directory": str(directory), "seed": SEED, "build": build, "requests": requests})
    )
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRANSFORMERS[family]), str(Path(__file__).parent)])}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("block_reference.py")), str(spec), str(answer)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(answer.read_text())
    assert record["transformers"] == VERSIONS[family]
    return {r["uid"]: r for r in record["results"]}


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    """The tiny SDAR directory and the reference loop's results for every case."""
    scratch = tmp_path_factory.mktemp("sdar_reference")
    directory = scratch / "tiny_sdar"
    return directory, run_reference(directory, reference_requests(), TINY_SDAR, scratch), scratch


def decode(directory: Path, case: int, stop_ids: list[int] | None = None, fuse_write: bool = False):
    strategy, steps, sampling, gen_length, lengths = CASES[case]
    adapter = load_text_model(str(directory), "sdar", stop_ids=stop_ids, device="cpu", dtype="float32")
    engine = RolloutEngine(adapter=adapter, seed=SEED, cache=BlockCache(fuse_write=fuse_write))
    decoder = SearchDecoder(
        commit=BlockDiffusionSchedule(steps=steps, remasking=strategy, threshold=THRESHOLD),
        name="sdar",
        sampling=Sampling(
            temperature=sampling["temperature"],
            top_p=sampling.get("top_p"),
            top_k=sampling.get("top_k"),
            confidence="sampling",
        ),
        stop_at_eos=stop_ids is not None,
    )
    requests = [
        DecodeRequest(uid=case * 10 + i, prompt=torch.tensor(p), generation=torch.full((gen_length,), MASK))
        for i, p in enumerate(prompts(lengths, case))
    ]
    return decoder.decode(engine, requests, BLOCK)


@needs_sdar
@pytest.mark.parametrize(
    "case",
    range(len(CASES)),
    ids=[f"{s}-steps{n}-{'-'.join(f'{k}{v}' for k, v in o.items())}" for s, n, o, _, _ in CASES],
)
def test_batched_decode_is_sdars_loop_for_each_prompt(sdar, case: int) -> None:
    directory, reference, _ = sdar
    for result in decode(directory, case):
        expected = reference[result.uid]
        assert result.tokens.tolist() == expected["tokens"], result.uid
        assert result.steps + 1 == expected["calls"], (
            result.uid,
            result.steps,
            expected["calls"],
        )  # + its write of the last block


@needs_sdar
def test_stop_at_eos_ends_after_the_block_that_holds_the_end(sdar) -> None:
    """``decoder.stop_at_eos``: no block after the one where a stop token appears (SDAR's
    ``stopping_criteria_idx``); the reference leaves those blocks masked, dlmsearch fills them with EOS."""
    directory, unstopped, scratch = sdar
    case = 0
    written = torch.tensor([t for uid, r in unstopped.items() if uid // 10 == case for t in r["tokens"]])
    values, counts = torch.unique(written, return_counts=True)
    stops = [
        EOS,
        *values[torch.argsort(counts, descending=True, stable=True)[:3]].tolist(),
    ]  # tokens the model writes often stand in for end tokens
    reference = run_reference(
        directory, [r for r in reference_requests(stops) if r["uid"] // 10 == case], None, scratch
    )
    stopped_early = 0
    for result in decode(directory, case, stop_ids=stops):
        expected = reference[result.uid]["tokens"]
        tokens = result.tokens.tolist()
        decoded = [t != MASK for t in expected]
        end = decoded.index(False) if False in decoded else len(expected)
        assert tokens[:end] == expected[:end], result.uid
        assert all(t == EOS for t in tokens[end:]) and result.steps + 1 == reference[result.uid]["calls"], result.uid
        stopped_early += end < len(expected)
    assert stopped_early >= 2  # the rule was exercised


@needs_sdar
def test_fusing_the_write_into_the_next_forward_saves_one_call_per_block(sdar) -> None:
    """``cache.fuse_write=true`` at temperature 0: the same tokens as the reference-style cache, fewer calls, the same row count minus the writes."""
    directory, _, _ = sdar
    adapter = load_text_model(str(directory), "sdar", device="cpu", dtype="float32")
    decoder = SearchDecoder(commit=BlockDiffusionSchedule(), name="sdar_greedy")
    requests = [
        DecodeRequest(uid=i, prompt=torch.tensor(p), generation=torch.full((12,), MASK))
        for i, p in enumerate(prompts(PROMPT_LENGTHS, 0))
    ]
    separate = decoder.decode(RolloutEngine(adapter=adapter, cache=BlockCache()), requests, BLOCK)
    fused = decoder.decode(RolloutEngine(adapter=adapter, cache=BlockCache(fuse_write=True)), requests, BLOCK)
    for a, b, length in zip(separate, fused, PROMPT_LENGTHS):
        assert a.tokens.tolist() == b.tokens.tolist()
        decoded_blocks = -(-(length + 12) // BLOCK) - length // BLOCK
        writes = (
            (length >= BLOCK) + decoded_blocks - 1
        )  # the prompt's whole blocks (if any) and every decoded block but the last
        assert a.steps - b.steps == writes, (length, a.steps, b.steps)
        assert a.token_forwards == b.token_forwards  # the same columns, forwarded in fewer calls


# LLaDA2.0: the tiny MoE of conftest's TINY_LLADA2 (its mask and EOS are MASK and EOS), blocks of 8
LLADA2_PROMPTS = [5, 13, 8, 11]  # prompt tails of 5, 5, 0 and 3 tokens in their last block of 8
LLADA2_CASES = [  # (sampling, steps per block, threshold)
    ({"temperature": 0.0}, 8, 0.95),
    ({"temperature": 0.0}, 4, 0.95),
    ({"temperature": 1.0}, 8, 0.95),
    ({"temperature": 0.7, "top_p": 0.9}, 8, 0.8),
    ({"temperature": 1.0, "top_k": 5}, 8, 0.95),
]


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("llada2_reference")
    directory = scratch / "tiny_llada2"
    requests = [
        {
            "uid": case * 10 + i,
            "prompt": prompt,
            "mask_id": MASK,
            "eos_id": EOS,
            "gen_length": 16,
            "block_length": 8,
            "steps": steps,
            "threshold": threshold,
            **sampling,
        }
        for case, (sampling, steps, threshold) in enumerate(LLADA2_CASES)
        for i, prompt in enumerate(prompts(LLADA2_PROMPTS, 50 + case))
    ]
    return directory, run_reference(directory, requests, TINY_LLADA2, scratch, family="llada2")


@needs_llada2
@pytest.mark.parametrize(
    "case",
    range(len(LLADA2_CASES)),
    ids=[f"steps{n}-tau{t}-{'-'.join(f'{k}{v}' for k, v in o.items())}" for o, n, t in LLADA2_CASES],
)
def test_batched_decode_is_llada2s_generate_for_each_prompt(llada2, case: int) -> None:
    directory, reference = llada2
    sampling, steps, threshold = LLADA2_CASES[case]
    adapter = load_text_model(str(directory), "llada2", device="cpu", dtype="float32")
    engine = RolloutEngine(adapter=adapter, seed=SEED, cache=BlockCache(fuse_write=True))
    decoder = SearchDecoder(
        commit=BlockDiffusionSchedule(steps=steps, threshold=threshold),
        name="llada2",
        stop_at_eos=True,
        sampling=Sampling(
            temperature=sampling["temperature"],
            top_p=sampling.get("top_p"),
            top_k=sampling.get("top_k"),
            confidence="sampling",
        ),
    )
    requests = [
        DecodeRequest(uid=case * 10 + i, prompt=torch.tensor(p), generation=torch.full((16,), MASK))
        for i, p in enumerate(prompts(LLADA2_PROMPTS, 50 + case))
    ]
    assert (
        len({t for r in requests for t in reference[r.uid]["tokens"]}) >= 4
    )  # the model's choices vary (a collapsed one would prove little)
    for result in decoder.decode(engine, requests, 8):
        expected = reference[result.uid]
        tokens = result.tokens.tolist()
        assert tokens[: len(expected["tokens"])] == expected["tokens"], (
            result.uid
        )  # the reference cuts at gen_length and after an EOS
        assert result.steps == expected["calls"], result.uid


needs_llada21 = pytest.mark.skipif(missing_reason("llada21") is not None, reason=missing_reason("llada21") or "")
LLADA21_CASES = [  # (sampling, editing threshold, max post steps): the sampler's defaults, and edits made frequent
    ({"temperature": 0.0}, 0.9, 16),
    ({"temperature": 0.0}, 0.5, 16),
    ({"temperature": 1.0}, 0.5, 3),
    ({"temperature": 0.7, "top_p": 0.9}, 0.6, 16),
]


@pytest.fixture(scope="module")
def llada21(llada2, tmp_path_factory):
    directory, _ = llada2
    requests = [
        {
            "uid": case * 10 + i,
            "prompt": prompt,
            "mask_id": MASK,
            "eos_id": EOS,
            "gen_length": 16,
            "block_length": 8,
            "threshold": 0.95,
            "editing_threshold": editing,
            "max_post_steps": post,
            **sampling,
        }
        for case, (sampling, editing, post) in enumerate(LLADA21_CASES)
        for i, prompt in enumerate(prompts(LLADA2_PROMPTS, 70 + case))
    ]
    return directory, run_reference(
        directory, requests, None, tmp_path_factory.mktemp("llada21_reference"), family="llada21"
    )


@needs_llada21
@pytest.mark.parametrize(
    "case",
    range(len(LLADA21_CASES)),
    ids=[f"edit{e}-post{p}-{'-'.join(f'{k}{v}' for k, v in o.items())}" for o, e, p in LLADA21_CASES],
)
def test_batched_decode_is_llada21s_editing_sampler_for_each_prompt(llada21, case: int) -> None:
    """Token-to-token editing as a revision that writes tokens: identical tokens and calls, and edits happen."""
    directory, reference = llada21
    sampling, editing, post = LLADA21_CASES[case]
    adapter = load_text_model(str(directory), "llada2", device="cpu", dtype="float32")
    decoder = SearchDecoder(
        commit=BlockDiffusionSchedule(steps=32, threshold=0.95),
        revision=TokenEditing(threshold=editing, max_post_steps=post),
        name="llada21",
        sampling=Sampling(temperature=sampling["temperature"], top_p=sampling.get("top_p"), confidence="sampling"),
    )
    requests = [
        DecodeRequest(uid=case * 10 + i, prompt=torch.tensor(p), generation=torch.full((16,), MASK))
        for i, p in enumerate(prompts(LLADA2_PROMPTS, 70 + case))
    ]
    results = decoder.decode(RolloutEngine(adapter=adapter, seed=SEED, cache=BlockCache(fuse_write=True)), requests, 8)
    for result in results:
        expected = reference[result.uid]
        assert result.tokens.tolist() == expected["tokens"], result.uid
        assert result.steps == expected["calls"], result.uid
    if editing < 0.9:
        assert sum(int(r.revisions.sum()) for r in results) > 0
