"""The search driver: the one decode loop that every decoder runs.

Each round, for every unfinished sample of the batch at once: evaluate the root state (unless
the previous round left a fresh evaluation), ask the trigger, and run a lookahead for the
exploring samples: candidates become hypotheses, all live hypotheses of all samples go through
the engine together level by level, the scorer rates them, the expansion policy decides whether
to roll deeper (with the selector's branch re-evaluation in between), and the selected branch
is adopted together with the evaluation it already has. Then every sample applies the base
commit rule to its state (explore, then exploit: an adopted branch's evaluation is used, never
recomputed), except where the selector asked for a fresh lookahead from the adopted state.
Baselines are this same loop with the trigger set to never.

The loop is a step function over a frozen :class:`DecodeState`: ``decode`` is ``start``, then
``state = step(state)`` until ``state.finished``, then ``finish``; a lookahead is a frozen
:class:`~dlmsearch.search.components.lookahead.Lookahead` advanced one level per call. The
state carries everything per sample (the canvases, the counters, the slots' key/value and
KLASS stores, the validated :class:`~dlmsearch.search.plan.DecodePlan`); the engine carries
only the model, so :class:`~dlmsearch.search.session.DecodeSession` can admit and evict
samples between steps.

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
from dlmsearch.core.temperature import COMMIT_RULE, DIVERSITY
from dlmsearch.search.components.candidates import CandidateGenerator
from dlmsearch.search.components.commit import CommitRule, per_row, row_options
from dlmsearch.search.components.expansion import ExpansionPolicy
from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.search.components.revision import NoRevision, Revision
from dlmsearch.search.components.scorers import Scorer
from dlmsearch.search.components.selectors import Selector
from dlmsearch.search.components.stopping import fill_after_end
from dlmsearch.search.components.triggers import NeverTrigger, Trigger
from dlmsearch.search.engine.guidance import Guidance
from dlmsearch.search.engine.rollout import CallRows, CallSettings, RolloutEngine
from dlmsearch.search.engine.slot_memory import SlotMemory
from dlmsearch.search.plan import DecodePlan, make_plan
from dlmsearch.search.records.randomness import BRANCH_KEYS
from dlmsearch.search.records.row_sampling import RowSampling
from dlmsearch.search.records.slots import SlotRows, Slots
from dlmsearch.search.records.state import Canvas, Evaluation, Layout, block_aligned, initial_canvas
from dlmsearch.search.records.usage import Usage
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.search.width.population_hook import PopulationHook, PopulationOutcome, SinglePath, SlotCanvases

RECHECK_KEY = BRANCH_KEYS - 1  # the rows of a population's final re-check by the model


@attrs.frozen
class DecodeRequest:
    """One sample: ``uid`` names it in the decode; ``generation`` holds the mask where to fill.
    Its randomness is keyed by ``seed`` (None: the engine's) and ``key`` (None: the uid), so a
    server's request decodes as item 0 of an offline run with its seed, beside other requests;
    its ``sampling`` lets it sample as an offline run with those engine settings would, in the
    same forward as requests that sample otherwise."""

    uid: int
    prompt: torch.Tensor
    generation: torch.Tensor
    seed: int | None = None
    key: int | None = None
    sampling: Sampling | None = None  # its own temperature, top_p, top_k over the decode's (None: the decode's)
    options: dict[str, float] | None = None  # its own values of the commit rule's row options (``threshold``)


@attrs.frozen
class DecodeResult:
    """A decoded generation region and how it was produced (per-position commit record)."""

    uid: int
    # [n]; a block-diffusion model's: its region after the prompt, to the end of its last block (n or more)
    tokens: torch.Tensor
    steps: int
    row_forwards: int
    tokens_committed: int
    token_forwards: int  # positions the model computed for this sample (a cache's saving shows here)
    deadline_hit: bool  # the time budget ran out and the sample was finished by the base rule alone
    commit_call: torch.Tensor  # [n], -1 where the token was given
    commit_confidence: torch.Tensor
    commit_depth: torch.Tensor  # 0: base rule on the root; d >= 1: lookahead depth d
    commit_branch: torch.Tensor  # lookahead branch index, -1 for base commits
    revisions: torch.Tensor  # [n] times each position was returned to the mask (0 for decoders that never revise)
    population: PopulationOutcome = attrs.field(factory=lambda: PopulationOutcome())
    writes: int = 0  # of the steps, the calls that only wrote a cache (a uniform-noise model's encoder calls)

    @property
    def decoder_forwards(self) -> int:
        """The denoising forwards: model calls that were not a cache's separate write (DiffusionGemma's ``decoder_forward_passes``)."""
        return self.steps - self.writes


@attrs.frozen
class DecodeState:
    """Everything a batch's decoding carries between rounds: ``state = step(engine, state)``
    until ``finished``. The plan, the slot table, the per-sample counters, the population's own
    state (opaque to the loop), the canvases, their latest evaluations, the per-slot flags and
    the slots' stores are here, none of it in the engine, so a caller can stream finished
    samples or admit new ones between steps (:class:`~dlmsearch.search.session.DecodeSession`)."""

    plan: DecodePlan
    layout: Layout
    canvas: Canvas  # [slots] every slot's canvas
    evaluation: Evaluation  # [slots] the latest evaluation of each slot's canvas
    fresh: torch.Tensor  # [slots] ``evaluation`` is of the current canvas
    late: torch.Tensor  # [slots] past the deadline: the base rule alone finishes it
    slots: Slots  # which sample and particle each slot is
    population: object  # the population hook's state (None for a population of one)
    usage: Usage  # [samples] model calls, row- and token-forwards so far
    rounds: torch.Tensor  # [samples] rounds each sample has been through (its own, wherever it joined)
    memory: SlotMemory  # [slots] stored keys and values, KLASS's history (the one mutable part: device stores)
    started: torch.Tensor  # [samples] time.monotonic() when each sample started, for the deadline
    round_index: int = 0
    finished: bool = False
    memory_version: int = 0  # ``memory.version`` when this state was made: an older state is refused

    @property
    def decoding(self) -> torch.Tensor:
        """``[slots]`` the slots still decoding: a canvas with masks left, a particle its population runs."""
        return self.canvas.decoding & self.plan.population.running(self.population, self.slots)

    def check_rounds(self, decoding: torch.Tensor) -> None:
        """Refuse another round for a sample that has had the rounds any sample can need
        (``plan.max_rounds``): its decoder never finishes it. The one bound on a sample's rounds,
        which every intake meets (the offline loop, a run's and a server's sessions).

        Args:
            decoding: ``[slots]`` the slots about to decode (:attr:`decoding`).
        """
        limit = self.plan.max_rounds()
        over = decoding & (self.rounds[self.slots.owner] >= limit)
        if bool(over.any()):
            uids = sorted(set(self.slots.uid[over].tolist()))
            raise RuntimeError(f"decoder {self.plan.name!r} did not finish sample uid(s) {uids} within {limit} rounds")


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
    revision: Revision = attrs.field(factory=NoRevision)  # after the base rule's commits: which go back to the mask
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
        return self.commit.statistics | (self.candidates.statistics if self.candidates is not None else frozenset())

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
        """The state before the first round: checks the batch against the plan (made here when
        none is given) and lays out the canvases; the counters start at zero."""
        gen_length = len(requests[0].generation)
        plan = plan or self.plan(engine, gen_length, block_length, verifier)
        self._check_requests(plan, requests)
        size = plan.population.size
        mask_id = engine.mask_id
        if plan.attention_block is None:
            prompts, templates = [r.prompt for r in requests], [r.generation for r in requests]
            region = torch.tensor([[0, gen_length]] * len(requests), dtype=torch.long)
        else:  # block diffusion: every row's blocks start at the same column (``block_aligned``)
            laid = [block_aligned(r.prompt, r.generation, plan.attention_block, mask_id) for r in requests]
            prompts, templates = [head for head, _, _ in laid], [template for _, template, _ in laid]
            region = torch.tensor([list(columns) for _, _, columns in laid], dtype=torch.long)
        layout = plan.layout(max(len(p) for p in prompts))
        canvas = initial_canvas(
            [p for p in prompts for _ in range(size)],
            [t for t in templates for _ in range(size)],
            layout,
            mask_id,
            pad_id=mask_id,
        )
        if plan.commit.redecides:  # uniform noise: every row starts on its first canvas, held until it is final
            zeros = torch.zeros(canvas.rows, dtype=torch.long)
            canvas = attrs.evolve(canvas, block=zeros, block_round=zeros, review=torch.ones_like(canvas.review))
        slots = len(requests) * size
        long = lambda values: torch.tensor(values, dtype=torch.long)
        slots_table = Slots.start(
            long([r.uid for r in requests]),
            size,
            long([engine.seed if r.seed is None else r.seed for r in requests]),
            region,
            long([r.uid if r.key is None else r.key for r in requests]),
            RowSampling.of([(r.sampling or Sampling()).over(plan.sampling) for r in requests]),
            {
                name: torch.tensor(
                    [float((r.options or {}).get(name, getattr(plan.commit, name))) for r in requests],
                    dtype=torch.float64,
                )
                for name in row_options(plan.commit)
            },
        )
        return DecodeState(
            plan=plan,
            layout=layout,
            canvas=canvas,
            evaluation=Evaluation.empty(slots, layout.width, plan.statistics),
            fresh=torch.zeros(slots, dtype=torch.bool),
            late=torch.zeros(slots, dtype=torch.bool),
            slots=slots_table,
            population=plan.population.start(slots_table),
            usage=Usage.zeros(len(requests)),
            rounds=torch.zeros(len(requests), dtype=torch.long),
            memory=engine.memory(slots),
            started=torch.full((len(requests),), time.monotonic(), dtype=torch.float64),
        )

    @staticmethod
    def _check_requests(plan: DecodePlan, requests: list[DecodeRequest]) -> None:
        """What only the requests can show: one generation length, canvases that fit, ids in the vocabulary."""
        if any(len(r.generation) != plan.gen_length for r in requests):
            raise ValueError(f"all requests of a decode must share the plan's generation length ({plan.gen_length})")
        longest = max(requests, key=lambda r: len(r.prompt))
        plan.check_canvas(len(longest.prompt), f"the canvas of sample uid {longest.uid}")
        own = [(r.uid, r.sampling) for r in requests if r.sampling is not None]
        confidence = [uid for uid, s in own if s.confidence not in (None, plan.sampling.confidence)]
        if confidence:
            raise ValueError(
                f"sample uid(s) {confidence} read the confidence otherwise than the decode "
                f"(confidence={plan.sampling.confidence!r}): one decode reads it one way"
            )
        _check_options(plan, requests)
        tempered = [uid for uid, s in own if s.temperature is not None]
        if tempered and not plan.temperature.takes_settings:  # the plan's rule 13, for a request's own temperature
            raise ValueError(
                f"the own temperature of sample uid(s) {tempered} would be ignored: {plan.temperature.source} "
                f"decides the temperature here; {plan.temperature.instead}"
            )
        bad = [r.uid for r in requests if bool(((r.prompt < 0) | (r.prompt >= plan.vocab_size)).any())]
        if bad:
            raise ValueError(f"prompt token ids outside the vocabulary [0, {plan.vocab_size}) in sample uid(s) {bad}")
        media = torch.tensor(plan.media_ids, dtype=torch.long)
        with_media = [r.uid for r in requests if bool(torch.isin(r.prompt, media).any())]
        if with_media:
            raise ValueError(
                f"the prompt of sample uid(s) {with_media} holds image or audio token ids {list(plan.media_ids)}: "
                "dlmsearch decodes text only (no image or audio inputs)"
            )

    def finish(self, engine: RolloutEngine, state: DecodeState, verifier: Verifier | None = None) -> list[DecodeResult]:
        """Each sample's output: the population's re-check and choice, then the chosen slot's result."""
        _check_current(state)
        layout, canvas, slots, population, plan = state.layout, state.canvas, state.slots, state.population, state.plan
        spent = [state.usage]  # the re-check's calls count too

        def recheck(probe: Canvas, rows: torch.Tensor) -> Evaluation:
            evaluation, spent[0] = _evaluate(engine, state, spent[0], probe, rows, torch.full_like(rows, RECHECK_KEY))
            return evaluation

        chosen_slot = plan.population.choose(
            SlotCanvases(canvas, slots, layout, verifier), population, recheck, engine.mask_id
        )
        late_sample = state.late.view(slots.samples, slots.size).any(dim=1)
        return [
            self._result(
                canvas,
                spent[0],
                slots,
                plan.population.outcome(population, int(chosen_slot[i]), i),
                int(chosen_slot[i]),
                i,
                layout,
                bool(late_sample[i]),
            )
            for i in range(slots.samples)
        ]

    def _result(
        self,
        canvas: Canvas,
        usage: Usage,
        slots: Slots,
        outcome: PopulationOutcome,
        slot: int,
        sample: int,
        layout: Layout,
        late: bool,
    ) -> DecodeResult:
        """One sample's result, read from the slot the population chose for it.

        Args:
            canvas: the final canvases (``[slots, T]``).
            usage: the decode's counters (``[samples]`` each).
            slots: the slot table (each slot's uid and generation region).
            outcome: the population's account of the sample.
            slot: the chosen slot's index.
            sample: the sample's index (its counters' row).
            layout: the decode's layout (where the generation starts).
            late: whether the sample passed its deadline.
        """
        first, end = (layout.gen_start + int(c) for c in slots.region[slot])
        # the sample's output (a block-aligned row: after its prompt, to the end of its last block)
        gen = slice(first, end)
        call = canvas.commit_call[slot, gen]
        return DecodeResult(
            uid=int(slots.uid[slot]),
            tokens=canvas.tokens[slot, gen].clone(),
            steps=int(usage.steps[sample]),
            writes=int(usage.writes[sample]),
            row_forwards=int(usage.row_forwards[sample]),
            token_forwards=int(usage.token_forwards[sample]),
            deadline_hit=late,
            tokens_committed=int((call >= 0).sum()),
            commit_call=call.clone(),
            commit_confidence=canvas.commit_confidence[slot, gen].clone(),
            commit_depth=canvas.commit_depth[slot, gen].clone(),
            commit_branch=canvas.commit_branch[slot, gen].clone(),
            revisions=canvas.revisions[slot, gen].clone(),
            population=outcome,
        )


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
    _check_current(state)
    # The stores move on as the step starts: the state handed in is stale from here on, also when this step fails midway
    state = attrs.evolve(state, memory_version=state.memory.advance())
    state, round_ = _evaluate_roots(engine, state)
    if round_ is None:
        return attrs.evolve(state, finished=True)
    state, round_ = _explore(engine, state, round_, deadline_s, on_lookahead)
    state, committed = _select_and_commit(state, round_)
    state = _revise(state, round_, committed)
    return _advance(state, verifier, on_round)


def _check_current(state: DecodeState) -> None:
    """Refuse a state older than its slots' stores (they were written for a newer one)."""
    if state.memory_version != state.memory.version:
        raise ValueError(
            f"this decode state is stale: its slots' stores moved on to version {state.memory.version} "
            f"(the state was made at {state.memory_version}); step the state the last step returned"
        )


def _evaluate_roots(engine: RolloutEngine, state: DecodeState) -> tuple[DecodeState, Round | None]:
    """The slots decoding this round, each root evaluated unless the last round left it fresh."""
    canvas, latest = state.canvas, state.evaluation
    active = state.decoding
    if not bool(active.any()):
        return state, None
    state.check_rounds(active)  # before any forward: a sample past the bound gets no more rounds
    need = (active & ~state.fresh).nonzero().squeeze(1)
    fresh, usage = state.fresh.clone(), state.usage
    if need.numel():
        evaluation, usage = _evaluate(engine, state, usage, canvas.take(need), need, torch.zeros_like(need))
        latest = latest.put(need, evaluation)
        fresh[need] = True
    rows = active.nonzero().squeeze(1)
    exploit = torch.ones(len(rows), dtype=torch.bool)
    round_ = Round(rows, canvas.take(rows), latest.take(rows), exploit, prior=state.evaluation)
    return attrs.evolve(state, evaluation=latest, fresh=fresh, usage=usage), round_


def _explore(
    engine: RolloutEngine,
    state: DecodeState,
    round_: Round,
    deadline_s: float | None,
    on_lookahead: Callable[[Lookahead], None] | None,
) -> tuple[DecodeState, Round]:
    """Where the trigger fires (and the deadline has not passed): look ahead and adopt the
    selected branch with the evaluation it already has; exploit it at once unless the selector
    asked for a fresh lookahead from it."""
    rows, late = round_.rows, state.late
    if deadline_s is not None:
        over = time.monotonic() - state.started[state.slots.owner] > deadline_s
        over = engine.decisions.any(over)  # a tensor-parallel group goes late as one: each rank reads its own clock
        late = late | (over & _scattered(rows, len(late)))
    explore = state.plan.trigger.fires(round_.root, round_.evaluation, state.layout) & ~late[rows]
    explore = explore & ~_finishing(state, round_.root, round_.evaluation)
    state = attrs.evolve(state, late=late)
    explored = rows[explore]
    if not explored.numel():
        return state, round_
    adopted, adopted_eval, restart, usage, best = _lookahead(
        engine, state, round_.root.take(explore), round_.evaluation.take(explore), explored, on_lookahead
    )
    if state.plan.commit.redecides:  # the adopted branch's self-conditioning input and stopping history
        state.memory.canvas.adopt(explored, state.slots.particle[explored] * BRANCH_KEYS + 1 + best)
    adopted, ended = _leave_finished(state, adopted)
    at = explore.nonzero().squeeze(1)  # positions of the exploring slots within ``rows``
    exploit = round_.exploit.clone()
    exploit[at] = ~restart & ~ended
    fresh = state.fresh.clone()
    fresh[explored[ended]] = False  # its root evaluates the next canvas (after encoding the finished one)
    round_ = attrs.evolve(
        round_,
        root=round_.root.put(at, adopted),
        evaluation=round_.evaluation.put(at, adopted_eval),
        exploit=exploit,
    )
    canvas, evaluation = state.canvas.put(explored, adopted), state.evaluation.put(explored, adopted_eval)
    return attrs.evolve(state, canvas=canvas, evaluation=evaluation, usage=usage, fresh=fresh), round_


def _finishing(state: DecodeState, root: Canvas, evaluation: Evaluation) -> torch.Tensor:
    """``[n]`` uniform noise: roots whose next step finishes their canvas. They do not look ahead:
    every branch would be the same canvas (the draft), finished."""
    if not state.plan.commit.redecides:
        return torch.zeros(root.rows, dtype=torch.bool)
    return state.plan.commit.finishes(root, evaluation, state.layout)


def _finished(state: DecodeState, branches: Canvas) -> torch.Tensor:
    """``[rows]`` branches with nothing left to decide: no mask left; on uniform noise, a finished
    canvas (a branch stops at the canvas it finished: only its slot's root encodes a canvas)."""
    if state.plan.commit.redecides:
        return branches.canvas_finished(state.layout)
    return ~branches.masked.any(dim=1)


def _leave_finished(state: DecodeState, adopted: Canvas) -> tuple[Canvas, torch.Tensor]:
    """Uniform noise: the adopted branches moved on from the canvas they finished (as the base
    rule moves a root), and ``[S]`` which they were (the base rule does not step them this round)."""
    if not state.plan.commit.redecides:
        return adopted, torch.zeros(adopted.rows, dtype=torch.bool)
    return adopted.advance_blocks(state.layout, state.plan.commit), adopted.canvas_finished(state.layout)


def _scattered(rows: torch.Tensor, size: int) -> torch.Tensor:
    """``[size]`` True at ``rows``."""
    flags = torch.zeros(size, dtype=torch.bool)
    flags[rows] = True
    return flags


def _check_options(plan: DecodePlan, requests: list[DecodeRequest]) -> None:
    """A sample's own commit options: ones its rule reads per row, each a value the rule accepts."""
    names = row_options(plan.commit)
    for request in requests:
        for name, value in (request.options or {}).items():
            if name not in names:
                raise ValueError(
                    f"sample uid {request.uid} sets decoder.commit.{name}, which decoder {plan.name!r} cannot take "
                    f"per sample (its commit rule takes {', '.join(names) or 'none'} per sample)"
                )
            attrs.evolve(plan.commit, **{name: value})  # the rule's own check, naming the field


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
    if plan.commit.redecides:  # uniform noise: the whole canvas is decided afresh (kept, re-noised, or finished)
        committed = plan.commit.redecide(sub, proposals, state.layout, call, plan.mask_id)
        return attrs.evolve(state, population=population), committed
    rule = per_row(plan.commit, slots.options_at(base), proposals.confidence.dtype)
    chosen = rule.select(sub, proposals, state.layout)
    committed = sub.commit(
        chosen,
        sub_eval.token,
        sub_eval.confidence,
        call,
        0,
        -1,
        state.layout,
        plan.commit,
        advance=not plan.revision.revises,
    )
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
    fresh = state.fresh.clone()
    fresh[base] = False
    return attrs.evolve(state, canvas=state.canvas.put(base, committed), fresh=fresh)


def _advance(
    state: DecodeState, verifier: Verifier | None, on_round: Callable[[Canvas, torch.Tensor | None], None] | None
) -> DecodeState:
    """End the round: fill after an answer's end, let the population end, stop or resample
    particles (slots take over others' stores), count the round."""
    plan, layout, slots = state.plan, state.layout, state.slots
    canvas, evaluation, fresh, late = state.canvas, state.evaluation, state.fresh, state.late
    if plan.stop_ids:  # a block-diffusion or uniform-noise answer ends with the block (canvas) that holds its end
        whole_block = plan.attention_block is not None or plan.commit.redecides
        canvas = fill_after_end(
            canvas, layout, torch.tensor(plan.stop_ids), slots.region[:, 0], whole_block, plan.commit.redecides
        )
    at = SlotCanvases(canvas, slots, layout, verifier)
    population, source = plan.population.after_round(at, state.population, state.rounds)
    if source is not None:
        canvas, evaluation, fresh, late = canvas.take(source), evaluation.take(source), fresh[source], late[source]
        state.memory.reorder(source)
    if on_round is not None:
        on_round(canvas, source)
    return attrs.evolve(
        state,
        canvas=canvas,
        evaluation=evaluation,
        fresh=fresh,
        late=late,
        population=population,
        rounds=state.rounds + 1,
        round_index=state.round_index + 1,
        memory_version=state.memory.version,  # advanced as the step started, and by a reorder here
    )


def _evaluate(
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
    )
    settings = CallSettings(state.memory, plan.sampling, plan.statistics, state.layout.gen_start, plan.guidance)
    evaluation, cost = engine.evaluate(rows, settings)
    return evaluation, usage.charge(owner, cost)


def _lookahead(
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
    if plan.commit.redecides:  # uniform noise: the step with the candidate kept beside the keep-set
        branches = plan.commit.redecide(
            root.repeat(width),
            repeated,
            layout,
            calls.repeat_interleave(width),
            plan.mask_id,
            first,
            depth=1,
            branch=branch_id,
            advance=False,
        )
    else:
        branches = root.repeat(width).commit(
            first,
            repeated.token,
            repeated.confidence,
            calls.repeat_interleave(width),
            1,
            branch_id,
            layout,
            plan.commit,
        )
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
    sub_eval, usage = _evaluate(engine, state, usage, sub, look.slot_row[rows], 1 + look.branch_id[rows])
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
    finished = _finished(state, look.branches).view(samples, width)
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
    chosen = rule.select(sub, sub_eval, layout) & (sub.masked | commit.redecides)
    logs = torch.where(chosen, torch.log(sub_eval.confidence.clamp(min=1e-30)), 0.0).sum(dim=1)
    step_log_conf = look.step_log_conf.clone()
    step_log_conf[rows] = logs / chosen.sum(dim=1).clamp(min=1)
    depth = look.depth + 1
    calls = usage.steps[state.slots.owner[look.slot_row[rows]]]
    if commit.redecides:  # uniform noise: the branch's next step of the reference loop, stopping at its canvas's end
        rolled = commit.redecide(
            sub, sub_eval, layout, calls, state.plan.mask_id, depth=depth, branch=look.branch_id[rows], advance=False
        )
    else:
        rolled = sub.commit(
            chosen, sub_eval.token, sub_eval.confidence, calls, depth, look.branch_id[rows], layout, commit
        )
    return attrs.evolve(look, branches=look.branches.put(rows, rolled), step_log_conf=step_log_conf, depth=depth)
