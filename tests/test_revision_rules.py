"""Saber's and RCR's rules as their authors' loops run them, each pinned by a constructed case
where the two readings commit or re-mask differently (``../shared/reference/algorithms.md``, the
Saber and RCR sections marked "measured"). The authors' code has no licence; these tests encode
the behaviour described there, nothing of the code itself."""

from __future__ import annotations

import torch
from conftest import FixedLogits, make_requests, text_decoder

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.components.commit import MeanConfidenceRule, top_k_mask
from dlmsearch.search.components.revision import ConfidenceDrop, RunningConfidence
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.state import BlockMoves, Canvas, Evaluation, Layout, initial_canvas

MASK, VOCAB = 9, 12
CALL = torch.zeros(1, dtype=torch.long)


def blank(layout: Layout) -> Canvas:
    """One row: a 2-token prompt and an all-masked generation."""
    return initial_canvas([torch.tensor([1, 2])], [torch.full((layout.gen_length,), MASK)], layout, MASK, 0)


def scored(layout: Layout, confidence: list[float]) -> Evaluation:
    """An evaluation proposing token 3 everywhere with these confidences over the generation."""
    full = torch.zeros(1, layout.width)
    full[0, layout.gen_start :] = torch.tensor(confidence)
    return Evaluation(token=torch.full((1, layout.width), 3), confidence=full)


def at(layout: Layout, *positions: int) -> torch.Tensor:
    """``[1, T]`` mask of generation positions."""
    mask = torch.zeros(1, layout.width, dtype=torch.bool)
    mask[0, [layout.gen_start + p for p in positions]] = True
    return mask


def commit(canvas: Canvas, chosen: torch.Tensor, evaluation: Evaluation, layout: Layout) -> Canvas:
    return canvas.commit(
        chosen,
        evaluation.token,
        evaluation.confidence,
        CALL,
        0,
        -1,
        layout,
        BlockMoves(whole_prefix=True),
        advance=False,
    )


def test_saber_first_step_backtracks_against_a_zero_record() -> None:
    """Cause 1: ``c_prev`` starts at 0, so the first step's Δ is ``c`` itself: of the two commits
    (0.9 and 0.8: τ = 1 takes the top n = 2) the less confident goes back and the step nets one.
    Reading the first step as "no previous round" (Δ = +inf) would net two, or take back the 0.9."""
    layout = Layout(gen_start=2, gen_length=8, block_length=8)
    before, evaluation = blank(layout), scored(layout, [0.9, 0.8, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1])
    chosen = MeanConfidenceRule(n=2).select(before, evaluation, layout)
    assert torch.equal(chosen, at(layout, 0, 1))
    after = commit(before, chosen, evaluation, layout)
    remask = ConfidenceDrop(n=2).revise(
        before, after, layout, evaluation, Evaluation.empty(1, layout.width, frozenset())
    )
    assert torch.equal(remask, at(layout, 1))


def test_saber_first_step_nets_one_commit_in_a_decode(adapter: ModelAdapter) -> None:
    """The same at the decoder: after its first call every prompt has exactly one position filled."""
    requests = make_requests([3, 5, 2], 16, seed=4)
    filled_after_first: list[list[int]] = []

    def record(canvas: Canvas, source) -> None:
        if not filled_after_first:
            filled_after_first.append((16 - canvas.masked.sum(dim=1)).tolist())

    text_decoder("saber").decode(RolloutEngine(adapter=adapter), requests, 8, on_round=record)
    assert filled_after_first == [[1, 1, 1]]


def test_saber_block_is_full_only_when_the_whole_prefix_is() -> None:
    """Cause 2: block 1 fills up while block 0 still holds a position backtracking re-masked.
    The authors' loop checks ``x[:, :block_end]``: it stays in block 1 and backtracks again;
    checking block 1 alone would move on to block 2 and skip the backtrack."""
    layout = Layout(gen_start=2, gen_length=12, block_length=4)
    evaluation = scored(layout, [0.9] * 4 + [0.8] * 4 + [0.5] * 4)
    canvas = commit(blank(layout), at(layout, 0, 1, 2, 3), evaluation, layout).advance_blocks(
        layout, BlockMoves(whole_prefix=True)
    )
    canvas = commit(canvas, at(layout, 4, 5), evaluation, layout).remask(
        at(layout, 2), MASK
    )  # block 1's first step backtracks into block 0
    assert (int(canvas.block), int(canvas.block_round)) == (1, 1) and bool(canvas.masked[0, layout.gen_start + 2])
    after = commit(canvas, at(layout, 6, 7), evaluation, layout)  # block 1 full; block 0 is not
    assert int(after.advance_blocks(layout, BlockMoves(whole_prefix=True)).block) == 1
    assert int(after.advance_blocks(layout, BlockMoves()).block) == 2  # the other reading
    previous = scored(layout, [0.9] * 4 + [0.85, 0.95] + [0.8] * 2 + [0.5] * 4)
    remask = ConfidenceDrop(n=2).revise(canvas, after, layout, evaluation, previous)
    assert remask is not None and torch.equal(
        remask, at(layout, 5)
    )  # f = 2 commits, r = 1: the largest drop (0.95 -> 0.8)
    filled = commit(
        canvas, at(layout, 2, 6, 7), evaluation, layout
    )  # nothing masked before block 1's end: no backtrack
    assert ConfidenceDrop(n=2).revise(canvas, filled, layout, evaluation, previous) is None


def test_rcr_schedule_is_computed_as_the_authors_do() -> None:
    """Cause 3: ``g`` in float64, cast to float32, then ``N * g`` and the floor in float32.
    N = 12, S = 3 leaves 8 masked after the first step (float32 throughout: 7), and the two
    readings differ for 2,935 of the 16,384 pairs N <= 256, S <= 64 (measured with the authors'
    code), never where S is a power of two."""
    layout = Layout(gen_start=0, gen_length=12, block_length=12)
    assert RunningConfidence().bind(layout, 3).masked_after(torch.tensor([12]), torch.tensor([1])).tolist() == [8]
    n = torch.arange(1, 257)[:, None]
    pairs, differing = 256, 0  # S = 1: no step re-masks
    for steps in range(2, 65):
        done = torch.arange(1, steps)[None, :].expand(256, -1)  # the steps that re-mask: t + 1 = 1 .. S - 1
        authors = RunningConfidence().bind(layout, steps).masked_after(n.expand_as(done), done)
        float32 = torch.floor(n.float() * (1 - done.float() / steps).clamp(1e-6, 1.0)).long()
        differs = (authors != float32).any(dim=1)
        assert not (steps & (steps - 1) == 0 and bool(differs.any())), steps
        pairs, differing = pairs + 256, differing + int(differs.sum())
    assert (pairs, differing) == (16384, 2935)


def test_rcr_pools_differ_on_confidences_of_exactly_one() -> None:
    """Cause 4: with top-p at temperature 0 confident positions read exactly 1.0. ``pool=authors``
    never re-masks those (the authors' ``topk`` spends the re-masks on the prompt and future
    positions, which it also reads as 1.0), so fewer than scheduled go back; ``pool=paper`` re-masks
    the full schedule, the earlier of tied positions first."""
    layout = Layout(gen_start=2, gen_length=8, block_length=8)
    evaluation = scored(layout, [1.0, 0.7, 1.0, 1.0, 0.6, 1.0, 1.0, 1.0])
    before = blank(layout)
    after = before.commit(
        before.masked,
        evaluation.token,
        evaluation.confidence,
        CALL,
        0,
        -1,
        layout,
        BlockMoves(block_budget=4, holds_block=True),
        advance=False,
    )
    # S = 4: after the first step floor(8 * 0.75) = 6 positions go back to the mask
    authors = RunningConfidence(pool="authors").bind(layout, 4).revise(before, after, layout, evaluation, evaluation)
    paper = RunningConfidence(pool="paper").bind(layout, 4).revise(before, after, layout, evaluation, evaluation)
    assert torch.equal(authors, at(layout, 1, 4))
    assert torch.equal(paper, at(layout, 1, 4, 0, 2, 3, 5))


def test_top_k_takes_eligible_positions_scored_minus_infinity() -> None:
    """A row with k eligible positions gets k, even where their scores are -inf (Saber's +inf drops
    at a new block's first step, negated); ineligible positions never tie with them."""
    scores = torch.tensor([[0.0, -float("inf"), -float("inf"), 1.0]])
    eligible = torch.tensor([[False, True, True, True]])
    assert top_k_mask(scores, eligible, torch.tensor([2])).tolist() == [[False, True, False, True]]


def test_rcr_pools_in_a_decode_on_a_saturated_model() -> None:
    """With top-p 0.95 at temperature 0 (the preset), half the positions read exactly 1.0: the
    paper's pool re-masks the schedule's 6 + 4 + 2 of 8, the authors' only those below 1.0."""
    prompt, gen = 3, 8
    logits = torch.zeros(1, prompt + gen, VOCAB)
    logits[0, prompt : prompt + 4, 3] = 8.0  # p1 > 0.95: exactly 1.0 after top-p
    logits[0, prompt + 4 :, 4] = 1.0  # p1 about 0.2
    adapter = ModelAdapter(module=FixedLogits(logits), mask_id=MASK, vocab_size=VOCAB)
    requests = make_requests([prompt], gen, seed=0, mask_id=MASK)
    revisions = {}
    for pool in ("authors", "paper"):
        decoder = text_decoder("rcr", "decoder.commit.steps=4", f"decoder.revision.pool={pool}", gen_length=gen)
        [result] = decoder.decode(RolloutEngine(adapter=adapter), requests, gen)
        assert result.steps == 4 and not bool((result.tokens == MASK).any())
        revisions[pool] = int(result.revisions.sum())
    assert revisions == {"authors": 4 + 4 + 2, "paper": 6 + 4 + 2}
