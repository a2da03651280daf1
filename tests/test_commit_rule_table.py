"""Every commit rule of ``dlmsearch/search/components/commit.py`` as a table of small, hand-computed
cases (after mctx's tests of its helpers): one row of 8 generation columns, the inputs the rule
reads, and the commit mask written out from the formula its docstring cites; the case's id states
that formula. The rules are called as the engine calls them: ``rule.bind(layout)`` (the decode
plan) and ``.select(canvas, evaluation, layout)`` (the driver), on a canvas made by
``initial_canvas`` and ``Canvas.commit`` / ``Canvas.remask``.

Notation: a row is a string over the 8 columns, ``M`` masked, ``g`` given (a pre-filled token,
never committed by the model), ``c`` committed by the model, ``r`` committed then re-masked by a
revision. An expected mask is a string, ``x`` where the rule commits. Ties between equal scores go
to the lower column everywhere (``top_k_mask`` sorts stably, descending).
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import torch

from dlmsearch.search.components.commit import (
    DreamSchedule,
    EntropyBudget,
    FactorRule,
    FastBlockRule,
    FillBlock,
    LowConfidenceSchedule,
    MeanConfidenceRule,
    ReMDMSchedule,
    StableConfidenceRule,
    ThresholdRule,
    WideInRule,
)
from dlmsearch.search.components.position_calibrated import PositionCalibratedRule
from dlmsearch.search.components.sdar_rules import BlockDiffusionSchedule, EntropyBoundedRule
from dlmsearch.search.records.state import BlockMoves, Canvas, Evaluation, Layout, initial_canvas

MASK, GIVEN, PROPOSED = 9, 5, 3
ONE = Layout(gen_start=0, gen_length=8, block_length=8)  # one block of 8
TWO = Layout(gen_start=0, gen_length=8, block_length=4)  # two blocks of 4
LOW = [0.1] * 8  # confidences where the case does not read them


def canvas(row: str, layout: Layout = ONE, block: int = 0, step: int = 0, psi: list[float] | None = None) -> Canvas:
    """One canvas row from its notation; ``psi``: the commit confidences of the ``c``/``r`` columns in
    order (0.5 each by default); ``block``/``step``: the current block and the commits made in it."""
    assert len(row) == layout.gen_length and set(row) <= set("Mgcr")
    template = torch.tensor([GIVEN if ch == "g" else MASK for ch in row])
    state = initial_canvas([torch.zeros(0, dtype=torch.long)], [template], layout, MASK, pad_id=0)
    decided = [i for i, ch in enumerate(row) if ch in "cr"]
    if decided:
        confidence = torch.zeros(1, layout.width)
        confidence[0, decided] = torch.tensor(psi if psi is not None else [0.5] * len(decided))
        chosen = torch.zeros(1, layout.width, dtype=torch.bool)
        chosen[0, decided] = True
        state = state.commit(
            chosen,
            torch.full_like(state.tokens, PROPOSED),
            confidence,
            torch.zeros(1, dtype=torch.long),
            0,
            -1,
            layout,
            BlockMoves(),
            advance=False,
        )
        revised = torch.tensor([[ch == "r" for ch in row]])
        state = state.remask(revised, MASK)
    return attrs.evolve(state, block=torch.tensor([block]), block_round=torch.tensor([step]))


def evaluation(confidence: list[float], tokens: list[int] | None = None, **statistics: list[float]) -> Evaluation:
    """One evaluation row: the proposal's confidences, and any of margin, entropy, kl, uniform."""
    row = lambda values: torch.tensor([values], dtype=torch.float32)
    return Evaluation(
        token=torch.tensor([tokens if tokens is not None else [PROPOSED] * len(confidence)]),
        confidence=row(confidence),
        **{name: row(values) for name, values in statistics.items()},
    )


def decide(rule: Any, row: str, confidence: list[float], **inputs: Any) -> str:
    """The rule's commit mask for this case, as the engine computes it, in the ``x.`` notation."""
    layout = inputs.pop("layout", ONE)
    state = canvas(row, layout, inputs.pop("block", 0), inputs.pop("step", 0), inputs.pop("psi", None))
    chosen = rule.bind(layout).select(state, evaluation(confidence, inputs.pop("tokens", None), **inputs), layout)
    assert chosen.shape == (1, layout.width) and chosen.dtype == torch.bool
    assert not bool((chosen & ~state.masked).any()), "a rule commits masked positions only"
    return "".join("x" if bit else "." for bit in chosen[0].tolist())


# Fast-dLLM (``generate.py``'s threshold path): keep every position of the current block with
# c >= tau, and always the top-1 (its loop starts at k = 1).
THRESHOLD = [
    pytest.param(
        ThresholdRule(0.9),
        "MMMMMMMM",
        [0.95, 0.5, 0.92, 0.3, 0.9, 0.1, 0.2, 0.4],
        {},
        "x.x.x...",
        id="fast-dllm: c >= 0.9 -> commit (0.9 itself included)",
    ),
    pytest.param(
        ThresholdRule(0.9),
        "MMMMMMMM",
        [0.5, 0.6, 0.8, 0.3, 0.7, 0.1, 0.2, 0.4],
        {},
        "..x.....",
        id="fast-dllm: none >= 0.9 -> argmax c",
    ),
    pytest.param(
        ThresholdRule(0.9),
        "MMMMMMMM",
        [0.5, 0.8, 0.3, 0.8, 0.7, 0.1, 0.2, 0.4],
        {},
        ".x......",
        id="fast-dllm: none >= 0.9, argmax tied at 0.8 -> the lower column",
    ),
    pytest.param(
        ThresholdRule(0.5),
        "MMMMMMMM",
        [0.5, 0.49, 0.7, 0.1, 0.1, 0.1, 0.1, 0.6],
        {},
        "x.x....x",
        id="fast-dllm: tau=0.5 -> c >= 0.5 (0.49 waits)",
    ),
    pytest.param(
        ThresholdRule(0.9),
        "gMgMMMMM",
        [0.99, 0.5, 0.99, 0.95, 0.1, 0.1, 0.1, 0.1],
        {},
        "...x....",
        id="fast-dllm: masked positions only -> the given columns' 0.99 are not committed",
    ),
    pytest.param(
        ThresholdRule(0.9),
        "gMMMMMMM",
        [0.95] * 8,
        {},
        ".xxxxxxx",
        id="fast-dllm: all c >= 0.9 -> every masked position",
    ),
    pytest.param(ThresholdRule(0.9), "gggggggg", [0.95] * 8, {}, "........", id="fast-dllm: nothing masked -> nothing"),
    pytest.param(
        ThresholdRule(0.9),
        "MMMMMMMM",
        [0.5, 0.6, 0.3, 0.2, 0.99, 0.99, 0.99, 0.99],
        {"layout": TWO},
        ".x......",
        id="fast-dllm: current block only -> block 1's 0.99 wait, argmax of block 0",
    ),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), THRESHOLD)
def test_threshold_rule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# Fast-dLLM's factor rule: sort the block's masked c descending; the r-th (1-based) is accepted while
# c_(r) >= 1 - factor / (r + 1) (f=1: 1/2, 2/3, 3/4, 4/5, ...); at least one.
FACTOR = [
    pytest.param(
        FactorRule(1.0),
        "MMMMMMMM",
        [0.95, 0.5, 0.85, 0.3, 0.7, 0.1, 0.2, 0.4],
        {},
        "x.x.....",
        id="factor=1: .95 >= 1-1/2, .85 >= 1-1/3, .7 < 1-1/4 -> top 2",
    ),
    pytest.param(
        FactorRule(1.0),
        "MMMMMMMM",
        [0.9, 0.8, 0.75, 0.1, 0.2, 0.3, 0.4, 0.05],
        {},
        "xxx.....",
        id="factor=1: c_(3) = 0.75 = 1-1/4 accepted (>=); .4 < 1-1/5 -> top 3",
    ),
    pytest.param(
        FactorRule(2.0),
        "MMMMMMMM",
        [0.6, 0.4, 0.55, 0.3, 0.2, 0.1, 0.65, 0.05],
        {},
        "x.x...x.",
        id="factor=2: .65 >= 0, .6 >= 1-2/3, .55 >= 1-2/4, .4 < 1-2/5 -> top 3",
    ),
    pytest.param(
        FactorRule(1.0),
        "MMMMMMMM",
        [0.3, 0.45, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1],
        {},
        ".x......",
        id="factor=1: c_(1) = .45 < 1-1/2 -> none accepted -> argmax",
    ),
    pytest.param(
        FactorRule(1.0),
        "MMMMMMMM",
        [0.7, 0.7, 0.7, 0.1, 0.1, 0.1, 0.1, 0.1],
        {},
        "xx......",
        id="factor=1: three tied at .7, .7 < 1-1/4 at r=3 -> 2, the lower columns",
    ),
    pytest.param(
        FactorRule(1.0),
        "MMMMMMMM",
        [0.9] * 8,
        {},
        "xxxxxxxx",
        id="factor=1: all .9 >= 1-1/9 (r=8) -> every masked position",
    ),
    pytest.param(
        FactorRule(1.0),
        "gMMMMMMM",
        [0.99, 0.6, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1],
        {},
        ".x......",
        id="factor=1: the given column's .99 is not ranked; .6 >= 1-1/2, .3 < 1-1/3 -> 1",
    ),
    pytest.param(FactorRule(1.0), "gggggggg", [0.99] * 8, {}, "........", id="factor: nothing masked -> nothing"),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), FACTOR)
def test_factor_rule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# Fast block diffusion (ETE's and AdaLook's base): c >= tau in every unlocked block (blocks 0..current),
# and at least the current block's best (of any unlocked block where the current one has no mask).
FAST_BLOCK = [
    pytest.param(
        FastBlockRule(threshold=0.9),
        "MgggMMMM",
        [0.95, 0.0, 0.0, 0.0, 0.5, 0.92, 0.3, 0.2],
        {"layout": TWO, "block": 1},
        "x....x..",
        id="fast block: c >= 0.9 in blocks 0..1 -> the earlier block's leftover too",
    ),
    pytest.param(
        FastBlockRule(threshold=0.9),
        "MgggMMMM",
        [0.8, 0.0, 0.0, 0.0, 0.5, 0.6, 0.3, 0.2],
        {"layout": TWO, "block": 1},
        ".....x..",
        id="fast block: none >= 0.9 -> argmax of the current block (not block 0's .8)",
    ),
    pytest.param(
        FastBlockRule(threshold=0.9),
        "MMMMMMMM",
        [0.5, 0.6, 0.3, 0.2, 0.99, 0.99, 0.99, 0.99],
        {"layout": TWO, "block": 0},
        ".x......",
        id="fast block: block 1 is locked while block 0 is current -> argmax of block 0",
    ),
    pytest.param(
        FastBlockRule(threshold=0.9),
        "MMgggggg",
        [0.3, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        {"layout": TWO, "block": 1},
        ".x......",
        id="fast block: current block has no mask, none >= 0.9 -> argmax of the unlocked blocks",
    ),
    pytest.param(
        FastBlockRule(threshold=0.9),
        "MMMMMMMM",
        [0.95] * 8,
        {"layout": TWO, "block": 1},
        "xxxxxxxx",
        id="fast block: all c >= 0.9 in blocks 0..1 -> every masked position",
    ),
    pytest.param(
        FastBlockRule(threshold=0.9),
        "gggggggg",
        [0.95] * 8,
        {"layout": TWO, "block": 1},
        "........",
        id="fast block: nothing masked -> nothing",
    ),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), FAST_BLOCK)
def test_fast_block_rule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# LLaDA (``get_num_transfer_tokens``): steps / blocks steps per block; the block's N masks split
# floor(N / S) per step, one more in the first N mod S steps; each step the top k by the ordering.
# The rule computes k = ceil(remaining / steps left), the same split.
SPREAD = [0.1, 0.9, 0.3, 0.8, 0.5, 0.2, 0.7, 0.4]  # ranks: columns 1, 3, 6, 4, 7, 2, 5, 0
LOW_CONFIDENCE = [
    pytest.param(
        LowConfidenceSchedule(steps=4),
        "MMMMMMMM",
        SPREAD,
        {},
        ".x.x....",
        id="llada: 8 masks over 4 steps -> k=2, top 2 by c",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=3),
        "MMMMMMMM",
        SPREAD,
        {},
        ".x.x..x.",
        id="llada: 8 over 3 steps = [3,3,2] (remainder first) -> step 0 k=3",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=3),
        "cccMMMMM",
        [0.9, 0.9, 0.9, 0.5, 0.2, 0.7, 0.4, 0.8],
        {"step": 1},
        "...x.x.x",
        id="llada: [3,3,2] step 1, 5 masks left -> k=3 among the masks (committed .9s skipped)",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=3),
        "ccccccMM",
        [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.1, 0.2],
        {"step": 2},
        "......xx",
        id="llada: [3,3,2] last step -> k=2, the 2 masks left whatever their c",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=8),
        "MMMMMMMM",
        [0.5, 0.9, 0.3, 0.9, 0.7, 0.1, 0.2, 0.4],
        {},
        ".x......",
        id="llada: k=1, top c tied at .9 -> the lower column",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=2),
        "cccccMMM",
        LOW,
        {"step": 3},
        ".....xxx",
        id="llada: past the block's 2 steps (step 3) -> steps left clamps to 1, k = all 3 masks",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=4),
        "MMMMMMMM",
        [0.1, 0.2, 0.9, 0.3, 0.99, 0.99, 0.99, 0.99],
        {"layout": TWO},
        "..xx....",
        id="llada: 4 steps over 2 blocks -> 2 per block, block 0's 4 masks -> k=2 in block 0 only",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=4, ordering="margin"),
        "MMMMMMMM",
        [0.5] * 8,
        {"margin": [0.1, 0.5, 0.2, 0.6, 0.3, 0.05, 0.4, 0.0]},
        ".x.x....",
        id="llada ordering=margin: k=2, top 2 by top1-top2 margin",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=4, ordering="neg_entropy"),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.9, 0.2, 0.5, 0.1, 0.7, 0.8, 0.3, 0.6]},
        ".x.x....",
        id="llada ordering=neg_entropy: k=2, the 2 lowest entropies",
    ),
    pytest.param(
        LowConfidenceSchedule(steps=4, ordering="random"),
        "MMMMMMMM",
        SPREAD,
        {"uniform": [0.1, 0.2, 0.95, 0.3, 0.4, 0.9, 0.5, 0.6]},
        "..x..x..",
        id="llada ordering=random: k=2, the 2 highest uniform draws",
    ),
    pytest.param(LowConfidenceSchedule(steps=4), "gggggggg", SPREAD, {}, "........", id="llada: nothing masked"),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), LOW_CONFIDENCE)
def test_low_confidence_schedule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# Dream (``diffusion_generate``): t, s = linspace(1, eps, steps + 1)[i, i + 1]; step i commits
# int(n_masked * (1 - s / t)) in float32 (all that remain at the last step), top k by the ordering.
DREAM = [
    pytest.param(
        DreamSchedule(steps=4, eps=0.0),
        "MMMMMMMM",
        SPREAD,
        {},
        ".x.x....",
        id="dream eps=0: t=1, s=.75 -> int(8 * .25) = 2",
    ),
    pytest.param(
        DreamSchedule(steps=4),
        "MMMMMMMM",
        SPREAD,
        {},
        ".x......",
        id="dream eps=1e-3: s=.75025 -> int(8 * .24975) = int(1.998) = 1",
    ),
    pytest.param(
        DreamSchedule(steps=4, eps=0.0),
        "ggMMMMMM",
        [0.9, 0.9, 0.1, 0.3, 0.8, 0.5, 0.2, 0.4],
        {"step": 1},
        "....x...",
        id="dream eps=0 step 1: 6 * (1 - .5/.75) is 1.9999999 in float32 -> int 1",
    ),
    pytest.param(
        DreamSchedule(steps=8),
        "ggggMMMM",
        [0.1, 0.1, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9],
        {},
        "........",
        id="dream 8 steps: s=.875125 -> int(4 * .124875) = 0 -> the step commits nothing",
    ),
    pytest.param(
        DreamSchedule(steps=4),
        "gggggMMM",
        LOW,
        {"step": 3},
        ".....xxx",
        id="dream: the last step (i = steps-1) -> all that remain",
    ),
    pytest.param(
        DreamSchedule(steps=4),
        "gggggMMM",
        LOW,
        {"step": 5},
        ".....xxx",
        id="dream: past the last step -> clamped to it, all that remain",
    ),
    pytest.param(
        DreamSchedule(steps=4, eps=0.0),
        "MMMMMMMM",
        [0.9, 0.5, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1],
        {},
        "x.x.....",
        id="dream: k=2 of three tied at .9 -> the lower columns",
    ),
    pytest.param(
        DreamSchedule(steps=4, eps=0.0, ordering="margin"),
        "MMMMMMMM",
        [0.5] * 8,
        {"margin": [0.1, 0.5, 0.2, 0.6, 0.3, 0.05, 0.4, 0.0]},
        ".x.x....",
        id="dream topk_margin: k=2 by top1-top2 margin",
    ),
    pytest.param(
        DreamSchedule(steps=4, eps=0.0, ordering="neg_entropy"),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.9, 0.2, 0.5, 0.1, 0.7, 0.8, 0.3, 0.6]},
        ".x.x....",
        id="dream entropy: k=2, the 2 lowest entropies",
    ),
    pytest.param(DreamSchedule(steps=4), "gggggggg", SPREAD, {}, "........", id="dream: nothing masked"),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), DREAM)
def test_dream_schedule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# EB-Sampler: order the block's masks by the error proxy (entropy ascending, or c / margin
# descending); commit the longest prefix with sum H - max H <= gamma; at least one.
ENTROPY = [0.5, 0.01, 0.3, 0.02, 0.9, 0.05, 0.2, 0.4]  # ascending: columns 1, 3, 5, 6, 2, 7, 0, 4
ENTROPY_BUDGET = [
    pytest.param(
        EntropyBudget(gamma=0.1),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": ENTROPY},
        ".x.x.xx.",
        id="eb-sampler: H .01,.02,.05,.2: sum-max = .08 <= .1; +.3: .28 > .1 -> 4",
    ),
    pytest.param(
        EntropyBudget(gamma=0.125),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.25, 0.125, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0]},
        "xx......",
        id="eb-sampler: H .125,.25: sum-max = .125 = gamma accepted (<=); +.5: .375 -> 2",
    ),
    pytest.param(
        EntropyBudget(gamma=0.0),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": ENTROPY},
        ".x......",
        id="eb-sampler gamma=0: sum-max > 0 from the second on -> one per step, the lowest H",
    ),
    pytest.param(
        EntropyBudget(gamma=0.0),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.2, 0.1, 0.3, 0.1, 0.5, 0.6, 0.7, 0.8]},
        ".x......",
        id="eb-sampler gamma=0: lowest H tied at .1 -> the lower column",
    ),
    pytest.param(
        EntropyBudget(gamma=10.0),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": ENTROPY},
        "xxxxxxxx",
        id="eb-sampler gamma=10: sum-max of all 8 = 1.48 <= 10 -> every masked position",
    ),
    pytest.param(
        EntropyBudget(gamma=0.1, error_proxy="confidence"),
        "MMMMMMMM",
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2],
        {"entropy": [0.05, 0.3, 0.02, 0.1, 0.01, 0.01, 0.01, 0.01]},
        "xxx.....",
        id="eb-sampler proxy=confidence: by c, H .05,.3,.02: .37-.3 = .07 <= .1; +.1: .17 > .1 -> 3",
    ),
    pytest.param(
        EntropyBudget(gamma=0.1, error_proxy="margin"),
        "MMMMMMMM",
        [0.5] * 8,
        {
            "entropy": [0.01, 0.01, 0.01, 0.01, 0.1, 0.02, 0.3, 0.05],
            "margin": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
        },
        ".....xxx",
        id="eb-sampler proxy=margin: by margin, H .05,.3,.02: .07 <= .1; +.1: .17 > .1 -> 3",
    ),
    pytest.param(
        EntropyBudget(gamma=0.0),
        "gMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.0, 0.5, 0.4, 0.3, 0.2, 0.6, 0.7, 0.8]},
        "....x...",
        id="eb-sampler gamma=0: the given column's H=0 is not ranked -> lowest masked H",
    ),
    pytest.param(
        EntropyBudget(gamma=0.1),
        "gggggggg",
        [0.5] * 8,
        {"entropy": ENTROPY},
        "........",
        id="eb-sampler: nothing masked -> nothing",
    ),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), ENTROPY_BUDGET)
def test_entropy_budget(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# RCR's commit: every masked position of blocks 0..current, whatever its confidence.
FILL_BLOCK = [
    pytest.param(
        FillBlock(steps=4),
        "MMMMMMMM",
        LOW,
        {"layout": TWO},
        "xxxx....",
        id="rcr: every mask up to the current block's end, none after",
    ),
    pytest.param(
        FillBlock(steps=4),
        "MgMgMMMM",
        LOW,
        {"layout": TWO, "block": 1},
        "x.x.xxxx",
        id="rcr: block 1 -> block 0's re-masked positions too",
    ),
    pytest.param(FillBlock(steps=4), "gMgMgMgM", LOW, {}, ".x.x.x.x", id="rcr: masked positions only"),
    pytest.param(FillBlock(steps=4), "gggggggg", LOW, {}, "........", id="rcr: nothing masked -> nothing"),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), FILL_BLOCK)
def test_fill_block(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# ReMDM for LLaDA: S = steps / blocks plain steps (LLaDA's split of the block's N non-given positions)
# and, from the first step by which that split has committed floor(frac * N), L loop steps that
# commit the k best masks; top k by c on a 2^-20 grid, ties to the earlier column.
REMDM = [
    pytest.param(
        ReMDMSchedule(steps=8),
        "MMMMMMMM",
        SPREAD,
        {},
        ".x......",
        id="remdm plain step 0: split of 8 over 8 -> 1, top c",
    ),
    pytest.param(
        ReMDMSchedule(steps=4),
        "MMMMMMMM",
        SPREAD,
        {},
        ".x.x....",
        id="remdm plain step 0: split of 8 over 4 -> 2",
    ),
    pytest.param(
        ReMDMSchedule(steps=8),
        "ccccccMM",
        [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.2, 0.4],
        {"step": 6},
        ".......x",
        id="remdm step 6 < loop start floor(7/8 * 8) = 7: plain, split -> 1",
    ),
    pytest.param(
        ReMDMSchedule(steps=8, k=2),
        "ccMcMcMc",
        [0.9, 0.9, 0.3, 0.9, 0.8, 0.9, 0.6, 0.9],
        {"step": 7},
        "....x.x.",
        id="remdm loop step 7 (7 of 8 committed): k=2 best of the 3 masks",
    ),
    pytest.param(
        ReMDMSchedule(steps=8, k=2),
        "ggcMcMcc",
        [0.9, 0.9, 0.9, 0.3, 0.9, 0.4, 0.9, 0.9],
        {"step": 5},
        "...x.x..",
        id="remdm: 2 given -> N=6, loop from step 5 (floor(7/8 * 6) = 5 committed), k=2",
    ),
    pytest.param(
        ReMDMSchedule(steps=8),
        "ggcccccM",
        [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
        {"step": 14},
        "........",
        id="remdm: N=6, step 14 = plain step 14-8 = 6 -> 6 // 8 + (6 < 6) = 0, nothing",
    ),
    pytest.param(
        ReMDMSchedule(steps=8),
        "cccccccM",
        LOW,
        {"step": 15},
        ".......x",
        id="remdm: N=8, step 15 = plain step 7 after the loop -> 1",
    ),
    pytest.param(
        ReMDMSchedule(steps=8, k=3, loop_start_frac=0.5),
        "ccMcMcMM",
        [0.9, 0.9, 0.3, 0.9, 0.8, 0.9, 0.6, 0.7],
        {"step": 4},
        "....x.xx",
        id="remdm loop_start_frac=.5: loop from step floor(.5 * 8) = 4, k=3 best of 4 masks",
    ),
    pytest.param(
        ReMDMSchedule(steps=8),
        "MMMMMMMM",
        [0.1, 0.75, 0.75 + 2.0**-24, 0.2, 0.3, 0.1, 0.1, 0.1],
        {},
        ".x......",
        id="remdm: .75 and .75+2^-24 are equal on the 2^-20 grid -> the earlier column",
    ),
    pytest.param(ReMDMSchedule(steps=8), "gggggggg", LOW, {}, "........", id="remdm: nothing masked"),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), REMDM)
def test_remdm_schedule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# Saber: tau = mean psi over every position ever committed (re-masked ones too; 1 before the
# first); commit the masks of blocks 0..current with c > tau, and if fewer than n the top n by c.
MEAN_CONFIDENCE = [
    pytest.param(
        MeanConfidenceRule(n=2),
        "MMMMMMMM",
        [0.9, 0.8, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1],
        {},
        "xx......",
        id="saber: nothing committed -> tau=1, none > 1 -> top n=2",
    ),
    pytest.param(
        MeanConfidenceRule(n=2),
        "ccMMMMMM",
        [0.9, 0.9, 0.75, 0.9, 0.65, 0.72, 0.1, 0.2],
        {"psi": [0.6, 0.8]},
        "..xx.x..",
        id="saber: tau = mean(.6,.8) = .7; c > .7: 3 >= n -> those 3",
    ),
    pytest.param(
        MeanConfidenceRule(n=2),
        "ccMMMMMM",
        [0.9, 0.9, 0.75, 0.5, 0.6, 0.1, 0.2, 0.3],
        {"psi": [0.6, 0.8]},
        "..x.x...",
        id="saber: tau=.7, only .75 > .7 (1 < n) -> top 2 by c",
    ),
    pytest.param(
        MeanConfidenceRule(n=2),
        "ccMMMMMM",
        [0.9, 0.9, 0.75, 0.8, 0.9, 0.1, 0.1, 0.1],
        {"psi": [0.5, 1.0]},
        "...xx...",
        id="saber: tau = mean(.5,1) = .75; c = .75 is not > tau (strict) -> .8, .9",
    ),
    pytest.param(
        MeanConfidenceRule(n=2),
        "rcMMMMMM",
        [0.8, 0.9, 0.75, 0.6, 0.1, 0.1, 0.1, 0.1],
        {"psi": [0.9, 0.5]},
        "x.x.....",
        id="saber: a re-masked position's psi still counts: tau = mean(.9,.5) = .7 -> .8, .75",
    ),
    pytest.param(
        MeanConfidenceRule(n=2),
        "MgggMMMM",
        [0.95, 0.0, 0.0, 0.0, 0.5, 0.9, 0.3, 0.2],
        {"layout": TWO, "block": 1},
        "x....x..",
        id="saber: candidates are the masks of blocks 0..current -> tau=1, top 2 incl. block 0's",
    ),
    pytest.param(
        MeanConfidenceRule(n=2),
        "MMMMMMMM",
        [0.1, 0.2, 0.3, 0.4, 0.9, 0.9, 0.9, 0.9],
        {"layout": TWO},
        "..xx....",
        id="saber: block 1 locked while block 0 is current -> top 2 of block 0",
    ),
    pytest.param(
        MeanConfidenceRule(n=2),
        "MMMMMMMM",
        [0.3, 0.5, 0.5, 0.5, 0.1, 0.1, 0.1, 0.1],
        {},
        ".xx.....",
        id="saber: tau=1, top 2 of three tied at .5 -> the lower columns",
    ),
    pytest.param(
        MeanConfidenceRule(n=4),
        "ggggggMM",
        LOW,
        {},
        "......xx",
        id="saber: n=4 larger than the 2 masks -> both",
    ),
    pytest.param(MeanConfidenceRule(n=2), "gggggggg", LOW, {}, "........", id="saber: nothing masked -> nothing"),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), MEAN_CONFIDENCE)
def test_mean_confidence_rule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# PC-Sampler: LLaDA's schedule ranking by exp(-lambda * r) * min(-c * ln(f(token) + 1e-9), alpha), r the
# position in the block; no prior file: f = 1/e for every token, the score exp(-lambda r) * min(c, alpha).
POSITION_CALIBRATED = [
    pytest.param(
        {"steps": 8, "decay": 0.25},
        "MMMMMMMM",
        [0.5, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1],
        {},
        "x.......",
        id="pc-sampler: k=1, .5 at r=0 beats .6 * exp(-.25) = .467 at r=1",
    ),
    pytest.param(
        {"steps": 8, "decay": 0.0},
        "MMMMMMMM",
        [0.5, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1],
        {},
        ".x......",
        id="pc-sampler lambda=0: the plain confidence -> .6",
    ),
    pytest.param(
        {"steps": 8, "decay": 0.0, "alpha": 0.4},
        "MMMMMMMM",
        [0.5, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1],
        {},
        "x.......",
        id="pc-sampler alpha=.4: min(.5,.4) = min(.6,.4) tie -> the lower column",
    ),
    pytest.param(
        {"steps": 4, "decay": 0.25},
        "MMMMMMMM",
        [0.5, 0.6, 0.55, 0.1, 0.1, 0.1, 0.1, 0.1],
        {},
        "xx......",
        id="pc-sampler: k=2 of .5, .6 e^-.25 = .467, .55 e^-.5 = .334 -> columns 0, 1",
    ),
    pytest.param(
        {"steps": 4, "decay": 0.25},
        "ggggMMMM",
        [0.9, 0.9, 0.9, 0.9, 0.5, 0.6, 0.55, 0.1],
        {"layout": TWO, "block": 1},
        "....xx..",
        id="pc-sampler block 1: r from the block start, k = 4 masks over 2 steps = 2",
    ),
    pytest.param(
        {"steps": 8, "decay": 0.0, "prior": {"num_token": 100, "p_baseline_dict": {"3": 50, "4": 1}}},
        "MMMMMMMM",
        [0.9, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1],
        {"tokens": [3, 4, 5, 3, 3, 3, 3, 3]},
        ".x......",
        id="pc-sampler prior: -.3 ln .01 = 1.38 beats -.9 ln .5 = .62 and unseen -.2 ln .01 = .92",
    ),
    pytest.param({"steps": 8}, "gggggggg", LOW, {}, "........", id="pc-sampler: nothing masked"),
]


@pytest.mark.parametrize(("settings", "row", "confidence", "inputs", "expected"), POSITION_CALIBRATED)
def test_position_calibrated_rule(
    settings: dict, row: str, confidence: list[float], inputs: dict, expected: str, tmp_path
) -> None:
    settings = dict(settings)
    if "prior" in settings:
        table = tmp_path / "prior.json"
        table.write_text(json.dumps(settings.pop("prior")))
        settings["frequencies"] = str(table)
    assert decide(PositionCalibratedRule(**settings), row, confidence, **inputs) == expected


# KLASS (``llada_klass.py``): from the block's second step, commit every mask with c > conf and KL < kl;
# where none is ready, LLaDA's split (fixed at the block's start, over its non-given positions), top k.
KLASS_C = [0.0, 0.95, 0.92, 0.5, 0.97, 0.1, 0.1, 0.1]
KLASS_KL = [0.0, 0.001, 0.02, 0.001, 0.5, 0.0, 0.0, 0.0]
KLASS = [
    pytest.param(
        StableConfidenceRule(steps=8),
        "cMMMMMMM",
        KLASS_C,
        {"kl": KLASS_KL, "step": 1},
        ".x......",
        id="klass: ready = c > .9 and kl < .01 -> column 1 (2: kl .02, 3: c .5, 4: kl .5)",
    ),
    pytest.param(
        StableConfidenceRule(steps=8),
        "MMMMMMMM",
        KLASS_C,
        {"kl": KLASS_KL, "step": 0},
        "....x...",
        id="klass: the block's first step is never ready -> split 8/8 = 1, top c (.97)",
    ),
    pytest.param(
        StableConfidenceRule(steps=8),
        "cMMMMMMM",
        [0.0, 0.5, 0.8, 0.3, 0.1, 0.1, 0.1, 0.1],
        {"kl": [0.0] * 8, "step": 1},
        "..x.....",
        id="klass: none with c > .9 -> split 8/8 = 1, top c",
    ),
    pytest.param(
        StableConfidenceRule(steps=8),
        "cMMMMMMM",
        [0.0, 0.9, 0.95, 0.3, 0.1, 0.1, 0.1, 0.1],
        {"kl": [0.0, 0.001, 0.01, 0.0, 0.0, 0.0, 0.0, 0.0], "step": 1},
        "..x.....",
        id="klass: c = .9 and kl = .01 are not ready (strict) -> split, top c",
    ),
    pytest.param(
        StableConfidenceRule(steps=8),
        "cMMMMMMM",
        [0.95] * 8,
        {"kl": [0.0] * 8, "step": 1},
        ".xxxxxxx",
        id="klass: all ready -> every mask",
    ),
    pytest.param(
        StableConfidenceRule(steps=4),
        "MMMMMMMM",
        [0.5, 0.9, 0.3, 0.9, 0.7, 0.1, 0.2, 0.4],
        {"kl": [0.0] * 8, "step": 0},
        ".x.x....",
        id="klass: first step, split 8/4 = 2 -> top 2 by c",
    ),
    pytest.param(
        StableConfidenceRule(steps=4),
        "ggccccMM",
        [0.99, 0.99, 0.0, 0.0, 0.0, 0.0, 0.7, 0.3],
        {"kl": [0.0] * 8, "step": 2},
        "......x.",
        id="klass: 6 non-given positions over 4 steps = [2,2,1,1] -> step 2 k=1 (not 8/4 = 2)",
    ),
    pytest.param(
        StableConfidenceRule(steps=8),
        "cMMMMMMM",
        [0.0, 0.5, 0.8, 0.8, 0.1, 0.1, 0.1, 0.1],
        {"kl": [0.0] * 8, "step": 1},
        "..x.....",
        id="klass: none ready, top c tied at .8 -> the lower column",
    ),
    pytest.param(
        StableConfidenceRule(steps=8),
        "gggggggg",
        [0.95] * 8,
        {"kl": [0.0] * 8, "step": 1},
        "........",
        id="klass: nothing masked -> nothing",
    ),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), KLASS)
def test_stable_confidence_rule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# WINO: the block's masks M with c > tau1, at most min(max(floor(0.7 |M|), 5), 20) of them (the most
# confident); argmax c where none clears tau1.
WIDE_IN = [
    pytest.param(
        WideInRule(tau1=0.7),
        "MMMMMMMM",
        [0.91, 0.99, 0.75, 0.8, 0.95, 0.72, 0.85, 0.9],
        {},
        "xx..x.xx",
        id="wino: all 8 > .7, cap min(max(floor(.7*8), 5), 20) = 5 -> top 5",
    ),
    pytest.param(
        WideInRule(tau1=0.7),
        "MMMMMMMM",
        [0.7, 0.71, 0.5, 0.3, 0.2, 0.1, 0.1, 0.1],
        {},
        ".x......",
        id="wino: c = .7 is not > tau1 (strict) -> .71 only",
    ),
    pytest.param(
        WideInRule(tau1=0.7),
        "MMMMMMMM",
        [0.5, 0.6, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1],
        {},
        ".x......",
        id="wino: none > .7 -> argmax c",
    ),
    pytest.param(
        WideInRule(tau1=0.7),
        "MMMMMMMM",
        [0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.1, 0.1],
        {},
        "xxxxx...",
        id="wino: 6 tied at .8 over the cap of 5 -> the lower columns",
    ),
    pytest.param(
        WideInRule(tau1=0.7),
        "gggggMMM",
        [0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.9, 0.75],
        {},
        ".....xxx",
        id="wino: 3 masks, cap floor(.7*3) = 2 raised to 5 -> all 3",
    ),
    pytest.param(
        WideInRule(tau1=0.7),
        "MMMMMMMM",
        [0.8, 0.9, 0.1, 0.75, 0.99, 0.99, 0.99, 0.99],
        {"layout": TWO},
        "xx.x....",
        id="wino: current block only (|M| = 4, cap 5) -> block 0's .8, .9, .75",
    ),
    pytest.param(WideInRule(tau1=0.7), "gggggggg", [0.9] * 8, {}, "........", id="wino: nothing masked"),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), WIDE_IN)
def test_wide_in_rule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# SDAR (``block_diffusion_generate``): k_t = the block length split evenly over steps (remainder
# first); dynamic: the masks with c > tau if at least k_t of them, else the top k_t; static: the top
# k_t; sequential: the k_t leftmost masks.
BLOCK_DIFFUSION = [
    pytest.param(
        BlockDiffusionSchedule(steps=4),
        "MMMMMMMM",
        [0.95, 0.5, 0.92, 0.3, 0.91, 0.1, 0.2, 0.4],
        {},
        "x.x.x...",
        id="sdar dynamic: 3 with c > .9 >= k_t = 8/4 = 2 -> all 3",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=4),
        "MMMMMMMM",
        [0.95, 0.5, 0.6, 0.3, 0.1, 0.1, 0.2, 0.4],
        {},
        "x.x.....",
        id="sdar dynamic: 1 with c > .9 < k_t = 2 -> top 2",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=4),
        "MMMMMMMM",
        [0.9, 0.95, 0.93, 0.91, 0.1, 0.1, 0.1, 0.1],
        {},
        ".xxx....",
        id="sdar dynamic: c = .9 is not > tau (strict) -> the 3 above",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=4, remasking="low_confidence_static"),
        "MMMMMMMM",
        [0.95, 0.5, 0.92, 0.3, 0.91, 0.1, 0.2, 0.4],
        {},
        "x.x.....",
        id="sdar static: the k_t = 2 most confident, whatever tau",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=3, remasking="low_confidence_static"),
        "MMMMMMMM",
        SPREAD,
        {},
        ".x.x..x.",
        id="sdar static: 8 over 3 steps = [3,3,2] -> step 0 k_t=3",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=3, remasking="low_confidence_static"),
        "gggMMMMM",
        [0.9, 0.9, 0.9, 0.5, 0.2, 0.7, 0.4, 0.8],
        {"step": 2},
        ".....x.x",
        id="sdar static: [3,3,2] step 2 -> k_t=2 (of the block length, not of the masks)",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=8, remasking="low_confidence_static"),
        "MMMMMMMM",
        [0.5, 0.9, 0.9, 0.3, 0.1, 0.1, 0.1, 0.1],
        {},
        ".x......",
        id="sdar static: k_t=1, top c tied at .9 -> the lower column",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=2, remasking="low_confidence_static"),
        "ggggggMM",
        LOW,
        {},
        "......xx",
        id="sdar static: k_t = 8/2 = 4 larger than the 2 masks -> both (masks only)",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=4, remasking="sequential"),
        "gMgMMMMM",
        [0.1, 0.1, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9],
        {},
        ".x.x....",
        id="sdar sequential: the k_t = 2 leftmost masks, whatever c",
    ),
    pytest.param(
        BlockDiffusionSchedule(steps=2),
        "ggggMMMM",
        [0.1, 0.1, 0.1, 0.1, 0.95, 0.92, 0.5, 0.3],
        {"layout": TWO, "block": 1},
        "....xx..",
        id="sdar dynamic block 1 of 4: k_t = 4/2 = 2, 2 with c > .9 -> those",
    ),
    pytest.param(BlockDiffusionSchedule(steps=4), "gggggggg", [0.95] * 8, {}, "........", id="sdar: nothing masked"),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), BLOCK_DIFFUSION)
def test_block_diffusion_schedule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected


# SDAR's entropy_bounded (``generate_sdar.py``): masks by entropy ascending, as many as have a running
# sum < gamma (``searchsorted``, right=False), at least one, at most the masks.
ENTROPY_BOUNDED = [
    pytest.param(
        EntropyBoundedRule(gamma=0.35),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": ENTROPY},
        ".x.x.xx.",
        id="sdar entropy_bounded: running .01,.03,.08,.28 < .35; .58 -> 4",
    ),
    pytest.param(
        EntropyBoundedRule(gamma=0.1),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": ENTROPY},
        ".x.x.x..",
        id="sdar entropy_bounded gamma=.1: .01,.03,.08 < .1; .28 -> 3 (EB-Sampler's sum-max takes 4)",
    ),
    pytest.param(
        EntropyBoundedRule(gamma=0.375),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.25, 0.125, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]},
        ".x......",
        id="sdar entropy_bounded: running .125 < .375, .375 = gamma stops (strict <) -> 1",
    ),
    pytest.param(
        EntropyBoundedRule(gamma=0.35),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.5, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0]},
        ".x......",
        id="sdar entropy_bounded: the lowest H .4 >= .35 -> at least one, the lowest",
    ),
    pytest.param(
        EntropyBoundedRule(gamma=0.35),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.5, 0.4, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0]},
        ".x......",
        id="sdar entropy_bounded: at least one, lowest H tied at .4 -> the lower column",
    ),
    pytest.param(
        EntropyBoundedRule(gamma=0.35),
        "MMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.01] * 8},
        "xxxxxxxx",
        id="sdar entropy_bounded: all 8 sum to .08 < .35 -> every mask",
    ),
    pytest.param(
        EntropyBoundedRule(gamma=0.35),
        "gMMMMMMM",
        [0.5] * 8,
        {"entropy": [0.0, 0.2, 0.1, 0.5, 0.6, 0.7, 0.8, 0.9]},
        ".xx.....",
        id="sdar entropy_bounded: the given column's H=0 is not summed -> .1, .3 < .35",
    ),
    pytest.param(
        EntropyBoundedRule(gamma=0.35),
        "gggggggg",
        [0.5] * 8,
        {"entropy": ENTROPY},
        "........",
        id="sdar entropy_bounded: nothing masked -> nothing (at most the masks)",
    ),
]


@pytest.mark.parametrize(("rule", "row", "confidence", "inputs", "expected"), ENTROPY_BOUNDED)
def test_entropy_bounded_rule(rule, row: str, confidence: list[float], inputs: dict, expected: str) -> None:
    assert decide(rule, row, confidence, **inputs) == expected
