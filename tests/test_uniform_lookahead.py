"""Uniform-noise decoding gives no silent wrong results (issue 47, defects 1, 3, 10 and 14).

A tiny DiffusionGemma built with transformers' own classes (``diffusion_gemma_models``: sharp, 4
experts, canvas 8) decodes through :class:`~dlmsearch.models.diffusion_gemma.DiffusionGemmaAdapter`:

* a lookahead branch stops at the canvas it finishes (only its slot's root encodes a finished
  canvas), and the decoder refuses a row whose slot's encoded prefix ends elsewhere (defect 1);
* a finished canvas records the probability of the tokens it holds, its draft (defect 3);
* a canvas finished inside a lookahead is recorded with its depth and branch (defect 10);
* a row's decoder logits do not depend on its batch-mates (defect 14: the routed experts'
  products were the batch's, so sampled decodes moved with it).
"""

from __future__ import annotations

import pytest
import torch
from diffusion_gemma_models import tiny_adapter, tiny_diffusion_gemma
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import build, compose
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.diffusion_gemma import DiffusionGemmaAdapter
from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.search.components.uniform_noise_steps import UniformNoiseSteps
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.encoder_prefix import prefix_read
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.engine.slot_memory import SlotMemory

PROMPTS = ([5, 6, 7, 8, 9], [10, 11, 12], [3, 4], [20, 21, 22, 23, 24, 25, 26, 27], [40])
# A lookahead two steps deep over a two-step canvas: the second step, a branch's, finishes the canvas.
DEEP_LOOKAHEAD = (
    "+decoder=fixed_depth",
    "decoder/commit=uniform_noise",
    "decoder.sampling.confidence=sampling",
    "decoder/trigger=always",
    "decoder.scorer.threshold=0.9",
    "decoder.commit.max_steps=2",
)


@pytest.fixture(scope="module")
def adapter() -> DiffusionGemmaAdapter:
    return tiny_adapter(tiny_diffusion_gemma(seed=3, moe=True))


def _requests(adapter: DiffusionGemmaAdapter, gen_length: int, uids: list[int]) -> list[DecodeRequest]:
    open_ = torch.full((gen_length,), adapter.capabilities.open_id)
    return [DecodeRequest(uid=u, prompt=torch.tensor(PROMPTS[u]), generation=open_, seed=11 + u) for u in uids]


def _deep_lookahead(adapter: DiffusionGemmaAdapter, levels: list[Lookahead]) -> list[DecodeResult]:
    decoder = build(compose(list(DEEP_LOOKAHEAD)), "decoder")
    requests = _requests(adapter, 2 * adapter.canvas_length, list(range(len(PROMPTS))))
    return decoder.decode(RolloutEngine(adapter), requests, adapter.canvas_length, on_lookahead=levels.append)


def test_a_branch_that_finishes_its_canvas_stops_there(adapter: DiffusionGemmaAdapter) -> None:
    """Every branch of every level is still on the canvas its lookahead began in: a branch moved
    into the next canvas would be evaluated against its slot's prefix, which ends before the
    finished canvas (only a root encodes one). A branch's step counts its canvas's rounds from 1."""
    levels: list[Lookahead] = []
    results = _deep_lookahead(adapter, levels)
    assert any(look.depth == 2 for look in levels), "no lookahead reached the canvas's last step"
    for look in levels:
        assert look.branches.block_round.min() >= 1, f"a depth-{look.depth} branch crossed into the next canvas"
    assert all(bool((r.tokens < adapter.vocab_size).all()) for r in results)


def test_a_canvas_finished_inside_a_lookahead_records_its_depth_and_branch(adapter: DiffusionGemmaAdapter) -> None:
    """The output holds canvases a branch finished: their commits say depth 2 and the adopted branch."""
    results = _deep_lookahead(adapter, [])
    depth = torch.cat([r.commit_depth for r in results])
    branch = torch.cat([r.commit_branch for r in results])
    committed = torch.cat([r.commit_call for r in results]) >= 0
    assert bool((depth[committed] == 2).any()), depth.tolist()
    assert torch.equal(depth[committed] >= 1, branch[committed] >= 0), "a lookahead commit names its branch"


def test_the_decoder_refuses_a_prefix_that_does_not_end_at_its_canvas(adapter: DiffusionGemmaAdapter) -> None:
    memory = SlotMemory.for_slots(1)
    prompt = torch.tensor(PROMPTS[0])
    adapter.encode(memory.prefixes, 0, prompt, torch.arange(len(prompt)), len(prompt))
    tokens = torch.cat([prompt, torch.arange(10, 10 + 2 * adapter.canvas_length)])[None]
    attention = torch.ones_like(tokens, dtype=torch.bool)
    args = (tokens, attention)
    slot, key = torch.tensor([0]), torch.tensor([1])
    denoise = lambda start: adapter.cached_logits(  # the encoder-prefix cache's decoder call
        *args, start, start + adapter.canvas_length, prefix_read(memory.prefixes, memory.conditioning, slot, start, key)
    )
    assert denoise(torch.tensor([len(prompt)])).shape == (1, 8, 96)
    past = torch.tensor([len(prompt) + adapter.canvas_length])  # the next canvas: its predecessor is not encoded
    with pytest.raises(RuntimeError, match=r"canvas at column 13 of slot 0 \(row key 1\) against an encoded prefix"):
        denoise(past)


def test_a_finished_canvas_records_the_probability_of_the_tokens_it_holds(
    adapter: DiffusionGemmaAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step per canvas, hot (t = 1.5): each canvas is its step's draft, and each of its tokens
    records its probability at that temperature (``log_probability`` ranks the output's own tokens),
    not the probability of the token the step sampled there."""
    logits: list[torch.Tensor] = []
    denoise = DiffusionGemmaAdapter.denoise

    def recorded(self: DiffusionGemmaAdapter, *args: object, **kwargs: object) -> torch.Tensor:
        out = denoise(self, *args, **kwargs)
        logits.append(out)
        return out

    monkeypatch.setattr(DiffusionGemmaAdapter, "denoise", recorded)
    rule = UniformNoiseSteps(max_steps=1, t_min=0.9, t_max=1.5)
    decoder = SearchDecoder(commit=rule, sampling=Sampling(confidence="sampling"), name="dg")
    for request in _requests(adapter, 2 * adapter.canvas_length, [0, 1, 2]):
        logits.clear()
        result = decoder.decode(RolloutEngine(adapter), [request], adapter.canvas_length)[0]
        probs = torch.softmax(torch.cat([step[0] for step in logits]) / 1.5, dim=-1)  # [canvases * 8, V]
        assert torch.equal(result.tokens, probs.argmax(dim=-1)), "a one-step canvas is its draft"
        held = probs.gather(1, result.tokens[:, None]).squeeze(1)
        torch.testing.assert_close(result.commit_confidence, held, rtol=1e-5, atol=1e-6)


@settings(max_examples=8, deadline=None)
@given(rows=st.lists(st.integers(0, len(PROMPTS) - 1), min_size=2, max_size=5, unique=True), seed=st.integers(0, 99))
def test_a_rows_decoder_logits_do_not_depend_on_its_batch(adapter: DiffusionGemmaAdapter, rows, seed) -> None:
    """Mixed prompt lengths, each row against its own prefix, with self-conditioning: a row's
    logits batched equal its logits alone, to the bit (what a sampled decode's draws read)."""
    generator = torch.Generator().manual_seed(seed)
    memory = SlotMemory.for_slots(len(PROMPTS))
    for s in rows:
        prompt = torch.tensor(PROMPTS[s])
        adapter.encode(memory.prefixes, s, prompt, torch.arange(len(prompt)), len(prompt))
    slot = torch.tensor(rows)
    canvas = torch.randint(3, 90, (len(rows), adapter.canvas_length), generator=generator)
    at = torch.stack([len(PROMPTS[s]) + torch.arange(adapter.canvas_length) for s in rows])
    conditioning = torch.randn(len(rows), adapter.canvas_length, adapter.vocab_size, generator=generator) * 3
    has = torch.ones(len(rows), dtype=torch.bool)
    together = adapter.denoise(canvas, at, memory.prefixes, slot, (conditioning, has))
    for i in range(len(rows)):
        alone = adapter.denoise(
            canvas[i : i + 1], at[i : i + 1], memory.prefixes, slot[i : i + 1], (conditioning[i : i + 1], has[:1])
        )
        assert torch.equal(alone[0], together[i]), f"row {i} (slot {rows[i]})"
