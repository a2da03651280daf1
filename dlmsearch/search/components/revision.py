"""Revisions: after a round's commits, which committed positions go back to the mask.

A revision runs next to the commit rule, on the rows the base rule committed: it sees each
row's canvas before and after the round's commits (with the commit record: ``commit_confidence``
is the confidence a token had when it was last filled, the running confidence of RCR and
ReMDM) and returns the positions to re-mask. Given tokens (prompt, clues) and the tails that
stopping fills are never revised (``Canvas.remask`` refuses them); the commit record counts
every revision per position (``revisions``). The rules that revise hold their block for a fixed
budget of steps (``holds_block``), so every decode still ends within ``gen_length + 1 +
budget * blocks`` rounds.

* :class:`NoRevision`: the default; every existing decoder is unchanged.
* :class:`RunningConfidence` (RCR, He et al., arXiv 2508.13148): after step ``t`` of ``S``,
  keep ``K_t = N - floor(N * g((t + 1) / S))`` and re-mask the rest, lowest running confidence
  first (ties: the earlier position), over every generated position (``scope: generated``, as the
  authors' code) or the current block's; the last step of a block re-masks nothing; ``pool``
  (``authors`` | ``paper``) says whether confidences of exactly 1.0 may go back.
* :class:`TokenEditing` (LLaDA2.1): committed tokens of the current block are replaced by a new
  proposal whose confidence passes the editing threshold; a block without masks is held while
  its rounds still edit (at most ``max_post_steps`` such rounds).
* :class:`LoopRemask` (ReMDM, Wang et al., NeurIPS 2025; the authors' LLaDA variant): in the
  loop window of each block, before each step, re-mask the ``k`` committed positions of the
  block with the lowest confidence at commit (on a 2^-20 grid; ties: the earlier position).
"""

from __future__ import annotations

import math
from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.search.components.bound import with_layout
from dlmsearch.search.components.commit import block_positions, on_grid, remdm_loop_start, top_k_mask
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_choice, number


class Revision(Protocol):
    revises: bool  # False: commits are final (the loop then skips nothing and checks nothing)
    rewrites: bool  # True: it also writes tokens over committed ones (``rewrite``), beside what it re-masks

    def bind(self, layout: Layout, block_budget: int | None) -> Revision:
        """The revision for this layout and the commit rule's steps per block (checked; a bound copy where it counts steps): the decode plan's, never written."""

    def extra_rounds(self, layout: Layout) -> int:
        """Rounds the revision may add to the driver's bound (0: it never costs net progress)."""

    def revise(
        self, before: Canvas, after: Canvas, layout: Layout, evaluation: Evaluation, previous: Evaluation
    ) -> torch.Tensor | None:
        """``[R, T]`` committed positions to return to the mask (None: none). ``evaluation`` is the
        round's evaluation of ``before``, ``previous`` the slot's evaluation from the round before."""


class _Revising:
    """What the revisions share unless they say otherwise: they re-mask but write no tokens, are bound
    as they are, add no rounds to the driver's bound, and re-mask nothing in ``revise``."""

    revises: ClassVar[bool] = True
    rewrites: ClassVar[bool] = False

    def bind(self, layout: Layout, block_budget: int | None) -> Revision:
        return self

    def extra_rounds(self, layout: Layout) -> int:
        return 0  # within the held budget (RCR, ReMDM) or net progress every step (Saber)

    def revise(
        self, before: Canvas, after: Canvas, layout: Layout, evaluation: Evaluation, previous: Evaluation
    ) -> torch.Tensor | None:
        return None


@attrs.define
class NoRevision(_Revising):
    """Commits are final (monotone decoding)."""

    revises: ClassVar[bool] = False


def lowest(scores: torch.Tensor, eligible: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``[R, T]`` each row's ``count[row]`` eligible positions with the lowest score (ties: the earlier position)."""
    return top_k_mask(-scores, eligible, count)


def _needs_steps(name: str, block_budget: int | None) -> int:
    if block_budget is None:
        raise ValueError(
            f"decoder.revision ({name}) needs a commit rule with a fixed number of steps per block: use `decoder/commit=fill_block`"
        )
    return block_budget


SCHEDULES = ("linear", "cosine")


RCR_POOLS = ("authors", "paper")


@attrs.define
class RunningConfidence(_Revising):
    """RCR's re-masking back to the schedule (pairs with :class:`~dlmsearch.search.components.commit.FillBlock`).

    ``pool`` says which committed positions may go back:

    * ``authors`` (the default; the loop that produced the published numbers): a position whose
      running confidence is exactly 1.0 is never re-masked. With top-p at temperature 0 every
      ``p1 > 0.95`` becomes exactly 1.0, the value the authors' loop also reads for the prompt and
      the not-yet-filled positions; their ``topk`` over the whole row spends the schedule's
      re-masks on those ties (mostly not-yet-filled positions: no-ops), so fewer positions than
      scheduled go back.
    * ``paper``: the full schedule over the generated positions, ties at 1.0 included (the
      earlier position first).

    Calls: a block is held for its ``S`` steps, as in the authors' loop, but a decode ends once
    nothing is masked. With ``pool=authors`` on a saturated model that can happen before the last
    block's ``S`` steps; the authors' loop makes the remaining calls, which fill nothing and
    re-mask nothing (every confidence left is 1.0), so the tokens are the same and the calls fewer.
    """

    schedule: str = attrs.field(default="linear", validator=check_choice(*SCHEDULES))
    scope: str = attrs.field(default="generated", validator=check_choice("generated", "block"))
    pool: str = attrs.field(default="authors", validator=check_choice(*RCR_POOLS))
    steps: int = attrs.field(init=False, default=1)

    def bind(self, layout: Layout, block_budget: int | None) -> RunningConfidence:
        return with_layout(self, steps=_needs_steps("RunningConfidence", block_budget))

    def remaining(self, progress: torch.Tensor) -> torch.Tensor:
        """``g(r)``: the share of a block still masked after a fraction ``r`` of its steps (clipped to [1e-6, 1])."""
        g = 1 - progress if self.schedule == "linear" else torch.cos(math.pi * progress / 2)
        return g.clamp(1e-6, 1.0)

    def masked_after(self, positions: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """``N - K_t = floor(N * g(done / S))`` as the authors compute it: ``g`` in float64, cast
        to float32, then ``N * g`` and the floor in float32. (float32 throughout moves the floor by
        one for many ``(N, S)`` with ``S`` not a power of two: N = 12, S = 3 keeps 7 masked, not 8.)"""
        g = self.remaining(done.double() / self.steps).float()
        return torch.floor(positions.float() * g).long()

    def revise(
        self, before: Canvas, after: Canvas, layout: Layout, evaluation: Evaluation, previous: Evaluation
    ) -> torch.Tensor | None:
        done = before.block_round + 1  # the block's steps so far, this one included
        revising = done < self.steps  # the last step of a block re-masks nothing
        n = block_positions(before, layout)
        count = torch.where(revising, self.masked_after(n, done), 0)
        if not bool((count > 0).any()):
            return None
        scope = after.unlocked(layout) if self.scope == "generated" else after.in_current_block(layout)
        eligible = scope & (after.commit_call >= 0)
        if self.pool == "authors":
            eligible = eligible & (after.commit_confidence < 1.0)
        return lowest(after.commit_confidence, eligible, count)


@attrs.define
class LoopRemask(_Revising):
    """ReMDM's loop (pairs with :class:`~dlmsearch.search.components.commit.ReMDMSchedule`, whose numbers it
    takes): before each loop step of a block, re-mask the ``k`` committed positions of the block
    with the lowest confidence at commit, ranked on
    :func:`~dlmsearch.search.components.commit.on_grid` (2^-20 relative; ties: the earlier
    position), as the schedule ranks them: commits a float32 ulp apart near 1 are common, and
    their raw order is the softmax's rounding, not the model's."""

    k: int = number(int, 1, default=1)
    loop_steps: int | None = number(int, 1, optional=True, default=None)  # None: as many as plain steps
    loop_start_frac: float = number(float, 0.0, 1.0, default=0.875)
    plain: int = attrs.field(init=False, default=1)
    loop: int = attrs.field(init=False, default=1)

    def bind(self, layout: Layout, block_budget: int | None) -> LoopRemask:
        total = _needs_steps("LoopRemask", block_budget)
        loop = self.loop_steps or total // 2
        if total - loop < 1:
            raise ValueError(
                f"decoder.revision.loop_steps={self.loop_steps} leaves no plain steps in the block's {total}"
            )
        return with_layout(self, loop=loop, plain=total - loop)

    def revise(
        self, before: Canvas, after: Canvas, layout: Layout, evaluation: Evaluation, previous: Evaluation
    ) -> torch.Tensor | None:
        start = remdm_loop_start(block_positions(before, layout), self.plain, self.loop_start_frac)
        step = after.block_round  # the next step's index in the block
        revising = (step >= start) & (step < start + self.loop)
        if not bool(revising.any()):
            return None
        eligible = after.in_current_block(layout) & (after.commit_call >= 0)
        return lowest(on_grid(after.commit_confidence), eligible, torch.where(revising, self.k, 0))


@attrs.define
class ConfidenceDrop(_Revising):
    """Saber's backtracking (Dong et al., arXiv 2510.18165; pairs with
    :class:`~dlmsearch.search.components.commit.MeanConfidenceRule`): after a step that committed ``f``
    positions, re-mask the ``r = min(max(floor(n / 2), ceil(f / 8)), f - 1)`` committed positions
    whose top-1 probability fell most since the previous step (``Δ = c - c_prev``, lowest first;
    ties: the earlier position, where the authors' ``topk`` order is unspecified). Net progress is
    at least one position per step. As the authors' loop runs it:

    * ``c_prev`` starts at 0, not at "no previous step": the decode's first step already has a
      finite ``Δ = c`` everywhere and backtracks its least confident new commit (it nets one
      commit, not ``f``);
    * positions the previous step did not score (a block entered this step) have ``Δ = +inf``,
      so a new block backtracks into earlier ones first;
    * a step after which no mask is left before the block's end (earlier blocks' re-masked
      positions included) does not backtrack: the loop leaves the block there.
    """

    n: int = number(int, 1, default=2)

    def revise(
        self, before: Canvas, after: Canvas, layout: Layout, evaluation: Evaluation, previous: Evaluation
    ) -> torch.Tensor | None:
        committed_now = (before.masked & ~after.masked).sum(dim=1)
        prefix_full = after.masks_left(layout, before.block, whole_prefix=True) == 0
        count = torch.minimum(
            torch.maximum(torch.full_like(committed_now, self.n // 2), (committed_now + 7) // 8), committed_now - 1
        )
        count = torch.where(prefix_full, 0, count.clamp(min=0))
        if not bool((count > 0).any()):
            return None
        first_step = ~((before.commit_call >= 0) | (before.revisions > 0)).any(
            dim=1
        )  # c_prev is still the record's initial 0
        scored_before = before.block_round[:, None] > 0  # the previous step decoded this block too
        seen = before.unlocked(layout) & (scored_before | ~before.in_current_block(layout) | first_step[:, None])
        prior = torch.where(first_step[:, None], 0.0, previous.confidence)
        drop = torch.where(seen, evaluation.confidence - prior, math.inf)
        drop = torch.where(torch.isfinite(drop), drop, math.inf)
        eligible = after.unlocked(layout) & (after.commit_call >= 0)
        return lowest(drop, eligible, count)


@attrs.define
class NarrowOut(_Revising):
    """WINO's verification (pairs with :class:`~dlmsearch.search.components.commit.WideInRule`): when a step
    drafted more than one token, re-mask the block's earlier commits whose shadow probability
    (the probability of the token there given everything else, ``verify``) is below ``tau2``; if
    they are at least the previous step's accept count, only that count minus one, lowest first
    (30 at a block's start). The authors' loop has no bound on re-masking; here a block stops
    re-masking after ``max_revising_steps`` steps, so that every decode ends within the driver's
    bound (``extra_rounds``)."""

    tau2: float = number(float, 0.0, 1.0, default=0.9)
    first_accept: int = number(int, 1, default=30)
    max_revising_steps: int = number(int, 1, default=64)

    def extra_rounds(self, layout: Layout) -> int:
        return self.max_revising_steps * layout.num_blocks

    def revise(
        self, before: Canvas, after: Canvas, layout: Layout, evaluation: Evaluation, previous: Evaluation
    ) -> torch.Tensor | None:
        assert evaluation.verify is not None, "NarrowOut needs the verify statistic (WideInRule asks for it)"
        in_block = before.in_current_block(layout)
        accepted = (before.masked & ~after.masked & in_block).sum(dim=1)
        call = torch.where(after.commit_call >= 0, after.commit_call, -1).max(dim=1).values  # this step's call
        last_accept = torch.where(
            before.block_round > 0,
            ((before.commit_call == (call - 1)[:, None]) & in_block).sum(dim=1),
            self.first_accept,
        )
        earlier = in_block & ~before.masked & (before.commit_call >= 0)  # U: committed in the block before this step
        failing = earlier & (evaluation.verify < self.tau2)
        count = failing.sum(dim=1)
        count = torch.where(count >= last_accept, (last_accept - 1).clamp(min=0), count)
        revising = (accepted > 1) & (before.block_round < self.max_revising_steps)
        count = torch.where(revising, count, 0)
        if not bool((count > 0).any()):
            return None
        return lowest(evaluation.verify, failing, count)


@attrs.define
class TokenEditing(_Revising):
    """LLaDA2.1's token-to-token editing (``llada21/sampler.py`` of ZHZisZZ/dllm ``ca17675``,
    Apache-2.0), beside the round's mask commits and from the same evaluation: every committed,
    non-prompt position of the current block (committed before this round) whose proposal differs
    from its token and whose confidence in it is ``> threshold`` (``editing_threshold``, 0.9) takes
    the proposal. Once the block has no mask left it is held for more rounds ("post steps"): it moves
    on after the first round without an edit, or after ``max_post_steps`` (16) such rounds. Nothing
    is re-masked; every edit counts as a revision of its position."""

    threshold: float = number(float, 0.0, 1.0, default=0.9)
    max_post_steps: int = number(int, 0, default=16)
    rewrites: ClassVar[bool] = True

    def extra_rounds(self, layout: Layout) -> int:
        return self.max_post_steps * layout.num_blocks

    def rewrite(
        self, before: Canvas, after: Canvas, layout: Layout, evaluation: Evaluation, call: torch.Tensor
    ) -> Canvas:
        """``after`` (the round's commits made) with the edits of ``before``'s committed tokens, and its block hold."""
        block = before.in_current_block(layout)
        editable = block & ~before.masked & (before.commit_call >= 0)
        edit = editable & (evaluation.confidence > self.threshold) & (evaluation.token != before.tokens)
        had_masks = (before.masked & block).any(dim=1)
        post_steps = before.post_steps + (~had_masks).long()
        emptied = ~(after.masked & block).any(dim=1)
        # held for another round: the block just emptied, or this round without masks still edited; not past the cap
        review = emptied & (had_masks | edit.any(dim=1)) & (post_steps < self.max_post_steps)
        return after.rewrite(edit, evaluation.token, evaluation.confidence, call, review, post_steps)
