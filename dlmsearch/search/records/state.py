"""Decoding state as flat tensors with a leading row dimension.

A row is one canvas: a sample's root state or one hypothesis of a lookahead. Prompts are
left-padded so that the generation region starts at the same column in every row, and block
arithmetic is the same for all rows. Updates return new objects; nothing is written in place.

A block-diffusion model's blocks are counted from each row's first prompt token, so rows with
prompts of different lengths would not share block boundaries. :func:`block_aligned` lays such
a row out so that they do: the prompt's partial last block moves to the front of the generation
region (given tokens, never masked: the reference loops decode it in place), the region runs to
the end of the row's last block (the reference canvas is ``ceil((P + n) / b) * b`` long), and a
shorter region is right-padded with columns that are no token at all (:data:`ABSENT`).
"""

from __future__ import annotations

from typing import Protocol

import attrs
import torch

from dlmsearch.search.records.rows import map_rows, put_rows, take_rows


@attrs.frozen
class Evaluation:
    """Per-position summaries of one forward: proposal, its probability, optional extras."""

    token: torch.Tensor  # [R, T] long: argmax (or a sample) with the mask id excluded
    confidence: torch.Tensor  # [R, T] float: probability of ``token`` at temperature 1
    uniform: torch.Tensor | None = (
        None  # [R, T] float: a seeded uniform draw, for random orderings (drawn only when read)
    )
    margin: torch.Tensor | None = None  # [R, T] top-1 minus top-2 probability
    entropy: torch.Tensor | None = None  # [R, T] entropy of the distribution
    kl: torch.Tensor | None = (
        None  # [R, T] the larger of this and the previous step's KL between successive distributions (KLASS)
    )
    verify: torch.Tensor | None = (
        None  # [R, T] WINO's check: the probability of the token there, from everything else (the shadow block)
    )
    order_noise: torch.Tensor | None = (
        None  # [R, T] added to the commit order's scores (a population's particles diverge)
    )
    draft: torch.Tensor | None = None  # [R, T] the most likely token (a uniform-noise model's output), as a float
    draft_confidence: torch.Tensor | None = None  # [R, T] the draft's probability, read as ``confidence`` is
    tempered_entropy: torch.Tensor | None = None  # [R, T] entropy of the distribution tokens are drawn from
    repeats: torch.Tensor | None = None  # [R, T] steps in a row the row's whole draft has not changed (per row)
    runner_up: torch.Tensor | None = None  # [R, T] the second most likely token, as a float (a tree's joint moves)
    runner_up_confidence: torch.Tensor | None = None  # [R, T] its probability

    def take(self, index: torch.Tensor) -> Evaluation:
        return take_rows(self, index)

    def put(self, index: torch.Tensor, other: Evaluation) -> Evaluation:
        """A copy with the rows at ``index`` replaced by ``other``."""
        return put_rows(self, index, other)

    @staticmethod
    def empty(rows: int, width: int, statistics: frozenset[str]) -> Evaluation:
        zeros = torch.zeros(rows, width)
        return Evaluation(
            token=torch.zeros(rows, width, dtype=torch.long),
            confidence=zeros,
            uniform=zeros if "uniform" in statistics else None,
            margin=zeros if "margin" in statistics else None,
            entropy=zeros if "entropy" in statistics else None,
            kl=zeros if "kl" in statistics else None,
            verify=zeros if "verify" in statistics else None,
            draft=zeros if "draft" in statistics else None,
            draft_confidence=zeros if "draft_confidence" in statistics else None,
            tempered_entropy=zeros if "tempered_entropy" in statistics else None,
            repeats=zeros if "repeats" in statistics else None,
            runner_up=zeros if "runner_up" in statistics else None,
            runner_up_confidence=zeros if "runner_up_confidence" in statistics else None,
        )


@attrs.frozen
class Layout:
    """Where the generation region and its blocks sit in the canvas columns."""

    gen_start: int
    gen_length: int
    block_length: int

    def __attrs_post_init__(self) -> None:
        if self.gen_length <= 0 or self.block_length <= 0:
            raise ValueError(f"gen_length ({self.gen_length}) and block_length ({self.block_length}) must be positive")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length={self.gen_length} must be a multiple of block_length={self.block_length}")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def width(self) -> int:
        return self.gen_start + self.gen_length

    def block_of_column(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Block index of each column; ``-1`` for prompt columns."""
        columns = torch.arange(self.width, device=device) - self.gen_start
        return torch.where(columns >= 0, columns // self.block_length, -1)

    def block_start(self, block: torch.Tensor) -> torch.Tensor:
        """First column of each row's block."""
        return self.gen_start + block * self.block_length


class BlockRule(Protocol):
    """When a row leaves its block; every commit rule carries these (the rule itself is passed)."""

    block_budget: int | None  # rounds a row may spend in one block (fast block diffusion); None: no budget
    holds_block: bool  # stay for the whole budget even when the block is full (rules paired with a revision)
    whole_prefix: bool  # a block is full only when no mask is left before its end, earlier blocks' too (Saber)


@attrs.frozen
class BlockMoves:
    """A :class:`BlockRule` on its own (a canvas set up before any rule, tests): by default a row
    moves when its block is full."""

    block_budget: int | None = None
    holds_block: bool = False
    whole_prefix: bool = False


FULL_BLOCKS = BlockMoves()


@attrs.frozen
class Canvas:
    """Rows of canvases plus the record of how each position was committed.

    ``commit_call`` is the sample's model-call count when the position was committed (``-1``
    for prompt tokens, pre-filled tokens and masks); depth and branch say which lookahead
    produced it (depth 0 = the base commit rule on the root).
    """

    tokens: torch.Tensor  # [R, T] long
    attention: torch.Tensor  # [R, T] bool, False on left padding
    masked: torch.Tensor  # [R, T] bool, True where the generation region still holds the mask
    block: torch.Tensor  # [R] long, the current block
    block_round: torch.Tensor  # [R] long, rounds spent in the current block (one per commit, tokens or none)
    commit_call: torch.Tensor  # [R, T] long
    commit_confidence: torch.Tensor  # [R, T] float
    commit_depth: torch.Tensor  # [R, T] long
    commit_branch: torch.Tensor  # [R, T] long
    revisions: torch.Tensor  # [R, T] long: times the position was returned to the mask (or rewritten) by a revision
    # [R] bool: the current block is held for more rounds though it may have no mask left (LLaDA2.1's editing
    # review; a whole-block step's block until a step finishes it)
    held: torch.Tensor
    post_steps: torch.Tensor  # [R] long: rounds the current block has had without a mask (its editing rounds)
    # [R] long: where the canvas's length stands (``resize.LENGTH_FREE``: a length policy may change it;
    # ``LENGTH_SIZING``: still sized before any commit, DAEDAL's first stage; ``LENGTH_SETTLED``: final)
    length_phase: torch.Tensor
    # [R] long: the row's blocks start this many columns before the layout's (0 but where a length policy grew a
    # finished row whose length is not whole blocks: its next block starts at its old end, rho-EOS's window)
    block_shift: torch.Tensor

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def extent(self) -> torch.Tensor:
        """``[R]`` each row's end column: one past its last present column (a shorter row's absent
        columns, a block-aligned or variable-length canvas's right padding, come after it)."""
        columns = torch.arange(1, self.tokens.shape[1] + 1, device=self.tokens.device)
        return torch.where(self.attention, columns, 0).max(dim=1).values

    @property
    def decoding(self) -> torch.Tensor:
        """``[R]`` rows with work left: a mask, or a held block."""
        return self.masked.any(dim=1) | self.held

    def take(self, index: torch.Tensor) -> Canvas:
        """The rows at ``index`` (a long index or a bool mask)."""
        return take_rows(self, index)

    def put(self, index: torch.Tensor, other: Canvas) -> Canvas:
        """A copy with the rows at ``index`` replaced by ``other``."""
        return put_rows(self, index, other)

    def repeat(self, times: int) -> Canvas:
        """Each row repeated ``times`` times, consecutively (row-major ``[rows, times]``)."""
        return map_rows(self, lambda tensor: tensor.repeat_interleave(times, dim=0))

    def blocks(self, layout: Layout) -> torch.Tensor:
        """``[R or 1, T]`` the block of each column (``-1`` for prompt columns): the layout's, shifted where a
        row's blocks are (:attr:`block_shift`)."""
        if not bool(self.block_shift.any()):
            return layout.block_of_column(self.tokens.device)[None, :]
        columns = torch.arange(self.tokens.shape[1], device=self.tokens.device)[None, :] - layout.gen_start
        return torch.where(columns >= 0, (columns + self.block_shift[:, None]) // layout.block_length, -1)

    def block_start(self, layout: Layout, block: torch.Tensor | None = None) -> torch.Tensor:
        """``[R]`` the first column of each row's block ``block`` (by default its current one)."""
        return layout.block_start(self.block if block is None else block) - self.block_shift

    def last_block(self, layout: Layout) -> torch.Tensor:
        """``[R]`` each row's last block of the layout (a shifted row's grid holds one more)."""
        return (layout.gen_length - 1 + self.block_shift) // layout.block_length

    def unlocked(self, layout: Layout) -> torch.Tensor:
        """``[R, T]`` columns of blocks ``0..block`` (the prompt excluded)."""
        blocks = self.blocks(layout)
        return (blocks >= 0) & (blocks <= self.block[:, None])

    def masks_left(self, layout: Layout, block: torch.Tensor, whole_prefix: bool = False) -> torch.Tensor:
        """``[R]`` masks left in each row's block ``block`` (``whole_prefix``: in blocks ``0..block``,
        Saber's rule); a block is full when this is 0 (the one definition advancing and revising share)."""
        blocks = self.blocks(layout)
        counted = (blocks >= 0) & (blocks <= block[:, None]) if whole_prefix else blocks == block[:, None]
        return (self.masked & counted).sum(dim=1)

    def window(self, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """First and end column of the blocks being decoded: from the earliest block that still
        holds a mask (fast block diffusion may leave some behind) to the end of the current one."""
        blocks = self.blocks(layout)
        pending = torch.where(self.masked, blocks, layout.num_blocks + 1).min(dim=1).values
        earliest = torch.minimum(pending, self.block)
        return self.block_start(layout, earliest), self.block_start(layout, self.block + 1)

    def in_current_block(self, layout: Layout) -> torch.Tensor:
        """``[R, T]`` columns of each row's current block."""
        return self.blocks(layout) == self.block[:, None]

    def commit(
        self,
        chosen: torch.Tensor,
        proposal: torch.Tensor,
        confidence: torch.Tensor,
        call: torch.Tensor,
        depth: int | torch.Tensor,
        branch: int | torch.Tensor,
        layout: Layout,
        rule: BlockRule = FULL_BLOCKS,
        advance: bool = True,
    ) -> Canvas:
        """Write ``proposal`` where ``chosen`` (masked positions only), then advance blocks by
        ``rule`` (:meth:`advance_blocks`).

        Args:
            chosen: ``[R, T]`` bool, the positions to commit (unmasked ones are left alone).
            proposal: ``[R, T]`` long, the tokens to write there.
            confidence: ``[R, T]`` float, their confidences (recorded as ``commit_confidence``).
            call: ``[R]`` long, each row's model-call count (recorded as ``commit_call``).
            depth: the lookahead depth that produced the commit (one for all rows, or ``[R]``).
            branch: the lookahead branch that produced it (one for all rows, or ``[R]``).
            layout: the decode's layout (where the blocks are).
            rule: when a row leaves its block.
            advance: False leaves the blocks for the caller (a revision acts first).
        """
        chosen = chosen & self.masked
        depth = torch.as_tensor(depth, device=chosen.device).expand(self.rows)
        branch = torch.as_tensor(branch, device=chosen.device).expand(self.rows)
        canvas = Canvas(
            tokens=torch.where(chosen, proposal, self.tokens),
            attention=self.attention,
            masked=self.masked & ~chosen,
            block=self.block,
            block_round=self.block_round + 1,
            commit_call=torch.where(chosen, call[:, None], self.commit_call),
            commit_confidence=torch.where(chosen, confidence, self.commit_confidence),
            commit_depth=torch.where(chosen, depth[:, None], self.commit_depth),
            commit_branch=torch.where(chosen, branch[:, None], self.commit_branch),
            revisions=self.revisions,
            held=self.held,
            post_steps=self.post_steps,
            length_phase=self.length_phase,
            block_shift=self.block_shift,
        )
        return canvas.advance_blocks(layout, rule) if advance else canvas

    def decide_block(
        self,
        keep: torch.Tensor,
        finished: torch.Tensor,
        proposal: torch.Tensor,
        confidence: torch.Tensor,
        call: torch.Tensor,
        layout: Layout,
        rule: BlockRule,
        mask_id: int,
        depth: int | torch.Tensor = 0,
        branch: int | torch.Tensor = -1,
        advance: bool = True,
    ) -> Canvas:
        """The current block decided whole (a step of a model without a mask token). Positions in ``keep`` take
        ``proposal`` (committed at ``call``, recorded at lookahead ``depth`` and ``branch``, as
        :meth:`commit` records them); every other position of the block is open again
        (``mask_id``; its noise is drawn at the model boundary), a kept one counted as a revision
        (a given first canvas, ``initial_canvas``, is re-decided too: it is only the first step's
        input). A block stays held (:attr:`held`) until ``finished``: all kept
        is not finished, the next step decides it again. Then finished blocks advance by ``rule``
        (``advance=False``: a lookahead branch, which stops at the canvas it finished).

        Args:
            keep: ``[R, T]`` bool, the positions kept this step.
            finished: ``[R]`` bool, rows whose block is final (all of it kept, as its draft).
            proposal: ``[R, T]`` long, the tokens they take.
            confidence: ``[R, T]`` float, their confidences (recorded as ``commit_confidence``).
            call: ``[R]`` long, each row's model-call count (recorded as ``commit_call``).
            layout: the decode's layout.
            rule: when a row leaves its block.
            mask_id: the id that marks an open position.
            depth: the lookahead depth of the step (one for all rows, or ``[R]``; 0: the base rule).
            branch: its lookahead branch (one for all rows, or ``[R]``; -1: the base rule).
            advance: False leaves finished blocks where they are (a branch never enters the next canvas).
        """
        block = self.in_current_block(layout) & self.attention
        keep = keep & block
        reopen = block & ~keep
        depth = torch.as_tensor(depth, device=keep.device).expand(self.rows)[:, None]
        branch = torch.as_tensor(branch, device=keep.device).expand(self.rows)[:, None]
        canvas = attrs.evolve(
            self,
            tokens=torch.where(keep, proposal, torch.where(reopen, mask_id, self.tokens)),
            masked=(self.masked & ~block) | reopen,
            block_round=self.block_round + 1,
            commit_call=torch.where(keep, call[:, None], torch.where(reopen, -1, self.commit_call)),
            commit_confidence=torch.where(keep, confidence, self.commit_confidence),
            commit_depth=torch.where(keep, depth, torch.where(reopen, -1, self.commit_depth)),
            commit_branch=torch.where(keep, branch, torch.where(block, -1, self.commit_branch)),
            revisions=self.revisions + (reopen & ~self.masked).long(),
            held=~finished,
        )
        return canvas.advance_blocks(layout, rule) if advance else canvas

    def block_finished(self, layout: Layout) -> torch.Tensor:
        """``[R]`` rows whose current block is final: no open position left in it and not held
        (a whole-block step: the step that finished it took its draft)."""
        return (self.masks_left(layout, self.block) == 0) & ~self.held

    def remask(self, positions: torch.Tensor, mask_id: int) -> Canvas:
        """Return committed ``positions`` to the mask (a revision), counting it; blocks never move
        back. ``commit_confidence`` keeps the confidence of the last commit (Saber's ψ is never cleared)."""
        positions = positions & ~self.masked & (self.commit_call >= 0)  # given tokens are never revised
        return attrs.evolve(
            self,
            tokens=torch.where(positions, mask_id, self.tokens),
            masked=self.masked | positions,
            commit_call=torch.where(positions, -1, self.commit_call),
            commit_depth=torch.where(positions, -1, self.commit_depth),
            commit_branch=torch.where(positions, -1, self.commit_branch),
            revisions=self.revisions + positions.long(),
        )

    def rewrite(
        self,
        positions: torch.Tensor,
        proposal: torch.Tensor,
        confidence: torch.Tensor,
        call: torch.Tensor,
        held: torch.Tensor,
        post_steps: torch.Tensor,
    ) -> Canvas:
        """Replace committed ``positions`` by ``proposal`` (a revision that writes a token, not a mask:
        LLaDA2.1's editing), counted as revisions and recorded as commits of ``call``; given
        tokens are never rewritten.

        Args:
            positions: ``[R, T]`` bool, the committed positions to rewrite.
            proposal: ``[R, T]`` long, the tokens to write there.
            confidence: ``[R, T]`` float, their confidences (recorded as ``commit_confidence``).
            call: ``[R]`` long, each row's model-call count (recorded as ``commit_call``).
            held: ``[R]`` bool, the rows' new block hold (:attr:`held`: LLaDA2.1's review).
            post_steps: ``[R]`` long, the rows' new count of editing rounds (:attr:`post_steps`).
        """
        positions = positions & ~self.masked & (self.commit_call >= 0)
        return attrs.evolve(
            self,
            tokens=torch.where(positions, proposal, self.tokens),
            commit_call=torch.where(positions, call[:, None], self.commit_call),
            commit_confidence=torch.where(positions, confidence, self.commit_confidence),
            revisions=self.revisions + positions.long(),
            held=held,
            post_steps=post_steps,
        )

    def advance_blocks(self, layout: Layout, rule: BlockRule = FULL_BLOCKS) -> Canvas:
        """Move rows to their next block when the current one is full (no mask left; with
        ``rule.whole_prefix``, none before its end: Saber), or when they have used
        ``rule.block_budget`` rounds there (fast block diffusion); with ``rule.holds_block`` (rules
        that revise: RCR, ReMDM) only once the budget is spent. The last block never moves."""
        block, block_round, post_steps = self.block, self.block_round, self.post_steps
        budget = rule.block_budget
        last = self.last_block(layout)
        for _ in range(layout.num_blocks + 1):
            remaining = self.masks_left(layout, block, rule.whole_prefix)
            spent = block_round >= budget if budget is not None else torch.zeros_like(remaining, dtype=torch.bool)
            full = (remaining == 0) & ~torch.tensor(rule.holds_block and budget is not None)
            move = (full | spent) & ~self.held & (block < last)
            if not bool(move.any()):
                break
            block = block + move.long()
            block_round = torch.where(move, 0, block_round)
            post_steps = torch.where(move, 0, post_steps)
        return attrs.evolve(self, block=block, block_round=block_round, post_steps=post_steps)


ABSENT = -1  # in a generation template: no column (the right padding of a shorter block-aligned row)


def aligned_generation_length(gen_length: int, block: int) -> int:
    """The generation columns of a block-aligned canvas: the longest region a prompt of any length
    needs (a partial last prompt block of ``block - 1`` tokens plus ``gen_length``, rounded up to
    whole blocks), so the layout does not depend on the batch."""
    return -(-(block - 1 + gen_length) // block) * block


def block_aligned(
    prompt: torch.Tensor, generation: torch.Tensor, block: int, mask_id: int
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """A request laid out on block-diffusion blocks: the prompt's whole blocks; the generation
    template (the partial last block's prompt tokens, then ``generation``, then masks to the end of
    the last block, then :data:`ABSENT` up to :func:`aligned_generation_length`); and the columns of
    that template that are the sample's output (after the prompt's tokens, to the end of its last block)."""
    tail = len(prompt) % block
    region = -(-(tail + len(generation)) // block) * block
    width = aligned_generation_length(len(generation), block)
    template = torch.cat(
        [
            prompt[len(prompt) - tail :],
            generation,
            torch.full((region - tail - len(generation),), mask_id, dtype=torch.long),
            torch.full((width - region,), ABSENT, dtype=torch.long),
        ]
    )
    return prompt[: len(prompt) - tail], template, (tail, region)


def initial_canvas(
    prompts: list[torch.Tensor], generation: list[torch.Tensor], layout: Layout, mask_id: int, pad_id: int
) -> Canvas:
    """Left-pad prompts to ``layout.gen_start`` and append each row's generation region.

    ``generation`` rows hold ``mask_id`` where the decoder must fill in and fixed tokens
    elsewhere (Sudoku clues, a block-aligned prompt's last tokens); fixed tokens are never
    changed; :data:`ABSENT` columns are padding (no token).
    """
    rows = len(prompts)
    tokens = torch.full((rows, layout.width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, layout.width), dtype=torch.bool)
    for row, (prompt, gen) in enumerate(zip(prompts, generation)):
        start = layout.gen_start - len(prompt)
        tokens[row, start : layout.gen_start] = prompt
        tokens[row, layout.gen_start :] = gen
        attention[row, start:] = True
    absent = tokens == ABSENT
    tokens, attention = torch.where(absent, pad_id, tokens), attention & ~absent
    masked = torch.zeros_like(attention)
    masked[:, layout.gen_start :] = (tokens[:, layout.gen_start :] == mask_id) & attention[:, layout.gen_start :]
    zeros = torch.zeros(rows, dtype=torch.long)
    canvas = Canvas(
        tokens=tokens,
        attention=attention,
        masked=masked,
        block=zeros,
        block_round=zeros,
        commit_call=torch.full_like(tokens, -1),
        commit_confidence=torch.zeros(tokens.shape),
        commit_depth=torch.full_like(tokens, -1),
        commit_branch=torch.full_like(tokens, -1),
        revisions=torch.zeros_like(tokens),
        held=torch.zeros(rows, dtype=torch.bool),
        post_steps=zeros,
        length_phase=zeros,
        block_shift=zeros,
    )
    return canvas.advance_blocks(layout)
