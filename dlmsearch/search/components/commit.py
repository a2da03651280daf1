"""Commit rules: what one step does to a canvas, given one evaluation.

Every decoder builds on one of these; lookahead only changes which state they act on. A rule takes
the whole step (:class:`CommitRule`: a root's step, a lookahead branch's first and later steps), so
the decode loop never asks which kind of rule it runs. The rules here fill masks
(:class:`MaskFilling`: a step commits the masked positions it selects);
:class:`~dlmsearch.search.components.uniform_noise_steps.UniformNoiseSteps` decides its whole block
each step. A rule also says how blocks advance (``block_budget``: rounds per block before moving on,
``None`` = stay until the block is full). All rules are vectorised over rows.
"""

from __future__ import annotations

import copy
import math
from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.core.temperature import TemperatureOwner
from dlmsearch.search.components.bound import with_layout
from dlmsearch.search.records.state import BlockRule, Canvas, Evaluation, Layout
from dlmsearch.validation import check_choice, number

ORDERINGS = ("confidence", "margin", "neg_entropy", "random")


def ordering_scores(evaluation: Evaluation, ordering: str) -> torch.Tensor:
    """Higher is committed first: probability, top1-top2 margin, negative entropy, or random;
    plus the evaluation's order noise where a population perturbs it."""
    if ordering == "confidence":
        scores = evaluation.confidence
    elif ordering == "margin":
        assert evaluation.margin is not None
        scores = evaluation.margin
    elif ordering == "neg_entropy":
        assert evaluation.entropy is not None
        scores = -evaluation.entropy
    else:
        assert evaluation.uniform is not None
        scores = evaluation.uniform
    return scores if evaluation.order_noise is None else scores + evaluation.order_noise


def sampled_order(
    scores: torch.Tensor, eligible: torch.Tensor, uniform: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Keys whose top k draw k eligible positions without replacement with probabilities
    ``softmax(scores / temperature)`` (Dream's ``alg_temp``): ``log softmax + Gumbel(uniform)``,
    the Gumbel-top-k trick (Kool et al., 2019); -inf where not eligible."""
    probs = torch.softmax(torch.where(eligible, scores / temperature, -math.inf), dim=1)
    gumbel = -torch.log(-torch.log(uniform.clamp(1e-12, 1 - 1e-7)))
    return torch.where(eligible, torch.log(probs) + gumbel, -math.inf)


def statistics_for(ordering: str) -> frozenset[str]:
    """What the engine must compute for an ordering (nothing else is drawn or summarised)."""
    return frozenset({"margin": {"margin"}, "neg_entropy": {"entropy"}, "random": {"uniform"}}.get(ordering, set()))


def steps_per_block(steps: int, layout: Layout) -> str:
    """The refusal of a number of steps the blocks cannot share evenly, with the next that they can."""
    blocks = layout.num_blocks
    return (
        f"decoder.commit.steps={steps} must be a multiple of the number of blocks ({blocks}): "
        f"use `decoder.commit.steps={-(-steps // blocks) * blocks}`"
    )


def top_k_mask(scores: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``[R, T]`` mask of each row's ``k[row]`` best eligible positions (ties: lower column).
    An eligible score of -inf still ranks above every ineligible position (as the most negative
    finite value), so a row gets its ``k`` whenever it has that many eligible positions."""
    ranked = torch.where(eligible, torch.where(scores == -math.inf, torch.finfo(scores.dtype).min, scores), -math.inf)
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1]).expand_as(order).contiguous())
    return (rank < k[:, None]) & eligible


def at_least_one(chosen: torch.Tensor, scores: torch.Tensor, canvas: Canvas, layout: Layout) -> torch.Tensor:
    """Add the best masked position of the current block (else of any unlocked block) to rows that chose none."""
    current = canvas.masked & canvas.in_current_block(layout)
    pool = torch.where(current.any(dim=1, keepdim=True), current, canvas.masked & canvas.unlocked(layout))
    best = top_k_mask(scores, pool, torch.ones(canvas.rows, dtype=torch.long))
    return chosen | (best & ~chosen.any(dim=1, keepdim=True))


def row_options(rule: CommitRule) -> tuple[str, ...]:
    """The rule's settings that may differ per row (a request's own threshold beside other requests
    in one forward): its ``row_options``."""
    return rule.row_options


def per_row(rule: CommitRule, values: dict[str, torch.Tensor], dtype: torch.dtype) -> CommitRule:
    """``rule`` reading each row's own value of its row options (``values``: name -> ``[R]`` float64,
    the exact numbers asked for) as a column ``[R, 1]`` that its comparisons broadcast over the row's
    positions. The column is in ``dtype``, the confidences' own, because that is how the number itself
    is compared (a Python number meets a tensor in the tensor's dtype), so a row decides exactly as
    alone. ``rule`` itself where every row holds the rule's own value."""
    differing = {name: column for name, column in values.items() if bool((column != getattr(rule, name)).any())}
    if not differing:
        return rule
    rowwise = copy.copy(rule)
    for name, column in differing.items():
        object.__setattr__(rowwise, name, column.to(dtype)[:, None])  # past the validator: checked values
    return rowwise


@attrs.frozen
class StepAt:
    """Where a step acts and how it records its commits: the layout, each row's model-call count, the
    lookahead depth and branch that produced them."""

    layout: Layout
    call: torch.Tensor  # [R] each row's model-call count (recorded as the commits' call)
    mask_id: int  # the open-position marker
    depth: int = 0  # the lookahead depth of the step (0: a root's)
    branch: int | torch.Tensor = -1  # its lookahead branch (one, or [R]; -1: a root's step)
    advance: bool = True  # False leaves the blocks for the caller (a revision acts first)


class CommitRule(BlockRule, Protocol):
    """One step of a canvas (a root's, a lookahead branch's), and (its :class:`BlockRule` fields) when a
    row leaves its block."""

    statistics: frozenset[str]
    row_options: tuple[str, ...]  # settings a row may hold its own value of (a request's threshold)
    # each step decides the current block whole (what it does not keep opens again), and holds the block until
    # a step finishes it: the answer then ends with the block that holds its end, drafted ids after it included
    decides_whole_block: bool
    temperature_owner: TemperatureOwner | None  # the temperature the rule samples at (None: the settings decide)

    def bind(self, layout: Layout) -> CommitRule:
        """The rule for this canvas layout (checked; a bound copy where it counts steps per block): the decode plan's, never written."""

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[R, T]`` bool: the positions the step decides (the masked ones it commits; the ones a whole-block step keeps)."""

    def prepare(self, canvas: Canvas) -> Canvas:
        """The canvases as the first step finds them."""

    def step(self, canvas: Canvas, evaluation: Evaluation, at: StepAt) -> tuple[Canvas, torch.Tensor]:
        """One step of the rows (a root's at depth 0, a lookahead branch's deeper), and ``[R, T]`` the positions it decided."""

    def open_branch(self, canvas: Canvas, evaluation: Evaluation, at: StepAt, candidate: torch.Tensor) -> Canvas:
        """A lookahead branch's first step, which decides its ``candidate`` position (``[R, T]``)."""

    def forced(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[R]`` rows whose next step is the same whatever a lookahead would commit (no lookahead there)."""

    def settled(self, canvas: Canvas, layout: Layout) -> torch.Tensor:
        """``[R]`` branches with nothing left to decide (a branch stops there)."""

    def move_on(self, canvas: Canvas, layout: Layout) -> tuple[Canvas, torch.Tensor]:
        """Adopted branches moved on from a block they finished (as a root's step moves it), and ``[R]`` which."""


class MaskFilling:
    """The step of every rule that fills masks: commit the masked positions :meth:`select` chooses, then
    advance the blocks; a lookahead branch opens by committing exactly its candidate. The defaults
    that rules override are here once: no statistics, no row options, no block budget, blocks move
    when full, nothing in the layout to bind, the settings decide the temperature."""

    statistics: ClassVar[frozenset[str]] = frozenset()
    row_options: ClassVar[tuple[str, ...]] = ()
    block_budget: ClassVar[int | None] = None
    holds_block: ClassVar[bool] = False
    whole_prefix: ClassVar[bool] = False
    decides_whole_block: ClassVar[bool] = False
    temperature_owner: ClassVar[TemperatureOwner | None] = None

    def bind(self, layout: Layout) -> MaskFilling:
        return self

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, canvas: Canvas) -> Canvas:
        return canvas

    def step(self, canvas: Canvas, evaluation: Evaluation, at: StepAt) -> tuple[Canvas, torch.Tensor]:
        """Commit the selected masked positions."""
        chosen = self.select(canvas, evaluation, at.layout) & canvas.masked
        return _committed(canvas, chosen, evaluation, at, self), chosen

    def open_branch(self, canvas: Canvas, evaluation: Evaluation, at: StepAt, candidate: torch.Tensor) -> Canvas:
        """Commit exactly the candidate."""
        return _committed(canvas, candidate, evaluation, at, self)

    def forced(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        return torch.zeros(canvas.rows, dtype=torch.bool)

    def settled(self, canvas: Canvas, layout: Layout) -> torch.Tensor:
        return ~canvas.masked.any(dim=1)

    def move_on(self, canvas: Canvas, layout: Layout) -> tuple[Canvas, torch.Tensor]:
        return canvas, torch.zeros(canvas.rows, dtype=torch.bool)


def _committed(canvas: Canvas, chosen: torch.Tensor, evaluation: Evaluation, at: StepAt, rule: BlockRule) -> Canvas:
    """``chosen`` committed with the evaluation's proposals, recorded as ``at`` says; blocks advance by ``rule``."""
    token, confidence = evaluation.token, evaluation.confidence
    return canvas.commit(chosen, token, confidence, at.call, at.depth, at.branch, at.layout, rule, at.advance)


@attrs.define
class _FixedSteps(MaskFilling):
    """Schedules with a fixed number of ``steps``, split evenly over the blocks, ranking by
    ``ordering``; ``alg_temp`` > 0 draws the step's positions ∝ ``softmax(score / alg_temp)``
    instead of taking the best (Dream's ``alg_temp``; seeded by the evaluation's uniforms)."""

    steps: int = number(int, 1)
    ordering: str = attrs.field(default="confidence", validator=check_choice(*ORDERINGS))
    alg_temp: float = number(float, 0.0, default=0.0)
    block_budget: int | None = attrs.field(init=False, default=None)

    @property
    def statistics(self) -> frozenset[str]:
        return statistics_for(self.ordering) | ({"uniform"} if self.alg_temp > 0 else set())

    def bind(self, layout: Layout) -> _FixedSteps:
        if self.steps % layout.num_blocks:
            raise ValueError(steps_per_block(self.steps, layout))
        return with_layout(self, block_budget=self.steps // layout.num_blocks)

    def ranking(self, canvas: Canvas, evaluation: Evaluation, eligible: torch.Tensor, layout: Layout) -> torch.Tensor:
        """What the step's top k are taken of: the ordering's scores, or their seeded draw at ``alg_temp``."""
        scores = self.scores(canvas, evaluation, layout)
        return scores if self.alg_temp == 0 else sampled_order(scores, eligible, evaluation.uniform, self.alg_temp)

    def scores(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """Higher is committed first (the ordering's scores)."""
        return ordering_scores(evaluation, self.ordering)


@attrs.define
class LowConfidenceSchedule(_FixedSteps):
    """LLaDA's schedule: ``steps`` split evenly over blocks; each step commits the top-k of the
    current block, k spread evenly over the block's steps with the remainder going first.

    k is computed as ``ceil(remaining / steps_left_in_block)``, which equals the reference's
    precomputed split. ``ordering=random`` gives random-order unmasking.
    """

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        assert self.block_budget is not None, "bind() the rule to a layout first"
        eligible = canvas.masked & canvas.in_current_block(layout)
        remaining = eligible.sum(dim=1)
        steps_left = (self.block_budget - canvas.block_round).clamp(min=1)
        k = (remaining + steps_left - 1) // steps_left
        return top_k_mask(self.ranking(canvas, evaluation, eligible, layout), eligible, k.clamp(min=1))


@attrs.define
class ThresholdRule(MaskFilling):
    """Fast-dLLM: commit every masked position of the current block with ``c >= threshold``,
    and always at least the most confident one."""

    threshold: float = number(float, 0.0, 1.0, default=0.9)
    row_options: ClassVar[tuple[str, ...]] = ("threshold",)

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        eligible = canvas.masked & canvas.in_current_block(layout)
        chosen = eligible & (evaluation.confidence >= self.threshold)
        return at_least_one(chosen, ordering_scores(evaluation, "confidence"), canvas, layout)


@attrs.define
class FactorRule(MaskFilling):
    """Fast-dLLM's factor rule: sort confidences descending; the r-th (1-based) is accepted
    while ``c_(r) >= 1 - factor / (r + 1)``; always at least one."""

    factor: float = number(float, 0.0, default=1.0)

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        eligible = canvas.masked & canvas.in_current_block(layout)
        ranked = torch.where(eligible, evaluation.confidence, -math.inf)
        ordered = torch.sort(ranked, dim=1, descending=True, stable=True).values
        rank = torch.arange(1, ordered.shape[1] + 1, dtype=ordered.dtype)
        accepted = (ordered >= 1 - self.factor / (rank + 1)).long().cumprod(dim=1).sum(dim=1)
        chosen = top_k_mask(evaluation.confidence, eligible, accepted)
        return at_least_one(chosen, ordering_scores(evaluation, "confidence"), canvas, layout)


@attrs.define
class FastBlockRule(MaskFilling):
    """Fast block diffusion sampling (the base of ETE and AdaLook): each block gets ``budget``
    steps, then the decoder moves on; every step commits ``c >= threshold`` in all unlocked
    blocks (earlier unfinished blocks included), and at least the current block's best."""

    budget: int = number(int, 1, default=8)
    threshold: float = number(float, 0.0, 1.0, default=0.9)
    row_options: ClassVar[tuple[str, ...]] = ("threshold",)

    @property
    def block_budget(self) -> int:
        return self.budget

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        chosen = canvas.masked & canvas.unlocked(layout) & (evaluation.confidence >= self.threshold)
        return at_least_one(chosen, ordering_scores(evaluation, "confidence"), canvas, layout)


@attrs.define
class DreamSchedule(_FixedSteps):
    """Dream's schedule: with ``t, s`` consecutive points of ``linspace(1, eps, steps + 1)``, step
    ``i`` commits ``floor(n_masked * (1 - s / t))`` positions (all that remain at the last step),
    ranked by ``ordering``: ``confidence`` (Dream's ``maskgit_plus``), ``margin``
    (``topk_margin``) or ``neg_entropy`` (``entropy``). A step may commit nothing, as upstream.

    Upstream decodes the whole generation as one block; with several blocks the steps are split
    evenly over them and the schedule restarts in each.
    """

    ordering: str = attrs.field(default="confidence", validator=check_choice("confidence", "margin", "neg_entropy"))
    eps: float = number(float, 0.0, 1.0, default=1e-3)

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        assert self.block_budget is not None, "bind() the rule to a layout first"
        eligible = canvas.masked & canvas.in_current_block(layout)
        remaining = eligible.sum(dim=1)
        timesteps = torch.linspace(1, self.eps, self.block_budget + 1)
        step = canvas.block_round.clamp(max=self.block_budget - 1)
        t, s = timesteps[step], timesteps[step + 1]
        # float32 arithmetic in upstream's order, truncated as its int() does
        k = (remaining.float() * (1 - s / t)).long()
        k = torch.where(step >= self.block_budget - 1, remaining, k)
        return top_k_mask(self.ranking(canvas, evaluation, eligible, layout), eligible, k)


@attrs.define
class EntropyBudget(MaskFilling):
    """EB-Sampler (Ben-Hamu et al., arXiv 2505.24857): order the current block's masked positions
    by an error proxy (``entropy`` ascending, or ``confidence`` / ``margin`` descending) and commit
    the longest prefix whose entropies satisfy ``sum H - max H <= gamma`` (the error bound of
    committing them together), at least one. ``gamma = 0``: one token per step."""

    gamma: float = number(float, 0.0, default=0.01)
    error_proxy: str = attrs.field(default="entropy", validator=check_choice("entropy", "confidence", "margin"))

    @property
    def statistics(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset({"entropy", "margin"} if self.error_proxy == "margin" else {"entropy"})

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        assert evaluation.entropy is not None
        eligible = canvas.masked & canvas.in_current_block(layout)
        scores = {"entropy": -evaluation.entropy, "confidence": evaluation.confidence, "margin": evaluation.margin}[
            self.error_proxy
        ]
        assert scores is not None
        order = torch.sort(torch.where(eligible, scores, -math.inf), dim=1, descending=True, stable=True).indices
        entropy = torch.where(eligible, evaluation.entropy, 0.0).gather(1, order)
        bound = entropy.cumsum(dim=1) - entropy.cummax(dim=1).values  # non-decreasing along the order
        within = (bound <= self.gamma) & eligible.gather(1, order)
        count = within.long().cumprod(dim=1).sum(dim=1).clamp(min=1)
        return top_k_mask(scores, eligible, count)


@attrs.define
class FillBlock(MaskFilling):
    """RCR's commit (pairs with :class:`~dlmsearch.search.components.revision.RunningConfidence`): every step
    commits every masked position up to the end of the current block, for exactly
    ``max(1, steps // blocks)`` steps per block; the revision then re-masks back to the schedule."""

    steps: int = number(int, 1)
    holds_block: ClassVar[bool] = True
    block_budget: int | None = attrs.field(init=False, default=None)

    def bind(self, layout: Layout) -> FillBlock:
        return with_layout(self, block_budget=max(1, self.steps // layout.num_blocks))

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        return canvas.masked & canvas.unlocked(layout)


def llada_split(positions: torch.Tensor, steps: int, step: torch.Tensor) -> torch.Tensor:
    """``[R]`` tokens LLaDA's schedule commits at ``step`` of ``steps`` for a block of ``positions``:
    ``floor(N / S)``, plus one in the first ``N mod S`` steps (``get_num_transfer_tokens``)."""
    return positions // steps + (step < positions % steps).long()


def remdm_loop_start(positions: torch.Tensor, plain: int, start_frac: float) -> torch.Tensor:
    """``[R]`` the block step at which ReMDM's loop begins: the first step after which LLaDA's
    split of a block's ``positions`` over ``plain`` steps has committed ``floor(start_frac * N)``
    (counted in tokens, so that given tokens do not shift it; at one token per step it is the
    authors' step ``floor(7B/8)``)."""
    base, extra = positions // plain, positions % plain
    done = torch.arange(plain + 1)[None, :]
    committed = done * base[:, None] + torch.minimum(done, extra[:, None])
    reached = committed >= torch.floor(start_frac * positions.float()).long()[:, None]
    return reached.long().argmax(dim=1)


REMDM_SCORE_BITS = 20  # ReMDM ranks confidences on a relative grid of 2^-20 (about 1e-6; 16 float32 ulps below 1)


def on_grid(scores: torch.Tensor, bits: int = REMDM_SCORE_BITS) -> torch.Tensor:
    """Scores rounded to ``bits`` significant bits: with ``x = m * 2^e`` (``m`` in [0.5, 1), ``frexp``),
    ``round(m * 2^bits) * 2^(e - bits)``, half to even; zero and non-finite scores unchanged. Every
    step is exact in the scores' own dtype, so equal inputs give equal grid values on any CPU, and
    the map never reverses an order (``x <= y`` gives ``on_grid(x) <= on_grid(y)``).

    The reason is ReMDM's ranking of confidences that saturate near 1, where commits one or two
    float32 ulps (6e-8) apart are common (the shipped Sudoku model: gaps of 0, 1.2e-7 and 2.4e-7
    between the chosen and the first rejected position). On the grid such near-ties are exact ties,
    which ``top_k_mask`` breaks by position (the earlier one): a rule, not the last bit. At 20 bits
    the grid chooses otherwise than the raw floats in about 1% of ReMDM's Sudoku decisions (a
    coarser one in a third or more). It does not make the confidences themselves the same on every
    CPU: the float32 softmax that computes them rounds by the CPU's vector width (one or two
    ulps), and a score that close to a grid boundary can still move."""
    mantissa, exponent = torch.frexp(scores)
    rounded = torch.ldexp(torch.round(torch.ldexp(mantissa, torch.tensor(bits))), exponent - bits)
    return torch.where(torch.isfinite(scores), rounded, scores)


def block_positions(canvas: Canvas, layout: Layout) -> torch.Tensor:
    """``[R]`` positions of each row's current block that are not given (committed by the model or still masked)."""
    return (canvas.in_current_block(layout) & ((canvas.commit_call >= 0) | canvas.masked)).sum(dim=1)


@attrs.define
class ReMDMSchedule(MaskFilling):
    """ReMDM's schedule for LLaDA (pairs with :class:`~dlmsearch.search.components.revision.LoopRemask`):
    each block gets ``S = steps / blocks`` plain steps (LLaDA's split, top-k by confidence) and,
    once ``floor(loop_start_frac * N)`` of its N positions are committed, ``loop_steps`` loop steps
    (None: ``S``, the authors' L = T = B) in which the ``k`` positions the revision re-masked
    before the step are committed again (top-k by confidence). Confidences are ranked on
    :func:`on_grid` (2^-20 relative), ties to the earlier position, so that a near-tie is decided
    by a rule, not by the last bit."""

    steps: int = number(int, 1)
    k: int = number(int, 1, default=1)
    loop_steps: int | None = number(int, 1, optional=True, default=None)
    loop_start_frac: float = number(float, 0.0, 1.0, default=0.875)
    holds_block: ClassVar[bool] = True
    block_budget: int | None = attrs.field(init=False, default=None)
    plain: int = attrs.field(init=False, default=1)

    def bind(self, layout: Layout) -> ReMDMSchedule:
        if self.steps % layout.num_blocks:
            raise ValueError(steps_per_block(self.steps, layout))
        plain = self.steps // layout.num_blocks
        return with_layout(self, plain=plain, block_budget=plain + (self.loop_steps or plain))

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        assert self.block_budget is not None, "bind() the rule to a layout first"
        loop = self.block_budget - self.plain
        positions = block_positions(canvas, layout)
        start = remdm_loop_start(positions, self.plain, self.loop_start_frac)
        step = canvas.block_round
        in_loop = (step >= start) & (step < start + loop)
        plain_step = torch.where(step < start, step, step - loop)
        k = torch.where(in_loop, self.k, llada_split(positions, self.plain, plain_step))
        eligible = canvas.masked & canvas.in_current_block(layout)
        return top_k_mask(on_grid(ordering_scores(evaluation, "confidence")), eligible, k)


@attrs.define
class MeanConfidenceRule(MaskFilling):
    """Saber's commit (Dong et al., arXiv 2510.18165; pairs with
    :class:`~dlmsearch.search.components.revision.ConfidenceDrop`): the threshold is the mean confidence at
    commit of every position committed so far (1 before the first); commit the masked positions
    up to the block end above it, and at least the ``n`` most confident (among those candidates:
    the authors' ``topk`` can take a committed position and overwrite its token, a defect kept
    out). A block is full only when no mask is left before its end (``whole_prefix``): positions
    that backtracking re-masked in earlier blocks hold the decode in the block, as in the authors'
    loop, which checks the whole prefix ``x[:, :block_end]``."""

    n: int = number(int, 1, default=2)
    whole_prefix: ClassVar[bool] = True

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        ever = ((canvas.commit_call >= 0) | (canvas.revisions > 0)) & (
            torch.arange(canvas.tokens.shape[1]) >= layout.gen_start
        )[None, :]
        total = torch.where(ever, canvas.commit_confidence, 0.0).sum(dim=1)
        count = ever.sum(dim=1)
        threshold = torch.where(count > 0, total / count.clamp(min=1), 1.0)
        candidates = canvas.masked & canvas.unlocked(layout)
        chosen = candidates & (evaluation.confidence > threshold[:, None])
        fewer = chosen.sum(dim=1) < self.n
        top = top_k_mask(evaluation.confidence, candidates, torch.full((canvas.rows,), self.n, dtype=torch.long))
        return torch.where(fewer[:, None], top, chosen)


@attrs.define
class StableConfidenceRule(_FixedSteps):
    """KLASS (Kim et al., arXiv 2511.05664): commit every masked position of the current block that
    is confident (``c > confidence``) and stable (its distribution's KL to the previous step's,
    this step's and the one before, below ``kl``), once the block has had a step; where none is
    ready, LLaDA's split of the block's masks over its ``steps / blocks`` steps, top-k by
    ``ordering`` (the authors' LLaDA code; H = 2, their value everywhere)."""

    confidence: float = number(float, 0.0, 1.0, default=0.9)
    kl: float = number(float, 0.0, default=0.01)

    @property
    def statistics(self) -> frozenset[str]:
        return statistics_for(self.ordering) | {"kl"}

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        assert self.block_budget is not None and evaluation.kl is not None, "bind() the rule to a layout first"
        eligible = canvas.masked & canvas.in_current_block(layout)
        ready = (
            eligible
            & (evaluation.confidence > self.confidence)
            & (evaluation.kl < self.kl)
            & (canvas.block_round >= 1)[:, None]
        )
        positions = block_positions(
            canvas, layout
        )  # the split is fixed at the block's start, as upstream precomputes it
        step = canvas.block_round
        k = llada_split(positions, self.block_budget, step)
        scheduled = top_k_mask(self.ranking(canvas, evaluation, eligible, layout), eligible, k)
        return torch.where(ready.any(dim=1, keepdim=True), ready, scheduled)


@attrs.define
class WideInRule(MaskFilling):
    """WINO's draft (Hong et al., arXiv 2507.18578; pairs with
    :class:`~dlmsearch.search.components.revision.NarrowOut`): commit the current block's masks with
    ``c > tau1``, at most ``min(max(floor(0.7 |M|), 5), 20)`` of them (the most confident), and the
    most confident one where none clears ``tau1``. Asks the engine for ``verify`` (the shadow block)."""

    tau1: float = number(float, 0.0, 1.0, default=0.7)
    statistics: ClassVar[frozenset[str]] = frozenset({"verify"})

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        eligible = canvas.masked & canvas.in_current_block(layout)
        wide = eligible & (evaluation.confidence > self.tau1)
        cap = torch.clamp(torch.floor(0.7 * eligible.sum(dim=1).float()).long(), min=5, max=20)
        capped = top_k_mask(evaluation.confidence, wide, cap)
        return at_least_one(capped, ordering_scores(evaluation, "confidence"), canvas, layout)
