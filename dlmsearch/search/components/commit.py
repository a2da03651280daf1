"""Base commit rules: which masked positions a step writes, given one evaluation.

Every decoder builds on one of these; lookahead only changes which state they act on. A rule
also says how blocks advance (``block_budget``: rounds per block before moving on, ``None`` =
stay until the block is full). All rules are vectorised over rows.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.core.temperature import COMMIT_RULE, TemperatureOwner
from dlmsearch.search.components.bound import with_layout
from dlmsearch.search.records.state import BlockRule, Canvas, Evaluation, Layout
from dlmsearch.validation import check_choice, check_type, number

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
    in one forward): its ``row_options``, none where it declares none."""
    return getattr(rule, "row_options", ())


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


class CommitRule(BlockRule, Protocol):
    """Which positions to commit, and (its :class:`BlockRule` fields) when a row leaves its block."""

    statistics: frozenset[str]

    def bind(self, layout: Layout) -> CommitRule:
        """The rule for this canvas layout (checked; a bound copy where it counts steps per block): the decode plan's, never written."""

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[R, T]`` bool: the positions to commit this step (masked ones only)."""


@attrs.define
class _FixedSteps:
    """Schedules with a fixed number of ``steps``, split evenly over the blocks, ranking by
    ``ordering``; ``alg_temp`` > 0 draws the step's positions ∝ ``softmax(score / alg_temp)``
    instead of taking the best (Dream's ``alg_temp``; seeded by the evaluation's uniforms)."""

    steps: int = number(int, 1)
    ordering: str = attrs.field(default="confidence", validator=check_choice(*ORDERINGS))
    alg_temp: float = number(float, 0.0, default=0.0)
    block_budget: int | None = attrs.field(init=False, default=None)
    holds_block: ClassVar[bool] = False
    whole_prefix: ClassVar[bool] = False
    redecides: ClassVar[bool] = False

    @property
    def statistics(self) -> frozenset[str]:
        return statistics_for(self.ordering) | ({"uniform"} if self.alg_temp > 0 else set())

    def bind(self, layout: Layout) -> _FixedSteps:
        if self.steps % layout.num_blocks:
            raise ValueError(
                f"decoder.commit.steps={self.steps} must be a multiple of the number of blocks ({layout.num_blocks})"
            )
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


class _UntilBlockFull:
    """Rules that stay in a block until it is full and read only the confidence."""

    statistics: ClassVar[frozenset[str]] = frozenset()
    block_budget: ClassVar[None] = None
    holds_block: ClassVar[bool] = False
    whole_prefix: ClassVar[bool] = False
    redecides: ClassVar[bool] = False

    def bind(self, layout: Layout) -> _UntilBlockFull:
        return self


@attrs.define
class ThresholdRule(_UntilBlockFull):
    """Fast-dLLM: commit every masked position of the current block with ``c >= threshold``,
    and always at least the most confident one."""

    threshold: float = number(float, 0.0, 1.0, default=0.9)
    row_options: ClassVar[tuple[str, ...]] = ("threshold",)

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        eligible = canvas.masked & canvas.in_current_block(layout)
        chosen = eligible & (evaluation.confidence >= self.threshold)
        return at_least_one(chosen, ordering_scores(evaluation, "confidence"), canvas, layout)


@attrs.define
class FactorRule(_UntilBlockFull):
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
class FastBlockRule:
    """Fast block diffusion sampling (the base of ETE and AdaLook): each block gets ``budget``
    steps, then the decoder moves on; every step commits ``c >= threshold`` in all unlocked
    blocks (earlier unfinished blocks included), and at least the current block's best."""

    budget: int = number(int, 1, default=8)
    threshold: float = number(float, 0.0, 1.0, default=0.9)
    row_options: ClassVar[tuple[str, ...]] = ("threshold",)
    statistics: ClassVar[frozenset[str]] = frozenset()
    holds_block: ClassVar[bool] = False
    whole_prefix: ClassVar[bool] = False
    redecides: ClassVar[bool] = False

    @property
    def block_budget(self) -> int:
        return self.budget

    def bind(self, layout: Layout) -> FastBlockRule:
        return self

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
class EntropyBudget(_UntilBlockFull):
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
class FillBlock:
    """RCR's commit (pairs with :class:`~dlmsearch.search.components.revision.RunningConfidence`): every step
    commits every masked position up to the end of the current block, for exactly
    ``max(1, steps // blocks)`` steps per block; the revision then re-masks back to the schedule."""

    steps: int = number(int, 1)
    statistics: ClassVar[frozenset[str]] = frozenset()
    holds_block: ClassVar[bool] = True
    whole_prefix: ClassVar[bool] = False
    redecides: ClassVar[bool] = False
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
class ReMDMSchedule:
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
    statistics: ClassVar[frozenset[str]] = frozenset()
    holds_block: ClassVar[bool] = True
    whole_prefix: ClassVar[bool] = False
    redecides: ClassVar[bool] = False
    block_budget: int | None = attrs.field(init=False, default=None)
    plain: int = attrs.field(init=False, default=1)

    def bind(self, layout: Layout) -> ReMDMSchedule:
        if self.steps % layout.num_blocks:
            raise ValueError(
                f"decoder.commit.steps={self.steps} must be a multiple of the number of blocks ({layout.num_blocks})"
            )
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
class MeanConfidenceRule(_UntilBlockFull):
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


def load_token_frequencies(path: str | None) -> tuple[torch.Tensor, float]:
    """A token-frequency prior ``(frequency per id, the frequency of an unseen id)`` from a file in
    PC-Sampler's format (``{"num_token": N, "p_baseline_dict": {"id": count}}``). None: no prior,
    every token alike at ``1/e``, so that ``-ln f = 1`` and the score is the position-weighted confidence."""
    if path is None:
        return torch.zeros(0), math.exp(-1.0)
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"decoder.commit.frequencies={path}: no such file (a token-frequency table in PC-Sampler's format)"
        )
    data = json.loads(file.read_text())
    try:
        total, counts = float(data["num_token"]), {int(k): float(v) for k, v in data["p_baseline_dict"].items()}
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"decoder.commit.frequencies={path}: expected {{'num_token': N, 'p_baseline_dict': {{id: count}}}} ({error})"
        ) from error
    table = torch.full((max(counts, default=-1) + 1,), 1.0 / total)
    if counts:
        table[torch.tensor(list(counts))] = torch.tensor(list(counts.values())) / total
    return table, 1.0 / total


@attrs.define
class PositionCalibratedRule(LowConfidenceSchedule):
    """PC-Sampler (Huang et al., arXiv 2508.13021): LLaDA's schedule, ranking the current block's
    masked positions by ``exp(-decay * r) * min(-c * ln(f(token) + 1e-9), alpha)``, where ``r`` is
    the position within the block, ``decay`` the paper's lambda and ``f`` a token-frequency prior
    (``frequencies``: a file in PC-Sampler's format; unseen ids count as ``1 / total``; no file: no
    prior, the score is ``exp(-decay * r) * min(c, alpha)``): a tunable left-to-right drift that
    also defers frequent, trivial tokens."""

    decay: float = number(float, 0.0, default=0.25)
    alpha: float = number(float, 0.0, default=10.0)
    frequencies: str | None = attrs.field(default=None, validator=check_type(str, optional=True))
    prior: torch.Tensor = attrs.field(init=False, repr=False, factory=lambda: torch.zeros(0))
    unseen: float = attrs.field(init=False, default=1.0)

    def __attrs_post_init__(self) -> None:
        self.prior, self.unseen = load_token_frequencies(self.frequencies)

    def scores(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        token = evaluation.token
        frequency = torch.full(token.shape, self.unseen)
        if len(self.prior):
            known = token < len(self.prior)
            frequency = torch.where(known, self.prior[token.clamp(max=len(self.prior) - 1)], frequency)
        calibrated = torch.clamp(-evaluation.confidence * torch.log(frequency + 1e-9), max=self.alpha)
        offset = (torch.arange(token.shape[1])[None, :] - layout.block_start(canvas.block)[:, None]).float()
        return torch.exp(-self.decay * offset) * calibrated


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
class WideInRule(_UntilBlockFull):
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


SDAR_REMASKING = ("low_confidence_dynamic", "low_confidence_static", "sequential")


def even_split(block_length: int, steps: int, step: torch.Tensor) -> torch.Tensor:
    """``k_t`` of SDAR's ``get_num_transfer_tokens``: ``block_length`` split evenly over ``steps``,
    the first ``block_length mod steps`` steps one more; 0 past the last step."""
    base, extra = divmod(block_length, steps)
    return torch.where(step < steps, base + (step < extra).long(), 0)


@attrs.define
class BlockDiffusionSchedule(_UntilBlockFull):
    """SDAR's rules (``block_diffusion_generate`` of Gen-Verse/dLLM-RL ``10b4fd1``, Apache-2.0;
    JetAstra/SDAR's ``generate.py``): ``steps`` denoising steps per block, step ``t`` committing
    about ``k_t`` (:func:`even_split` of the block length, whatever the block's prompt tokens):

    * ``low_confidence_dynamic`` (SDAR's default; threshold ``τ`` 0.9 in SDAR's README, 0.85 in
      the script): every masked position of the block with ``c > τ`` if there are at least ``k_t``
      of them, else the ``k_t`` most confident;
    * ``low_confidence_static``: the ``k_t`` most confident masked positions;
    * ``sequential``: the ``k_t`` leftmost masked positions.

    The block moves on once it has no mask. Departures, both where the reference loop's
    ``topk`` over a block with fewer masks than ``k_t`` takes given positions (the prompt's tokens
    in its partial last block) and writes its draws over them: here only masked positions are
    ever committed; ties go to the lower column (``torch.topk``'s order is unspecified).
    """

    steps: int = number(int, 1, default=4)
    remasking: str = attrs.field(default="low_confidence_dynamic", validator=check_choice(*SDAR_REMASKING))
    threshold: float = number(float, 0.0, 1.0, default=0.9)
    row_options: ClassVar[tuple[str, ...]] = ("threshold",)

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        eligible = canvas.masked & canvas.in_current_block(layout)
        k = even_split(layout.block_length, self.steps, canvas.block_round)
        if self.remasking == "sequential":
            leftmost = -torch.arange(eligible.shape[1], dtype=evaluation.confidence.dtype).expand_as(eligible)
            return top_k_mask(leftmost, eligible, k)
        top = top_k_mask(evaluation.confidence, eligible, k)
        if self.remasking == "low_confidence_static":
            return top
        high = eligible & (evaluation.confidence > self.threshold)
        return torch.where((high.sum(dim=1) >= k)[:, None], high, top)


@attrs.define
class EntropyBoundedRule(_UntilBlockFull):
    """SDAR's ``entropy_bounded`` as its docs state it (JetAstra/SDAR ``generate.py``, MIT): order the
    block's masked positions by the entropy of their proposal distribution, ascending, and commit
    those whose running sum of entropies stays below ``gamma`` (``eb_threshold``, 0.35), at least one.

    Departs from the code on purpose: there the "entropy" is summed over the drawn tokens'
    probabilities of the whole block (``x0_p`` is ``[batch, block]``), so every position of a
    batch-1 block gets the same value and ``torch.sort``'s unspecified order decides; no token
    parity with it is expected (``algorithms.md``). Unlike :class:`EntropyBudget` (EB-Sampler:
    ``sum H - max H <= gamma``), the bound is on the plain sum.
    """

    gamma: float = number(float, 0.0, default=0.35)
    statistics: ClassVar[frozenset[str]] = frozenset({"entropy"})

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        assert evaluation.entropy is not None
        eligible = canvas.masked & canvas.in_current_block(layout)
        order = torch.sort(torch.where(eligible, evaluation.entropy, math.inf), dim=1, stable=True).indices
        running = torch.where(eligible, evaluation.entropy, 0.0).gather(1, order).cumsum(dim=1)
        count = ((running < self.gamma) & eligible.gather(1, order)).sum(dim=1)
        count = torch.minimum(count.clamp(min=1), eligible.sum(dim=1))
        return top_k_mask(-evaluation.entropy, eligible, count)


@attrs.define
class UniformNoiseSteps:
    """DiffusionGemma's denoising step (transformers ``generation_diffusion_gemma.py``, Apache-2.0:
    ``EntropyBoundSampler.accept_canvas``, ``LinearTemperatureScheduleLogitsProcessor``,
    ``StableAndConfidentStoppingCriteria``; ``algorithms.md``, "Uniform-noise diffusion").

    Every step re-decides the whole canvas (the current block; :meth:`Canvas.redecide`). Step
    ``n`` counts down from ``max_steps`` (``N``) at the canvas's first step; the engine samples
    every position at ``t = t_min + (t_max - t_min) * n / N`` (:meth:`temperature`, float32 as the
    reference computes it). **Keep-set (EB-Sampler over all positions):** sort the positions by
    the entropy ``H`` of their tempered distribution, ascending (ties: lower column first, a stable
    sort; the reference's ``torch.sort`` leaves them unspecified), and keep sorted position ``i``
    iff ``sum_{j<i} H_j <= entropy_bound``, so the lowest-entropy position is always kept. Kept
    positions take their new sample; every other one is re-noised, kept earlier or not.
    **Canvas end:** the canvas is finished with its draft (``argmax`` of the step's logits,
    not the sample) when it is stable (the draft repeated ``stability_threshold`` steps in a row,
    never at its first step) and confident (the mean entropy over the canvas below
    ``confidence_threshold``), or after ``N`` steps; ``stopping=false``: always ``N`` steps.
    """

    entropy_bound: float = number(float, 0.0, default=0.1, open_low=True)
    max_steps: int = number(int, 1, default=48)
    t_min: float = number(float, 0.0, default=0.4, open_low=True)
    t_max: float = number(float, 0.0, default=0.8, open_low=True)
    stopping: bool = attrs.field(default=True, validator=check_type(bool))
    stability_threshold: int = number(int, 0, default=1)
    confidence_threshold: float = number(float, 0.0, default=0.005)
    block_budget: int | None = attrs.field(init=False, default=None)
    statistics: ClassVar[frozenset[str]] = frozenset({"tempered_entropy", "draft", "draft_confidence", "repeats"})
    holds_block: ClassVar[bool] = False
    whole_prefix: ClassVar[bool] = False
    redecides: ClassVar[bool] = True

    def __attrs_post_init__(self) -> None:
        if self.t_max <= self.t_min:
            raise ValueError(
                f"decoder.commit.t_max={self.t_max} must be above t_min={self.t_min}: the temperature falls from "
                "t_max (a canvas's first step) to t_min (its last)"
            )

    def bind(self, layout: Layout) -> UniformNoiseSteps:
        """At most ``max_steps`` rounds per canvas (the plan's bound on a decode's rounds)."""
        return with_layout(self, block_budget=self.max_steps)

    def temperature(self, canvas: Canvas) -> torch.Tensor:
        """``[R]`` each row's temperature at its step ``n = N - rounds spent on the canvas``."""
        step = (self.max_steps - canvas.block_round).to(torch.int32)
        return self.t_min + (self.t_max - self.t_min) * (step / self.max_steps)

    @property
    def temperature_owner(self) -> TemperatureOwner:
        """The rule decides every row's temperature (:meth:`temperature`): the plan refuses one set elsewhere."""
        return TemperatureOwner(
            COMMIT_RULE,
            f"commit rule UniformNoiseSteps (schedule {self.t_max}→{self.t_min} over each canvas's steps)",
            f"{self.t_max}→{self.t_min}",
            "set decoder.commit.t_max and decoder.commit.t_min instead (the first and last step's)",
        )

    def select(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[R, T]`` the keep-set: the EB-Sampler's prefix of the current block by ascending entropy
        (``cumsum(H)_i - H_i <= bound``, the reference's float32 arithmetic)."""
        assert evaluation.tempered_entropy is not None
        columns = _block_columns(canvas, layout)
        ordered, order = torch.sort(evaluation.tempered_entropy.gather(1, columns), dim=1, stable=True)
        keep_sorted = ordered.cumsum(dim=1) - ordered <= self.entropy_bound
        keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
        return torch.zeros_like(canvas.masked).scatter(1, columns, keep)

    def finishes(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        """``[R]`` rows whose canvas ends this step: stable and confident, or its last step."""
        last = canvas.block_round + 1 >= self.max_steps
        if not self.stopping:
            return last
        assert evaluation.tempered_entropy is not None and evaluation.repeats is not None
        columns = _block_columns(canvas, layout)
        mean = evaluation.tempered_entropy.gather(1, columns).mean(dim=1)
        stable = evaluation.repeats.gather(1, columns[:, :1]).squeeze(1) >= self.stability_threshold
        return last | (stable & (mean < self.confidence_threshold))

    def redecide(
        self,
        canvas: Canvas,
        evaluation: Evaluation,
        layout: Layout,
        call: torch.Tensor,
        mask_id: int,
        also_keep: torch.Tensor | None = None,
        depth: int | torch.Tensor = 0,
        branch: int | torch.Tensor = -1,
        advance: bool = True,
    ) -> Canvas:
        """One step's update: the keep-set takes its samples and the rest is re-noised, or a
        finished canvas takes its draft whole, recorded with the draft's probability (and the row
        moves to the next canvas, unless ``advance`` is False: a lookahead branch stops there).

        Args:
            canvas: the rows.
            evaluation: their evaluations (samples, drafts and their probabilities, entropies, repeats).
            layout: the decode's layout.
            call: ``[R]`` each row's model-call count (recorded as the commits' call).
            mask_id: the open-position marker.
            also_keep: ``[R, T]`` positions kept beside the keep-set (a lookahead branch's candidate).
            depth: the lookahead depth of the step (0: the base rule on the root).
            branch: its lookahead branch (``[R]`` or one; -1: the base rule).
            advance: False keeps a finished canvas's row on it (a branch: only a root encodes a canvas).
        """
        assert evaluation.draft is not None and evaluation.draft_confidence is not None
        done = self.finishes(canvas, evaluation, layout)
        block = canvas.in_current_block(layout) & canvas.attention
        chosen = self.select(canvas, evaluation, layout)
        if also_keep is not None:
            chosen = chosen | (also_keep & block)
        keep = torch.where(done[:, None], block, chosen)
        token = torch.where(done[:, None], evaluation.draft.long(), evaluation.token)
        confidence = torch.where(done[:, None], evaluation.draft_confidence, evaluation.confidence)
        return canvas.redecide(keep, done, token, confidence, call, layout, self, mask_id, depth, branch, advance)


def _block_columns(canvas: Canvas, layout: Layout) -> torch.Tensor:
    """``[R, block_length]`` the columns of each row's current block."""
    return layout.block_start(canvas.block)[:, None] + torch.arange(layout.block_length)[None, :]
