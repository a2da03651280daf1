"""ReMDM's near-ties: confidences are ranked on a 2^-20 grid and exact ties go to the earlier
position, so a choice between scores closer than the grid is the rule's, not the last bit's."""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.search.components.commit import REMDM_SCORE_BITS, ReMDMSchedule, on_grid, top_k_mask
from dlmsearch.search.components.revision import LoopRemask
from dlmsearch.search.records.state import BlockMoves, Evaluation, Layout, initial_canvas

MASK, LAYOUT = 9, Layout(gen_start=2, gen_length=8, block_length=8)
GRID = 2.0**-REMDM_SCORE_BITS  # the grid's step on [0.5, 1)
ULP = 2.0**-24  # float32's step on [0.5, 1)
ON_GRID = 0.75  # a grid point: itself and scores within half a step of it round to it
BELOW = {torch.float32: ULP, torch.float64: 1e-9}  # less than the grid: one float32 ulp, or the 1e-9 of float64


def fresh():
    return initial_canvas([torch.tensor([1, 2])], [torch.full((8,), MASK)], LAYOUT, MASK, 0)


def remasked(confidence: torch.Tensor) -> list[int]:
    """The generated positions LoopRemask (k = 1) re-masks at the block's first loop step, every
    position committed with ``confidence``."""
    revision = LoopRemask(k=1).bind(LAYOUT, 16)  # 8 plain steps and 8 loop steps; the loop starts at step 7
    scores = torch.cat([torch.zeros(2, dtype=confidence.dtype), confidence])[None]
    canvas = fresh()
    after = canvas.commit(
        canvas.masked,
        torch.ones_like(canvas.tokens),
        scores,
        torch.tensor([7]),
        0,
        0,
        LAYOUT,
        BlockMoves(block_budget=16, holds_block=True),
        advance=False,
    )
    after = attrs.evolve(after, block_round=torch.tensor([7]))
    evaluation = Evaluation.empty(1, LAYOUT.width, frozenset())
    positions = revision.revise(after, after, LAYOUT, evaluation, evaluation)
    assert positions is not None
    return (positions[0, 2:].nonzero().flatten()).tolist()


def committed(confidence: torch.Tensor) -> list[int]:
    """The generated positions ReMDMSchedule commits at a block's first (plain) step: one of eight."""
    rule = ReMDMSchedule(steps=8, k=1).bind(LAYOUT)
    scores = torch.cat([torch.zeros(2, dtype=confidence.dtype), confidence])[None]
    evaluation = Evaluation(token=torch.ones(1, LAYOUT.width, dtype=torch.long), confidence=scores)
    return (rule.select(fresh(), evaluation, LAYOUT)[0, 2:].nonzero().flatten()).tolist()


def scores(dtype: torch.dtype, first: float, second: float, at: tuple[int, int], fill: float) -> torch.Tensor:
    out = torch.full((8,), fill, dtype=dtype)
    out[at[0]], out[at[1]] = first, second
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loop_remask_near_tie_goes_to_the_earlier_position(dtype: torch.dtype) -> None:
    """The two lowest commits at positions 2 and 5, position 5 lower by less than the grid: the
    earlier one is re-masked (the raw floats would take position 5)."""
    near = scores(dtype, ON_GRID, ON_GRID - BELOW[dtype], (2, 5), 0.99)
    assert near[5] < near[2] and remasked(near) == [2]
    assert top_k_mask(-near[None], torch.ones(1, 8, dtype=torch.bool), torch.tensor([1]))[
        0
    ].nonzero().flatten().tolist() == [5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loop_remask_clear_gap_takes_the_lowest(dtype: torch.dtype) -> None:
    assert remasked(scores(dtype, ON_GRID, ON_GRID - 4 * GRID, (2, 5), 0.99)) == [5]
    assert remasked(scores(dtype, 0.9999, 0.9998, (2, 5), 0.99999)) == [5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_schedule_near_tie_goes_to_the_earlier_position(dtype: torch.dtype) -> None:
    """The two most confident masks at positions 3 and 6, position 6 higher by less than the grid:
    the earlier one is committed (the raw floats would take position 6)."""
    near = scores(dtype, ON_GRID, ON_GRID + BELOW[dtype], (3, 6), 0.5)
    assert near[6] > near[3] and committed(near) == [3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_schedule_clear_gap_takes_the_highest(dtype: torch.dtype) -> None:
    assert committed(scores(dtype, ON_GRID, ON_GRID + 4 * GRID, (3, 6), 0.5)) == [6]
    assert committed(scores(dtype, 0.9998, 0.9999, (3, 6), 0.5)) == [6]


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.integers(2**19 + 1, 2**20 - 1), min_size=8, max_size=8),
    noise=st.lists(st.integers(-7, 7), min_size=8, max_size=8),
)
def test_noise_below_the_grid_changes_no_choice(steps: list[int], noise: list[int]) -> None:
    """Grid points in [0.5, 1) (ties among them included), each moved by up to 7 float32 ulps
    (less than half the grid's 16): the same grid values, the same re-mask and the same commit."""
    clean = torch.tensor(steps, dtype=torch.float64) * GRID
    noisy = (clean + torch.tensor(noise, dtype=torch.float64) * ULP).float()
    clean = clean.float()
    assert torch.equal(on_grid(noisy), clean) and torch.equal(on_grid(clean), clean)
    assert remasked(noisy) == remasked(clean)
    assert committed(noisy) == committed(clean)


finite = st.floats(min_value=-(2.0**100), max_value=2.0**100, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(x=finite, y=finite)
def test_the_grid_never_reverses_an_order_and_keeps_clear_gaps(x: float, y: float) -> None:
    """``x <= y`` gives ``on_grid(x) <= on_grid(y)``; scores further apart than the larger one's
    grid step keep their strict order (the authors' ranking)."""
    lo, hi = sorted((x, y))
    a, b = on_grid(torch.tensor([lo, hi])).tolist()
    assert a <= b
    step = max(math.ldexp(1.0, math.frexp(v)[1] - REMDM_SCORE_BITS) for v in (lo, hi))
    if hi - lo > step:
        assert a < b


def test_the_grid_keeps_zero_and_the_infinities() -> None:
    special = torch.tensor([0.0, math.inf, -math.inf, 1.0, -0.75])
    assert torch.equal(on_grid(special), special)
