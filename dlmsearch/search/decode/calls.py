"""The loop's one way to call the model: an engine call for rows of some slots, at the plan's
temperature owner's temperature, charged to the slots' samples."""

from __future__ import annotations

import torch

from dlmsearch.core.temperature import COMMIT_RULE, DIVERSITY
from dlmsearch.search.decode.state import DecodeState
from dlmsearch.search.engine.call_records import CallRows, CallSettings
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.randomness import BRANCH_KEYS
from dlmsearch.search.records.state import Canvas, Evaluation
from dlmsearch.search.records.usage import Usage


def evaluate(
    engine: RolloutEngine,
    state: DecodeState,
    usage: Usage,
    canvas: Canvas,
    slot: torch.Tensor,
    branch_key: torch.Tensor,
) -> tuple[Evaluation, Usage]:
    """One engine call for rows of these slots (``branch_key``: 0 for roots, 1 + branch), and the usage after it.

    Args:
        engine: the model's only caller.
        state: the decode (plan, slots, stores, layout).
        usage: the counters so far; the call is charged to them.
        canvas: ``[rows]`` the canvases to evaluate.
        slot: ``[rows]`` each row's slot.
        branch_key: ``[rows]`` 0 for a slot's root, 1 + branch for a lookahead branch.
    """
    slots, plan = state.slots, state.plan
    row_key = slots.particle[slot] * BRANCH_KEYS + branch_key
    owner = slots.owner[slot]
    sampling = slots.sampling.take(slot)
    # The plan's one owner of the temperature (the rows' own settings where it takes them)
    decides = plan.temperature.kind
    temperature = (
        plan.commit.temperature(canvas)
        if decides == COMMIT_RULE
        else plan.population.token_temperature(state.population, slots, slot)
        if decides == DIVERSITY
        else None
    )
    rows = CallRows(
        canvas.tokens,
        canvas.attention,
        slot,
        slots.key[slot],
        row_key,
        usage.steps[owner],
        canvas.window(state.layout),
        temperature=sampling.temperature if temperature is None else temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=slots.seed[slot],
        group=None if slots.size == 1 else slots.owner[slot] * BRANCH_KEYS + branch_key,
        uid=slots.uid[slot],
        open=canvas.masked,
    )
    settings = CallSettings(state.memory, plan.sampling, plan.statistics, state.layout.gen_start, plan.guidance)
    evaluation, cost = engine.evaluate(rows, settings)
    return evaluation, usage.charge(owner, cost)
