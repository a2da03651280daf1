"""A decode that samples join and leave between steps: what continuous batching stands on.

``admit`` lays out new requests as the decoder's own ``start`` would and joins them to the
running decode: canvases are left-padded to the longest prompt (the stored keys and values
too), and slots, counters, rounds, stores and the population's state are appended. ``step``
runs one round of the one decode loop for everything admitted and returns the results of the
samples it finished, which leave the decode; ``evict`` drops samples early (a client went
away). Every sample's tokens and counters are exactly what it gets decoded alone, whatever
joins or leaves around it: its randomness is keyed by its uid and its own call count, its
padding is invisible, and its rounds, deadline and population schedule are its own. A task's
verifier is asked about samples by uid (:class:`ByUid`), since their places in the decode change.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.decode.state import DecodeState
from dlmsearch.search.driver import SearchDecoder, step
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.plan import DecodePlan
from dlmsearch.search.records.resize import ABSENT_COLUMNS, LENGTH_SETTLED
from dlmsearch.search.records.rows import cat_rows, pad_columns
from dlmsearch.search.records.slots import Slots
from dlmsearch.search.records.state import Canvas, Evaluation
from dlmsearch.search.records.tree import Tree
from dlmsearch.search.records.verifier import Verifier

# Padding of a wider canvas: the pad token is the mask (as ``initial_canvas`` pads), nothing committed there.
CANVAS_PADDING = ABSENT_COLUMNS


def _filled(record: Evaluation, other: Evaluation) -> Evaluation:
    """``record`` with zeros for the statistics only ``other`` computed (those rows are re-evaluated before use)."""
    missing = {
        f.name: getattr(other, f.name)
        for f in attrs.fields(Evaluation)
        if getattr(record, f.name) is None and getattr(other, f.name) is not None
    }
    return attrs.evolve(
        record, **{name: like.new_zeros(len(record.token), like.shape[1]) for name, like in missing.items()}
    )


def _evaluations(first: Evaluation, second: Evaluation) -> Evaluation:
    """Rows of both, a statistic one of them never computed reading as zeros there."""
    return cat_rows(_filled(first, second), _filled(second, first))


def join(state: DecodeState, other: DecodeState) -> DecodeState:
    """``other``'s samples (just started, nothing stored yet) after ``state``'s, both laid out to the wider
    canvas: left-padded to the longer prompt, and (where a length policy has grown some canvases) given
    absent columns on the right up to the longer generation region."""
    if state.layout.block_length != other.layout.block_length or (
        state.layout.gen_length != other.layout.gen_length and not state.plan.length.changes
    ):
        raise ValueError("samples joining a decode must share its generation and block lengths")
    gen_start = max(state.layout.gen_start, other.layout.gen_start)
    wider, narrower = gen_start - state.layout.gen_start, gen_start - other.layout.gen_start
    gen_length = max(state.layout.gen_length, other.layout.gen_length)
    mask_id = state.plan.mask_id

    def pad(canvas: Canvas, left: int, right: int) -> Canvas:
        tail = {**CANVAS_PADDING, "tokens": state.plan.length.eos_id}  # a grown canvas's absent tail (resize.resized)
        return pad_columns(pad_columns(canvas, left, {**CANVAS_PADDING, "tokens": mask_id}), right, tail, right=True)

    def pad_evaluation(evaluation: Evaluation, left: int, right: int) -> Evaluation:
        return pad_columns(pad_columns(evaluation, left, {"token": mask_id}), right, {"token": mask_id}, right=True)

    grow = lambda decode: gen_length - decode.layout.gen_length
    state.memory.admit(len(other.slots), widen=wider)
    population = state.plan.population
    return attrs.evolve(
        state,
        layout=attrs.evolve(state.plan.layout(gen_start), gen_length=gen_length),
        canvas=cat_rows(pad(state.canvas, wider, grow(state)), pad(other.canvas, narrower, grow(other))),
        evaluation=_evaluations(
            pad_evaluation(state.evaluation, wider, grow(state)),
            pad_evaluation(other.evaluation, narrower, grow(other)),
        ),
        evaluated=torch.cat([state.evaluated, other.evaluated]),
        late=torch.cat([state.late, other.late]),
        slots=state.slots.joined(other.slots),
        population=population.join(state.population, other.population),
        usage=state.usage.joined(other.usage),
        rounds=torch.cat([state.rounds, other.rounds]),
        started=torch.cat([state.started, other.started]),
        finished=False,
        memory_version=state.memory.version,
        tree=_joined_trees(state, other, (wider, grow(state)), (narrower, grow(other))),
    )


def _joined_trees(
    state: DecodeState, other: DecodeState, mine_pads: tuple[int, int], their_pads: tuple[int, int]
) -> Tree | None:
    """The kept search trees of both decodes (none kept for slots that never searched), laid out to
    the joined canvas as the canvases are: each side padded by its ``(left, right)`` columns."""
    if state.tree is None and other.tree is None:
        return None
    room = max(t.nodes for t in (state.tree, other.tree) if t is not None)
    mask_id = state.plan.mask_id
    mine = None if state.tree is None else state.tree.with_room(room).widened(mine_pads[0], mask_id, mine_pads[1])
    theirs = None if other.tree is None else other.tree.with_room(room).widened(their_pads[0], mask_id, their_pads[1])
    like = mine if mine is not None else theirs
    assert like is not None
    mine = mine if mine is not None else Tree.none_like(like, len(state.evaluated))
    theirs = theirs if theirs is not None else Tree.none_like(like, len(other.evaluated))
    return mine.joined(theirs)


def keep(state: DecodeState, samples: torch.Tensor, copy_stores: bool = False) -> DecodeState:
    """The decode of only these samples (batch indices, in order). By default this decode's stores
    narrow to them (the others leave); ``copy_stores`` gives the result its own copy and leaves
    this decode's stores as they are (finished samples taken out to report them)."""
    slots, slot = state.slots.kept(samples)
    stores = state.memory.split(slot) if copy_stores else state.memory
    if not copy_stores:
        stores.reorder(slot)
    return attrs.evolve(
        state,
        canvas=state.canvas.take(slot),
        evaluation=state.evaluation.take(slot),
        evaluated=state.evaluated[slot],
        late=state.late[slot],
        slots=slots,
        population=state.plan.population.keep(state.population, slot, samples),
        usage=state.usage.take(samples),
        rounds=state.rounds[samples],
        started=state.started[samples],
        memory=stores,
        memory_version=stores.version,
        tree=None if state.tree is None else state.tree.take(slot),
    )


@attrs.frozen
class ByUid:
    """A uid-keyed verifier as a decode asks it: by each sample's place (``sample``), here mapped
    to the sample's uid, so that a sample is checked against its own question wherever it sits."""

    verifier: Verifier
    uid: torch.Tensor  # [samples] the uid of each place in the decode

    @property
    def checks_partial(self) -> bool:
        return self.verifier.checks_partial

    @property
    def checks_complete(self) -> bool:
        return self.verifier.checks_complete

    def consistent(self, sample: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        return self.verifier.consistent(self.uid[sample], tokens, masked)

    def accepts(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.verifier.accepts(self.uid[sample], tokens)

    def violations(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.verifier.violations(self.uid[sample], tokens)

    def answers(self, sample: torch.Tensor, tokens: torch.Tensor) -> list[str | None]:
        return self.verifier.answers(self.uid[sample], tokens)


def sample_uids(state: DecodeState) -> torch.Tensor:
    """``[samples]`` the uid of each sample of the decode, in its order (its first particle's)."""
    return state.slots.uid.view(-1, state.slots.size)[:, 0]


def placed(verifier: Verifier | None, state: DecodeState) -> Verifier | None:
    """``verifier`` (keyed by uid) as this decode's samples are placed."""
    return None if verifier is None else ByUid(verifier, sample_uids(state))


@attrs.define(eq=False)
class DecodeSession:
    """One decode loop over a changing set of samples (a server's continuous batch)."""

    decoder: SearchDecoder
    engine: RolloutEngine
    plan: DecodePlan
    verifier: Verifier | None = (
        None  # a population's task check, keyed by uid (a question-free rule, or one built so that index ``uid`` holds that sample's question)
    )
    deadline_s: float | None = None
    state: DecodeState | None = None
    on_lookahead: Callable[[Lookahead, Slots], None] | None = (
        None  # every lookahead level, with the slot table that names its slots' samples (traces)
    )

    @classmethod
    def open(
        cls,
        decoder: SearchDecoder,
        engine: RolloutEngine,
        gen_length: int,
        block_length: int,
        verifier: Verifier | None = None,
        deadline_s: float | None = None,
    ) -> DecodeSession:
        """A session whose plan is checked once, before any request is admitted.

        Args:
            decoder: the decoder every admitted request decodes with.
            engine: the model's only caller.
            gen_length: the generation length every request shares.
            block_length: the columns committed block by block.
            verifier: a population's task check, keyed by uid (see :attr:`verifier`).
            deadline_s: past it (seconds from a sample's start), a sample stops exploring.
        """
        return cls(decoder, engine, decoder.plan(engine, gen_length, block_length, verifier), verifier, deadline_s)

    @property
    def uids(self) -> list[int]:
        """The samples decoding now, in their order in the decode."""
        return [] if self.state is None else sample_uids(self.state).tolist()

    @property
    def rows(self) -> int:
        """Slots decoding now (particles count)."""
        return 0 if self.state is None else len(self.state.slots)

    def settled(self) -> dict[int, tuple[torch.Tensor, int]]:
        """Per running sample: its first particle's output columns and how many of them lead
        without a mask (committed, so final where the decoder never revises and keeps one path);
        a held block (one a whole-block step still decides, however much of it is kept) is not settled, nor
        is anything of a canvas whose length policy may still trim it."""
        if self.state is None:
            return {}
        state = self.state
        rows = torch.arange(state.slots.samples) * state.slots.size
        canvas = state.canvas.take(rows)
        first, end = state.layout.gen_start + state.slots.region[rows, 0], canvas.extent
        columns = torch.arange(state.canvas.tokens.shape[1])
        held = canvas.held[:, None] & canvas.in_current_block(state.layout)
        held = held | (state.plan.length.trims & (canvas.length_phase != LENGTH_SETTLED))[:, None]
        open_ = (canvas.masked | held) & (columns >= first[:, None]) & (columns < end[:, None])
        leading = torch.where(open_, columns, end[:, None]).min(dim=1).values - first
        return {
            uid: (state.canvas.tokens[row, a:b], int(n))
            for uid, row, a, b, n in zip(self.uids, rows.tolist(), first.tolist(), end.tolist(), leading)
        }

    def admit(self, requests: list[DecodeRequest]) -> None:
        """Join these requests to the decode; they start at their first round."""
        if not requests:
            return
        running = set(self.uids)
        clash = sorted(running & {r.uid for r in requests})
        if clash or len({r.uid for r in requests}) != len(requests):
            raise ValueError(
                f"sample uid(s) {clash or [r.uid for r in requests]} are already decoding: every sample of a session needs its own uid"
            )
        new = self.decoder.start(
            self.engine, requests, self.plan.block_length, self.verifier, self.plan
        )  # their deadlines count from now
        self.state = new if self.state is None else join(self.state, new)

    def evict(self, uids: list[int]) -> None:
        """Drop these samples now (no result); every other sample decodes on unchanged."""
        if self.state is None:
            return
        gone = set(uids)
        stay = torch.tensor([i for i, uid in enumerate(self.uids) if uid not in gone], dtype=torch.long)
        self.state = None if len(stay) == 0 else keep(self.state, stay)

    def step(self) -> list[DecodeResult]:
        """One round for every sample admitted; the results of those it finished (they leave the decode).
        A sample past the rounds any sample can need fails the step, naming its uid
        (:meth:`~dlmsearch.search.decode.state.DecodeState.check_rounds`): a server's or a run's session ends too."""
        if self.state is None:
            return []
        before, hook = self.state, self.on_lookahead
        look = None if hook is None else lambda lookahead: hook(lookahead, before.slots)
        self.state = step(self.engine, before, placed(self.verifier, before), self.deadline_s, on_lookahead=look)
        return self._take_finished()

    def clear(self) -> None:
        """Drop every sample at once, after a failed step has left the decode's state in doubt."""
        self.state = None

    def _take_finished(self) -> list[DecodeResult]:
        assert self.state is not None
        state = self.state
        done = ~state.decoding.view(state.slots.samples, state.slots.size).any(dim=1)
        if not bool(done.any()):
            return []
        finished = keep(state, done.nonzero().squeeze(1), copy_stores=True)
        results = self.decoder.finish(self.engine, finished, placed(self.verifier, finished))
        stay = (~done).nonzero().squeeze(1)
        self.state = None if len(stay) == 0 else keep(state, stay)
        return results

    def run(self) -> list[DecodeResult]:
        """Step until every admitted sample has finished; their results in the order they finished.
        One batch, admitted up front, whose errors propagate (the Python API's call); admission
        between steps and failure policies are :class:`~dlmsearch.search.batcher.Batcher`'s."""
        results: list[DecodeResult] = []
        while self.state is not None:
            results += self.step()
        return results
