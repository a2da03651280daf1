"""The search driver: the one decode loop that every decoder runs.

Each round, for every unfinished sample of the batch at once: evaluate the root state (unless
the previous round left it evaluated), ask the trigger, and run a lookahead for the
exploring samples: candidates become hypotheses, all live hypotheses of all samples go through
the engine together level by level, the scorer rates them, the expansion policy decides whether
to roll deeper (with the selector's branch re-evaluation in between), and the selected branch
is adopted together with the evaluation it already has. Then every sample applies the base
commit rule to its state (explore, then exploit: an adopted branch's evaluation is used, never
recomputed), except where the selector asked for a fresh lookahead from the adopted state.
Baselines are this same loop with the trigger set to never.

The loop never asks which kind of model or rule it runs: the commit rule takes the whole step
(:class:`~dlmsearch.search.components.commit.CommitRule`: a root's, a lookahead branch's), so a
paradigm is a rule, not a branch here.

The loop is a step function over a frozen :class:`DecodeState`: ``decode`` is ``start``, then
``state = step(state)`` until ``state.finished``, then ``finish``; a lookahead is a frozen
:class:`~dlmsearch.search.components.lookahead.Lookahead` advanced one level per call. The
state carries everything per sample (the canvases, the counters, the slots' key/value and
KLASS stores, the validated :class:`~dlmsearch.search.plan.DecodePlan`); the engine carries
only the model, so :class:`~dlmsearch.search.session.DecodeSession` can admit and evict
samples between steps. Beside the loop (``dlmsearch.search.decode``): the state (``state``), the one
engine call for rows of slots (``calls``), request intake (``intake``), results (``results``) and the
lookahead's phases (``lookahead_phases``).

Width search is the same loop over more rows: with a population of P, each sample holds P
slots (particles), every step above runs for all slots of all samples at once, and after each
round the population may end, stop or resample particles (``dlmsearch.search.width.population``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import torch

from dlmsearch.core.sampling import Sampling
from dlmsearch.search.components.candidates import CandidateGenerator
from dlmsearch.search.components.commit import CommitRule, StepAt, per_row
from dlmsearch.search.components.expansion import ExpansionPolicy
from dlmsearch.search.components.length import FixedLength, LengthAt, LengthPolicy
from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.search.components.revision import NoRevision, Revision
from dlmsearch.search.components.scorers import Scorer
from dlmsearch.search.components.selectors import Selector
from dlmsearch.search.components.stopping import AnswerEnd
from dlmsearch.search.components.tree_settings import TreeSettings
from dlmsearch.search.components.triggers import NeverTrigger, Trigger
from dlmsearch.search.decode import intake, results
from dlmsearch.search.decode.calls import evaluate
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.lookahead_phases import lookahead
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.decode.state import DecodeState, check_current
from dlmsearch.search.decode.tree_phases import completion_blocks, kept_trees, stale_trees, tree_search
from dlmsearch.search.engine.guidance import Guidance
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.plan import DecodePlan, make_plan
from dlmsearch.search.records.randomness import BRANCH_KEYS
from dlmsearch.search.records.resize import ABSENT_COLUMNS, LENGTH_SIZING, resized
from dlmsearch.search.records.rows import pad_columns
from dlmsearch.search.records.slots import SlotRows
from dlmsearch.search.records.state import Canvas, Evaluation
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.search.width.population_hook import PopulationHook, SinglePath, SlotCanvases


@attrs.define
class SearchDecoder:
    """Trigger, candidates, scorer, expansion and selector around a base commit rule."""

    commit: CommitRule
    trigger: Trigger = attrs.field(factory=NeverTrigger)
    candidates: CandidateGenerator | None = None
    scorer: Scorer | None = None
    expansion: ExpansionPolicy | None = None
    selector: Selector | None = None
    population: PopulationHook = attrs.field(factory=SinglePath)
    tree: TreeSettings | None = None  # a Monte-Carlo tree search's simulations and budget (None: a lookahead explores)
    revision: Revision = attrs.field(factory=NoRevision)  # after the base rule's commits: which go back to the mask
    length: LengthPolicy = attrs.field(factory=FixedLength)  # after the round's commits: the canvas's length
    name: str = "custom"
    block_length: int | None = None  # a decoder with its own block structure (Dream: one block); None: the task's
    # the reference loop's defaults (engine.* and the checkpoint's win)
    sampling: Sampling = attrs.field(factory=Sampling)
    guidance: Guidance = attrs.field(factory=Guidance)  # classifier-free guidance (LLaDA's cfg_scale)
    # finish once the answer has ended
    stop_at_eos: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    @property
    def statistics(self) -> frozenset[str]:
        """What the engine computes per position beyond token and confidence: only what the
        commit rule and the candidates read (no draws or summaries nobody uses)."""
        searched = self.candidates.statistics if self.candidates is not None else frozenset()
        return self.commit.statistics | searched | self.length.statistics

    def plan(
        self, engine: RolloutEngine, gen_length: int, block_length: int, verifier: Verifier | None = None
    ) -> DecodePlan:
        """Every compatibility check, once, before any forward; the frozen plan batches decode from (:mod:`~dlmsearch.search.plan`)."""
        return make_plan(self, engine, gen_length, block_length, verifier)

    def decode(
        self,
        engine: RolloutEngine,
        requests: list[DecodeRequest],
        block_length: int,
        on_round: Callable[[Canvas, torch.Tensor | None], None] | None = None,
        deadline_s: float | None = None,
        verifier: Verifier | None = None,
        on_lookahead: Callable[[Lookahead], None] | None = None,
        plan: DecodePlan | None = None,
    ) -> list[DecodeResult]:
        """Decode a batch; each sample's result is independent of the others in the batch.

        Args:
            engine: the model's only caller.
            requests: the batch, one request per sample (all with the same generation length).
            block_length: the columns committed block by block (the semi-autoregressive block).
            on_round: sees the canvases of all slots (``[slots, T]``) after every round, and
                ``[slots]`` the slot of the previous round's canvases each continues from (None:
                its own), for traces and tests.
            deadline_s: past it (seconds), samples still decoding stop exploring and finish with
                the base commit rule alone (their results say so).
            verifier: the task's check of the batch's outputs, for populations that use one.
            on_lookahead: sees every level of every lookahead
                (:class:`~dlmsearch.search.components.lookahead.Lookahead`: depth, live branches, scores).
            plan: the checked plan (from :meth:`plan`), which saves checking again per batch.
        """
        if not requests:
            return []
        state = self.start(engine, requests, block_length, verifier, plan)
        while not state.finished:  # bounded: a sample past its rounds fails the step (DecodeState.check_rounds)
            state = step(engine, state, verifier, deadline_s, on_round, on_lookahead)
        return self.finish(engine, state, verifier)

    def start(
        self,
        engine: RolloutEngine,
        requests: list[DecodeRequest],
        block_length: int,
        verifier: Verifier | None = None,
        plan: DecodePlan | None = None,
    ) -> DecodeState:
        """The state before the first round (:func:`~dlmsearch.search.decode.intake.start`), from the
        plan given or one made here."""
        plan = plan or self.plan(engine, len(requests[0].generation), block_length, verifier)
        return intake.start(engine, plan, requests)

    def finish(self, engine: RolloutEngine, state: DecodeState, verifier: Verifier | None = None) -> list[DecodeResult]:
        """Each sample's output (:func:`~dlmsearch.search.decode.results.finish`)."""
        return results.finish(engine, state, verifier)


@attrs.frozen
class Round:
    """What one round's phases hand on: the slots decoding, their roots and those roots'
    evaluations, and which of them the base rule commits on this round."""

    rows: torch.Tensor  # [n] the slots decoding this round
    root: Canvas  # [n] their canvases (an exploring slot's: the branch it adopted)
    evaluation: Evaluation  # [n] the evaluations of ``root``
    exploit: torch.Tensor  # [n] the base rule commits on these (not: a fresh lookahead from the adopted branch)
    prior: Evaluation  # [slots] the previous round's evaluations (Saber compares confidences across steps)


def step(
    engine: RolloutEngine,
    state: DecodeState,
    verifier: Verifier | None = None,
    deadline_s: float | None = None,
    on_round: Callable[[Canvas, torch.Tensor | None], None] | None = None,
    on_lookahead: Callable[[Lookahead], None] | None = None,
) -> DecodeState:
    """One round for every slot still decoding: state in, state out, one call per phase (mctx's
    ``search`` body). Every component comes from ``state.plan``.

    Args:
        engine: the model's only caller.
        state: the latest state (an older one is refused: its slots' stores have moved on).
        verifier: the task's check of the batch's outputs, for populations that use one.
        deadline_s: past it, a sample stops exploring and finishes with the base rule.
        on_round: sees ``[slots]`` canvases after the round, and the slot each continues from.
        on_lookahead: sees every level of every lookahead.
    """
    check_current(state)
    # The stores move on as the step starts: the state handed in is stale from here on, also when this step fails midway
    state = attrs.evolve(state, memory_version=state.memory.advance())
    state, round_ = _evaluate_roots(engine, state)
    if round_ is None:
        return attrs.evolve(state, finished=True)
    state, round_ = _explore(engine, state, round_, deadline_s, on_lookahead, verifier)
    state, committed = _select_and_commit(state, round_)
    state = _revise(state, round_, committed)
    state = _resize(state, round_)
    return _advance(state, verifier, on_round)


def _evaluate_roots(engine: RolloutEngine, state: DecodeState) -> tuple[DecodeState, Round | None]:
    """The slots decoding this round, each root evaluated unless the last round left it evaluated."""
    canvas, latest = state.canvas, state.evaluation
    active = state.decoding
    if not bool(active.any()):
        return state, None
    state.check_rounds(active)  # before any forward: a sample past the bound gets no more rounds
    need = (active & ~state.evaluated).nonzero().squeeze(1)
    evaluated, usage = state.evaluated.clone(), state.usage
    if need.numel():
        evaluation, usage = evaluate(engine, state, usage, canvas.take(need), need, torch.zeros_like(need))
        latest = latest.put(need, evaluation)
        evaluated[need] = True
    rows = active.nonzero().squeeze(1)
    exploit = canvas.length_phase[rows] != LENGTH_SIZING  # a canvas still being sized is only probed
    round_ = Round(rows, canvas.take(rows), latest.take(rows), exploit, prior=state.evaluation)
    return attrs.evolve(state, evaluation=latest, evaluated=evaluated, usage=usage), round_


def _explore(
    engine: RolloutEngine,
    state: DecodeState,
    round_: Round,
    deadline_s: float | None,
    on_lookahead: Callable[[Lookahead], None] | None,
    verifier: Verifier | None = None,
) -> tuple[DecodeState, Round]:
    """Where the trigger fires (and the deadline has not passed, and a tree search's budget is
    not spent): look ahead (or search the tree) and adopt the selected branch with the evaluation
    it already has; exploit it at once unless the selector asked for a fresh lookahead from it
    (a tree search's move is the round's step).

    Args:
        engine: the model's only caller.
        state: the decode.
        round_: the round's slots, roots and their evaluations.
        deadline_s: past it, a sample stops exploring.
        on_lookahead: sees every lookahead level, or every finished tree search.
        verifier: the task's check, for a tree's leaf values that read it.
    """
    rows, late = round_.rows, state.late
    if deadline_s is not None:
        over = time.monotonic() - state.started[state.slots.owner] > deadline_s
        over = engine.decisions.any(over)  # a tensor-parallel group goes late as one: each rank reads its own clock
        late = late | (over & _scattered(rows, len(late)))
    fires = state.plan.trigger.fires(round_.root, round_.evaluation, state.layout)
    tree = state.plan.tree
    if tree is not None:
        spent = state.usage.row_forwards[state.slots.owner[rows]]
        blocks = completion_blocks(round_.root, round_.evaluation, state.layout, state.plan.mask_id)
        fires = (fires | tree.every_step(spent, blocks)) & tree.searches(spent, blocks)
    explore = fires & ~late[rows] & round_.exploit
    explore = explore & ~state.plan.commit.forced(round_.root, round_.evaluation, state.layout)
    state = attrs.evolve(state, late=late)
    explored = rows[explore]
    if not explored.numel():
        return (state if tree is None else attrs.evolve(state, tree=stale_trees(state.tree, rows))), round_
    root, root_evaluation = round_.root.take(explore), round_.evaluation.take(explore)
    if tree is None:
        adopted, adopted_eval, restart, usage, best = lookahead(
            engine, state, root, root_evaluation, explored, on_lookahead
        )
    else:
        adopted, adopted_eval, restart, usage, best, kept = tree_search(
            engine, state, root, root_evaluation, explored, blocks[explore], on_lookahead, verifier
        )
        state = attrs.evolve(state, tree=kept_trees(state.tree, explored, kept, len(state.evaluated)))
    # the adopted branch's own memory in the slot stores (e.g. a self-conditioning input) becomes its slot's
    state.memory.adopt(explored, state.slots.particle[explored] * BRANCH_KEYS + 1 + best)
    adopted, ended = state.plan.commit.move_on(adopted, state.layout)
    if tree is not None and engine.cache.stores:
        # a move that finished a block: the root evaluates the next one, after the cache's write of the finished one
        ended = ended | (adopted.block != root.block)
    at = explore.nonzero().squeeze(1)  # positions of the exploring slots within ``rows``
    exploit = round_.exploit.clone()
    exploit[at] = ~restart & ~ended
    evaluated = state.evaluated.clone()
    evaluated[explored[ended]] = False  # its root evaluates the next block (after encoding the finished one)
    round_ = attrs.evolve(
        round_,
        root=round_.root.put(at, adopted),
        evaluation=round_.evaluation.put(at, adopted_eval),
        exploit=exploit,
    )
    canvas, evaluation = state.canvas.put(explored, adopted), state.evaluation.put(explored, adopted_eval)
    # a kept tree is rooted at its slot's canvas: stale where the base rule commits or the root moves on
    trees = state.tree if tree is None else stale_trees(state.tree, torch.cat([rows[exploit], explored[ended]]))
    return attrs.evolve(
        state, canvas=canvas, evaluation=evaluation, usage=usage, evaluated=evaluated, tree=trees
    ), round_


def _scattered(rows: torch.Tensor, size: int) -> torch.Tensor:
    """``[size]`` True at ``rows``."""
    flags = torch.zeros(size, dtype=torch.bool)
    flags[rows] = True
    return flags


def _select_and_commit(state: DecodeState, round_: Round) -> tuple[DecodeState, Canvas | None]:
    """The base rule on every exploiting slot: the population may perturb what it reads, the rule
    selects, the selected positions are committed (blocks advance here unless a revision acts first)."""
    plan, slots = state.plan, state.slots
    base = round_.rows[round_.exploit]
    if not base.numel():
        return state, None
    sub, sub_eval = round_.root.take(round_.exploit), round_.evaluation.take(round_.exploit)
    call = state.usage.steps[slots.owner[base]]
    at = SlotRows(sub, base, slots, call, state.layout)
    proposals, population = plan.population.perturb(sub_eval, at, state.population)
    rule = per_row(plan.commit, slots.options_at(base), proposals.confidence.dtype)
    step_at = StepAt(state.layout, call, plan.mask_id, advance=not plan.revision.revises)
    committed, _ = rule.step(sub, proposals, step_at)
    return attrs.evolve(state, population=population), committed


def _revise(state: DecodeState, round_: Round, committed: Canvas | None) -> DecodeState:
    """A revision returns some of the round's commits to the mask (or rewrites them) in the
    round's block; then the blocks advance. The committed canvases go in; their evaluations are stale."""
    if committed is None:
        return state
    plan, layout = state.plan, state.layout
    base = round_.rows[round_.exploit]
    if plan.revision.revises:
        sub, sub_eval = round_.root.take(round_.exploit), round_.evaluation.take(round_.exploit)
        remask = plan.revision.revise(sub, committed, layout, sub_eval, round_.prior.take(base))
        if remask is not None:
            committed = committed.remask(remask, mask_id=plan.mask_id)
        if plan.revision.rewrites:
            call = state.usage.steps[state.slots.owner[base]]
            committed = plan.revision.rewrite(sub, committed, layout, sub_eval, call)
        committed = committed.advance_blocks(layout, plan.commit)
    evaluated = state.evaluated.clone()
    evaluated[base] = False
    return attrs.evolve(state, canvas=state.canvas.put(base, committed), evaluated=evaluated)


def _resize(state: DecodeState, round_: Round) -> DecodeState:
    """The length policy after the round's commits: rows that grow, shrink or take an insertion are
    remapped (:func:`~dlmsearch.search.records.resize.resized`), the canvas and its layout widened by
    whole blocks where a row outgrows them, and the changed rows evaluated again."""
    length = state.plan.length
    if not length.changes:
        return state
    rows, layout = round_.rows, state.layout
    at = LengthAt(
        round_.root, state.canvas.take(rows), round_.evaluation, layout, state.usage.steps[state.slots.owner[rows]]
    )
    resize, changed = length.resize(at)
    blocks = -(-int(resize.length.max()) // layout.block_length)  # a round has a row (else no round)
    widened = attrs.evolve(layout, gen_length=max(layout.gen_length, blocks * layout.block_length))
    extra = widened.gen_length - layout.gen_length
    canvas = pad_columns(state.canvas, extra, ABSENT_COLUMNS | {"tokens": length.eos_id}, right=True)
    evaluation = pad_columns(state.evaluation, extra, {"token": state.plan.mask_id}, right=True)
    remapped = resized(at.after, resize, widened, state.plan.mask_id, length.eos_id)
    evaluated = state.evaluated.clone()
    evaluated[rows[changed]] = False
    # a kept search tree follows the widening; a row whose columns moved starts a new one
    trees = None if state.tree is None else state.tree.widened(0, state.plan.mask_id, extra)
    return attrs.evolve(
        state,
        layout=widened,
        canvas=canvas.put(rows, remapped),
        evaluation=evaluation,
        evaluated=evaluated,
        tree=stale_trees(trees, rows[changed]),
    )


def _advance(
    state: DecodeState, verifier: Verifier | None, on_round: Callable[[Canvas, torch.Tensor | None], None] | None
) -> DecodeState:
    """End the round: fill after an answer's end, let the population end, stop or resample
    particles (slots take over others' stores), count the round."""
    plan, layout, slots = state.plan, state.layout, state.slots
    canvas, evaluation, evaluated, late = state.canvas, state.evaluation, state.evaluated, state.late
    if plan.stop_ids:
        end = AnswerEnd(
            torch.tensor(plan.stop_ids),
            slots.region[:, 0],
            plan.answer_ends_with_block,
            plan.commit.decides_whole_block,
        )
        canvas = end.fill(canvas, layout)
    at = SlotCanvases(canvas, slots, layout, verifier)
    population, source = plan.population.after_round(at, state.population, state.rounds)
    if source is not None:
        canvas, evaluation, evaluated, late = (
            canvas.take(source),
            evaluation.take(source),
            evaluated[source],
            late[source],
        )
        state.memory.reorder(source)
        state = attrs.evolve(state, tree=None if state.tree is None else state.tree.take(source))
    if on_round is not None:
        on_round(canvas, source)
    return attrs.evolve(
        state,
        canvas=canvas,
        evaluation=evaluation,
        evaluated=evaluated,
        late=late,
        population=population,
        rounds=state.rounds + 1,
        round_index=state.round_index + 1,
        memory_version=state.memory.version,  # advanced as the step started, and by a reorder here
    )
