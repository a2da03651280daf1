"""The lookahead's phases: open a branch per candidate on copies of the exploring roots, roll all
branches of all slots through the engine level by level, prune (expansion policy, the selector's
re-evaluation), deepen with the base rule, and hand back the selected branches with their evaluations."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from dlmsearch.search.components.commit import StepAt, per_row
from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.search.decode.calls import evaluate
from dlmsearch.search.decode.state import DecodeState
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.state import Canvas, Evaluation
from dlmsearch.search.records.usage import Usage


def lookahead(
    engine: RolloutEngine,
    state: DecodeState,
    root: Canvas,
    evaluation: Evaluation,
    exploring: torch.Tensor,
    on_lookahead: Callable[[Lookahead], None] | None,
) -> tuple[Canvas, Evaluation, torch.Tensor, Usage, torch.Tensor]:
    """Roll hypotheses of all exploring slots level by level; the adopted branches, their
    evaluations, ``[S]`` restart flags (the selector wants a fresh lookahead from the
    adopted state instead of exploiting it), the usage after it, and ``[S]`` the adopted branches' indices.

    Args:
        engine: the model's only caller.
        state: the decode (its usage so far is charged).
        root: ``[S]`` the exploring slots' canvases.
        evaluation: ``[S]`` their evaluations.
        exploring: ``[S]`` the exploring slots.
        on_lookahead: sees every level.
    """
    usage = state.usage
    look = _open(state, usage, root, evaluation, exploring)
    while not look.done:
        look, usage = _roll(engine, state, usage, look)
        if on_lookahead is not None:
            on_lookahead(look)
    selector = state.plan.selector
    assert selector is not None
    best = selector.best(look.scores.view(len(exploring), look.width), look.live)
    adopted, adopted_eval = look.adopted(best)
    return adopted, adopted_eval, look.restarted, usage, best


def _open(state: DecodeState, usage: Usage, root: Canvas, evaluation: Evaluation, exploring: torch.Tensor) -> Lookahead:
    """Depth 1: each candidate position committed on a copy of its slot's root (not yet evaluated);
    ``exploring`` ``[S]``: the roots' slots."""
    plan, layout = state.plan, state.layout
    assert plan.candidates and plan.expansion
    calls = usage.steps[state.slots.owner[exploring]]
    positions, live = plan.candidates.propose(root, evaluation, layout)
    roots, width = positions.shape
    rows = roots * width
    first = torch.zeros(rows, root.tokens.shape[1], dtype=torch.bool)
    first[torch.arange(rows), positions.flatten()] = True
    first &= live.flatten()[:, None]
    branch_id = torch.arange(width).repeat(roots)
    repeated = evaluation.take(torch.arange(roots).repeat_interleave(width))
    at = StepAt(layout, calls.repeat_interleave(width), plan.mask_id, depth=1, branch=branch_id)
    branches = plan.commit.open_branch(root.repeat(width), repeated, at, first)
    return Lookahead(
        slots=exploring,
        width=width,
        branches=branches,
        evaluation=Evaluation.empty(rows, root.tokens.shape[1], plan.statistics),
        scores=torch.zeros(rows),
        step_log_conf=torch.log(evaluation.confidence.gather(1, positions).clamp(min=1e-30)).flatten(),
        live=live,
        rolling=torch.ones(roots, dtype=torch.bool),
        restarted=torch.zeros(roots, dtype=torch.bool),
        depth=1,
        expansion=plan.expansion.for_roots(root, evaluation, layout),
        calls=calls,
    )


def _roll(engine: RolloutEngine, state: DecodeState, usage: Usage, look: Lookahead) -> tuple[Lookahead, Usage]:
    """One level: evaluate and score the rolling branches; then either finish, or let the
    expansion policy and the selector's re-evaluation decide who rolls on and commit the
    base rule once more on those branches."""
    scorer = state.plan.scorer
    assert scorer is not None
    rows = look.rows()
    sub = look.branches.take(rows)
    sub_eval, usage = evaluate(engine, state, usage, sub, look.slot_row[rows], 1 + look.branch_id[rows])
    evaluation = look.evaluation.put(rows, sub_eval)
    gained = scorer.score(sub, sub_eval, state.layout, look.step_log_conf[rows])
    scores = look.scores.clone()
    scores[rows] = scores[rows] + gained if look.expansion.accumulate else gained
    calls = usage.steps[state.slots.owner[look.slots]]
    look = attrs.evolve(look, evaluation=evaluation, scores=scores, calls=calls)
    if look.depth >= look.expansion.max_depth:
        return attrs.evolve(look, done=True), usage
    look = _prune(state, look, rows, sub, sub_eval)
    if not bool(look.rolling.any()):
        return attrs.evolve(look, done=True), usage
    return _deepen(state, usage, look), usage


def _prune(state: DecodeState, look: Lookahead, rows: torch.Tensor, sub: Canvas, sub_eval: Evaluation) -> Lookahead:
    """Who rolls on: the expansion policy's verdict per slot (none once a live branch has
    finished), then the selector's branch re-evaluation (prune, or restart from the best)."""
    plan = state.plan
    samples, width = look.live.shape
    grid = look.scores.view(samples, width)
    finished = plan.commit.settled(look.branches, state.layout).view(samples, width)
    go = look.rolling & look.expansion.should_continue(grid, look.live, look.depth) & ~(look.live & finished).any(1)
    live, restarted = look.live, look.restarted
    assert plan.selector is not None
    if plan.selector.reevaluates and bool(go.any()):
        fires = torch.zeros(samples * width, dtype=torch.bool)
        fires[rows] = plan.trigger.fires(sub, sub_eval, state.layout)
        pruned, restart = plan.selector.prune(live, fires.view(samples, width), grid)
        live = torch.where(go[:, None], pruned, live)
        restarted = restarted | (go & restart)
        go = go & ~restart
    return attrs.evolve(look, live=live, rolling=go, restarted=restarted)


def _deepen(state: DecodeState, usage: Usage, look: Lookahead) -> Lookahead:
    """The base rule once more on every rolling branch: one level deeper."""
    layout, commit = state.layout, state.plan.commit
    rows = look.rows()
    sub, sub_eval = look.branches.take(rows), look.evaluation.take(rows)
    slot = look.slot_row[rows]
    rule = per_row(commit, state.slots.options_at(slot), sub_eval.confidence.dtype)
    depth = look.depth + 1
    calls = usage.steps[state.slots.owner[slot]]
    rolled, chosen = rule.step(sub, sub_eval, StepAt(layout, calls, state.plan.mask_id, depth, look.branch_id[rows]))
    logs = torch.where(chosen, torch.log(sub_eval.confidence.clamp(min=1e-30)), 0.0).sum(dim=1)
    step_log_conf = look.step_log_conf.clone()
    step_log_conf[rows] = logs / chosen.sum(dim=1).clamp(min=1)
    return attrs.evolve(look, branches=look.branches.put(rows, rolled), step_log_conf=step_log_conf, depth=depth)
