"""The batched rollout engine: the only caller of the model.

It evaluates any flat set of rows (several samples, each with several hypotheses at any depth)
in one forward call, chunked to ``row_budget`` rows, and returns per-position summaries that the
components need, with what the call cost per row (:class:`~dlmsearch.search.records.usage.CallCost`).
Vocabulary-sized tensors live only inside a call. Rows belong to *slots* (one partial canvas
each: a sample's particle in a population search, else the sample itself); the engine keeps no
per-sample state: the caller hands it each slot's stores (:class:`SlotMemory`: key/value storage,
KLASS's history) and the sampling settings, and charges the cost to its own counters, so samples
can join and leave a decode between calls. A cache policy (``cache=``) decides which rows run
against stored keys and values. Rows of one group (a sample's particles at the same branch)
that hold the same canvas are forwarded once and count once. A forward that runs out of device
memory is split and retried (see ``RolloutEngine._forward``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext

import attrs
import torch

from dlmsearch.core.capabilities import ModelCapabilities
from dlmsearch.core.sampling import CONFIDENCE_SOURCES, Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.kv_storage import KVStorage
from dlmsearch.search.engine import statistics as statistics_registry
from dlmsearch.search.engine.adaptive.layer_rules import LayerCall
from dlmsearch.search.engine.cache_policy import BlockCache, CachePolicy, NoCache, cache_policy
from dlmsearch.search.engine.guidance import combine, unconditional
from dlmsearch.search.engine.host_memory import keep_freed_memory
from dlmsearch.search.engine.memory import auto_row_budget
from dlmsearch.search.engine.profile import ForwardProfile
from dlmsearch.search.engine.slot_memory import SlotMemory
from dlmsearch.search.engine.summaries import summarise_logits
from dlmsearch.search.records.randomness import Stream, hashed_uniform, is_root
from dlmsearch.search.records.state import Evaluation
from dlmsearch.search.records.usage import CallCost
from dlmsearch.validation import check_choice, check_type, number


@attrs.frozen
class Forward:
    """One model call's rows: their first real column, the columns summarised (a cached row: its
    own cache window), whether they run against the cache, which of them refresh it, and their
    cache windows."""

    rows: torch.Tensor
    first: int
    columns: tuple[int, int]
    cached: bool
    refresh: torch.Tensor
    query: torch.Tensor
    distinct: int | None = None  # rows to compute, where some rows repeat others (None: all of them)
    settled: torch.Tensor | None = (
        None  # [rows] a cached forward's refreshing rows: where their slot's exact store ends afterwards
    )
    logits_from: torch.Tensor | None = (
        None  # [rows] an exact store's cached forward: the first column whose logits are read (its window)
    )
    layerwise: bool = False  # a layerwise policy's forward (adaptive KV caches): the whole canvas, each layer recomputing what the policy selects


@attrs.frozen
class LayerwiseForward:
    """What a layerwise forward needs beyond its rows' tokens: the slots' stores, which rows write
    theirs back (a slot's own canvas), the policy and the generation's first column."""

    memory: SlotMemory
    slot: torch.Tensor
    root: torch.Tensor
    gen_start: int


_OUT_OF_MEMORY = tuple({torch.OutOfMemoryError, getattr(torch.cuda, "OutOfMemoryError", torch.OutOfMemoryError)})


def _out_of_memory(error: BaseException) -> bool:
    """CUDA's (and torch's) out-of-memory error, or a RuntimeError that says it ran out of memory."""
    return isinstance(error, _OUT_OF_MEMORY) or (isinstance(error, RuntimeError) and "out of memory" in str(error))


def _merged(tokens: torch.Tensor, group: torch.Tensor) -> torch.Tensor | None:
    """For every row, the first row of its group with the same tokens (None when no row repeats another)."""
    rows = len(tokens)
    if rows < 2:
        return None
    _, inverse = torch.unique(torch.cat([group[:, None], tokens], dim=1), dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), rows, dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(rows), "amin"
    )
    copy_of = first[inverse]
    return None if bool((copy_of == torch.arange(rows)).all()) else copy_of


def _within(index: torch.Tensor, copy_of: torch.Tensor | None) -> torch.Tensor:
    """For a forward's rows ``index`` (ascending): the position of the row each one copies, or
    its own where its original is not among them (a piece split off after running out of memory)."""
    own = torch.arange(len(index))
    if copy_of is None:
        return own
    original = copy_of[index]
    position = torch.searchsorted(index, original).clamp(max=len(index) - 1)
    return torch.where(index[position] == original, position, own)


def _check_budget(value: object) -> None:
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"row_budget must be a positive integer or auto, got {value!r}")


@attrs.define(eq=False)
class RolloutEngine:
    """Batched, chunked model evaluation with a cache policy; the model and the call machinery only."""

    adapter: ModelAdapter
    row_budget: int | str = attrs.field(
        default=64, validator=lambda _, a, v: _check_budget(v)
    )  # rows per forward, or "auto"
    # Sampling as the user sets it (None: not set, so the checkpoint's generation_config.json, else the decoder's own)
    temperature: float | None = number(float, 0.0, optional=True, default=None)
    top_p: float | None = number(float, 0.0, 1.0, optional=True, open_low=True, default=None)
    top_k: int | None = number(int, 1, optional=True, default=None)
    confidence: str | None = attrs.field(default=None, validator=check_choice(*CONFIDENCE_SOURCES, optional=True))
    seed: int = attrs.field(default=0, validator=check_type(int))
    cache: CachePolicy = attrs.field(
        factory=NoCache, converter=cache_policy
    )  # cache=none|prefix|dual (engine.cache=NAME: the same)
    compile: bool = attrs.field(
        default=False, validator=check_type(bool)
    )  # the model's per-token work under torch.compile, bucketed
    profile: ForwardProfile | None = attrs.field(default=None, eq=False)  # set: every forward is timed (benchmarks)
    budget: int | None = attrs.field(
        init=False, default=None
    )  # row budget lowered after running out of memory; None: row_budget
    auto_budget: int | None = attrs.field(
        init=False, default=None
    )  # row_budget=auto: what fits the device for this canvas
    auto_key: tuple[int, int] | None = attrs.field(
        init=False, default=None
    )  # the canvas shape auto_budget was estimated for
    regrow_after: int = attrs.field(init=False, default=20)  # successful forwards before a lowered budget doubles again
    successes: int = attrs.field(init=False, default=0)  # successful forwards since the budget last changed
    # A layerwise policy's cost beyond the counters: columns recomputed per layer, and the most its store held (bytes)
    layer_forwards: torch.Tensor | None = attrs.field(init=False, default=None, eq=False)
    store_peak_bytes: int = attrs.field(init=False, default=0)
    layer_columns: int = attrs.field(
        init=False, default=0
    )  # real columns of the canvases the layerwise forwards carried (a full forward's work per layer)

    @property
    def layerwise(self) -> bool:
        """The cache policy decides per layer inside the forward (dllm_cache, d2cache, elastic, dkv)."""
        return bool(getattr(self.cache, "layerwise", False))

    def layerwise_cost(self) -> dict[str, object]:
        """A layerwise policy's cost beyond the counters, for a run's summary (this process's decodes):
        the share of the forwarded canvases' columns each layer recomputed, and the most its store held
        (MiB); nothing for the other policies."""
        if self.layer_forwards is None:
            return {}
        share = (self.layer_forwards.double() / max(self.layer_columns, 1)).tolist()
        return {
            "layer_recompute_share": [round(s, 4) for s in share],
            "cache_store_peak_mb": round(self.store_peak_bytes / 2**20, 2),
        }

    def __attrs_post_init__(self) -> None:
        able = self.capabilities
        if self.layerwise:
            if not able.layerwise:
                if able.attention_block is not None:
                    raise ValueError(
                        f"cache={self.cache.name} recomputes stale keys and values of a full-attention model; this block-diffusion model "
                        f"(blocks of {able.attention_block}) has an exact cache instead, which needs no refresh: use cache=block (or cache=none)"
                    )
                raise ValueError(
                    f"cache={self.cache.name} runs the layerwise forward of the native LLaDA and Dream models; {able.name} cannot: use cache=none"
                )
            self.layer_forwards = torch.zeros(self.adapter.module.config.num_layers, dtype=torch.long)
        elif self.cache.name not in able.cache_policies:
            if able.attention_block is not None:
                raise ValueError(
                    f"cache={self.cache.name} is a full-attention model's cache; this block-diffusion model (blocks of "
                    f"{able.attention_block}) has an exact one: use cache=block (or cache=none)"
                )
            if self.cache.name == "block":
                raise ValueError(
                    f"cache=block is the exact cache of block-diffusion models (model=sdar); {able.name} attends to the whole canvas: use cache=none, prefix or dual"
                )
            raise ValueError(
                f"cache={self.cache.name} needs a model that can cache keys and values (the native LLaDA and Dream "
                f"models); {able.name} cannot: use cache=none"
            )
        if not str(self.adapter.device).startswith("cuda"):
            keep_freed_memory()  # vocabulary-sized tensors are reused instead of page-faulted in every forward
        if self.compile:
            if not able.compiles:
                raise ValueError(
                    f"engine.compile=true compiles the native LLaDA and Dream models' blocks; {able.name} has none: use engine.compile=false"
                )
            self.adapter.compile()

    @property
    def capabilities(self) -> ModelCapabilities:
        """What the model can do (cache policies, shadow block, logit shift, stop ids, vocabulary, compile)."""
        return self.adapter.capabilities

    @property
    def device(self) -> str:
        return self.adapter.device

    @property
    def mask_id(self) -> int:
        return self.adapter.mask_id

    @property
    def max_rows(self) -> int:
        """The configured rows per forward (``auto``: the estimate for the current canvas, 64 before the first call)."""
        if self.row_budget == "auto":
            return self.auto_budget or 64
        return int(self.row_budget)

    @property
    def current_budget(self) -> int:
        """Rows per forward now: ``row_budget``, or less after an out-of-memory error."""
        return self.max_rows if self.budget is None else min(self.budget, self.max_rows)

    @property
    def user_sampling(self) -> Sampling:
        """The sampling settings given to the engine itself (``engine.temperature``, ``top_p``, ``top_k``, ``confidence``)."""
        return Sampling(self.temperature, self.top_p, self.top_k, self.confidence)

    def sampling_over(self, decoder: Sampling) -> Sampling:
        """A decode's sampling: each setting the engine's own, else the checkpoint's
        ``generation_config.json``, else the decoder's (its reference loop's defaults: Dream's
        top-k 50), else neutral."""
        return self.user_sampling.over(self.adapter.generation_defaults).over(decoder).resolved()

    def memory(self, slots: int) -> SlotMemory:
        """Empty per-slot stores for a decode of ``slots`` slots."""
        return SlotMemory.for_slots(slots)

    def evaluate(
        self,
        tokens: torch.Tensor,
        attention: torch.Tensor,
        sample: torch.Tensor,
        sample_uid: torch.Tensor,
        row_key: torch.Tensor,
        call: torch.Tensor,
        memory: SlotMemory,
        sampling: Sampling,
        statistics: frozenset[str] = frozenset(),
        from_column: int = 0,
        window: tuple[torch.Tensor, torch.Tensor] | None = None,
        temperature: torch.Tensor | None = None,
        group: torch.Tensor | None = None,
        guidance: float = 0.0,
        write_only: bool = False,
        seed: torch.Tensor | None = None,
    ) -> tuple[Evaluation, CallCost]:
        """One model call for every row here: forward all rows, summarise per position.

        ``sample`` is each row's slot (its stores in ``memory``); ``sample_uid`` (a dataset-wide
        id), ``call`` (the model calls its sample has made before this one) and ``row_key`` (the
        row's branch within its sample; 0 = the sample's root) key the seeded randomness.
        ``sampling`` is the decode's resolved sampling settings. Only columns from
        ``from_column`` on (the generation region) are summarised: prompt logits are never
        computed where the model allows it, and read as the mask with confidence 0. ``window``
        (first and end column per row) is what the row is decoding; the cache policy decides
        which rows run against their slot's stored keys and values (only their columns are
        forwarded; columns outside them then read as the mask with confidence 0) and which
        refresh it. ``temperature`` (per row) overrides the decode's own for token sampling.
        Rows with equal ``group`` and the same tokens (particles of a sample that reached the
        same canvas) share one forward, counted once; each keeps its own draws. ``guidance`` > 0
        forwards each row's unconditional copy (prompt masked) in the same call and combines the
        logits (:mod:`~dlmsearch.search.engine.guidance`); the copies count as rows. Returns the
        summaries and what the call cost per row (the caller charges it to the samples).
        ``seed`` (per row; None: the engine's ``seed``) is the first key of the row's draws.

        With the block cache (``cache=block``, ``fuse_write=false``) a root row whose finished
        blocks are not stored yet first takes a forward of its own that writes them (the
        reference loops' prefill and ``store_kv`` forward; ``write_only``: that forward, whose
        summaries nobody reads): two model calls for that row, its draws keyed by the second.
        """
        statistics_registry.check(statistics)
        if isinstance(self.cache, BlockCache) and window is not None and not write_only:
            writes = self.cache.pending_writes(
                memory.kv, sample, attention.long().argmax(dim=1), window[0], is_root(row_key)
            )
            if bool(
                writes.any()
            ):  # the reference loops' separate forward that writes a finished block (or the prompt's whole blocks)
                at = writes.nonzero().squeeze(1)
                start = window[0][at]
                _, written = self.evaluate(
                    tokens[at],
                    attention[at],
                    sample[at],
                    sample_uid[at],
                    row_key[at],
                    call[at],
                    memory,
                    sampling,
                    frozenset(),
                    from_column,
                    (start, start),
                    None if temperature is None else temperature[at],
                    None,
                    0.0,
                    write_only=True,
                    seed=None if seed is None else seed[at],
                )
                evaluation, cost = self.evaluate(
                    tokens,
                    attention,
                    sample,
                    sample_uid,
                    row_key,
                    call + writes.long(),
                    memory,
                    sampling,
                    statistics,
                    from_column,
                    window,
                    temperature,
                    group,
                    guidance,
                    seed=seed,
                )
                return evaluation, CallCost(
                    rows=cost.rows.index_add(0, at, written.rows),
                    tokens=cost.tokens.index_add(0, at, written.tokens),
                    calls=cost.calls + writes.long(),
                )
        shadow_length = 0
        if (
            "verify" in statistics
        ):  # WINO: a shadow of the block being decoded, in the same forward (the plan checked the rest)
            assert window is not None, "the verify statistic needs the rows' windows"
            lengths = torch.unique(window[1] - window[0])
            if len(lengths) != 1:
                raise ValueError("the verify statistic needs every row to decode one block of the same length")
            shadow_length = int(lengths[0])
        if temperature is None and sampling.temperature > 0:
            temperature = torch.full((len(sample),), float(sampling.temperature))
        sampled = temperature is not None and bool((temperature > 0).any())
        rows, width = tokens.shape
        # Seeded draws only where something reads them: the ordering's (``uniform``) and the token samples'.
        uniform = draw = None
        if sampled or "uniform" in statistics:
            position = attention.long().cumsum(dim=1) - 1  # the row's own positions, whatever its padding
            keys = [
                torch.tensor(self.seed) if seed is None else seed[:, None],
                sample_uid[:, None],
                call[:, None],
                row_key[:, None],
                position,
            ]
            uniform = hashed_uniform(keys) if "uniform" in statistics else None
            draw = hashed_uniform(keys + [torch.tensor(Stream.TOKEN_SAMPLE)]) if sampled else None
        out = {
            "token": torch.full((rows, width), self.mask_id, dtype=torch.long),
            "confidence": torch.zeros(rows, width),
        }
        out.update({name: torch.zeros(rows, width) for name in statistics - {"uniform"}})
        row_cost, token_cost = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long)

        def run(
            forward: Forward,
        ) -> tuple[dict[str, torch.Tensor], list | None, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
            index, first = forward.rows, forward.first
            span, real = self._span(forward, attention[index])
            source = _within(
                index, None if forward.cached or shadow_length else copy_of
            )  # shadow rows are all computed
            computed = source == torch.arange(len(index))
            low, high = (forward.query[:, 0], forward.query[:, 1]) if forward.cached else forward.columns
            if forward.layerwise:
                cache = LayerwiseForward(memory, sample[index], is_root(row_key[index]), from_column)
            elif forward.cached:
                cache = (memory.kv, sample[index], forward.refresh if self.cache.exact else None, forward.logits_from)
            else:
                cache = None
            part, kv = self._summarise(
                tokens[index, first:],
                attention[index, first:],
                None if draw is None else draw[index[:, None], span],
                real,
                statistics,
                sample_uid[index],
                low - first,
                high - first,
                cache,
                sampling,
                None if temperature is None else temperature[index],
                None if bool(computed.all()) else source,
                from_column - first,
                guidance,
                (memory, sample[index], is_root(row_key[index])) if "kl" in statistics else None,
                (window[0][index] - first, shadow_length) if shadow_length else None,
            )
            if forward.layerwise:  # columns the policy did not bring up to date read as the mask
                read, _ = kv
                real = real & read
            return part, kv, computed, (span, real)

        if self.row_budget == "auto":
            key = (width - int(attention.long().argmax(dim=1).min()), width - from_column)
            if self.auto_key != key:  # estimated once per canvas shape
                self.auto_key = key
                self.auto_budget = auto_row_budget(
                    self.adapter.module,
                    self.adapter.device,
                    getattr(torch, self.adapter.dtype),
                    *key,
                    self.cache.stores,
                )
        copy_of = None if group is None else _merged(tokens, group)
        shifted = self.capabilities.shift_logits
        for planned in self._plan(attention, sample, row_key, from_column, window, memory.kv, copy_of):
            for forward, (part, kv, computed, (span, real)) in self._forward(planned, run, sample_uid):
                index = forward.rows
                written = real if forward.cached else torch.ones_like(real)  # a cached row: its own window only
                at = (index[:, None].expand_as(span)[written], span[written])
                for name, value in part.items():
                    out[name][at] = value[written]
                counted = index[computed]
                copies = 2 if guidance > 0 else 1  # a guided row is forwarded with its unconditional copy
                row_cost[counted] += copies
                if (
                    forward.layerwise
                ):  # the columns recomputed, summed over layers, in whole-canvas forwards' units (rounded up)
                    recomputed = kv[1][computed]
                    layers = recomputed.shape[1]
                    token_cost[counted] += (recomputed.sum(dim=1) + layers - 1) // layers
                    self.layer_forwards += recomputed.sum(dim=0)
                    self.layer_columns += int(attention[counted].sum())
                elif forward.cached:  # the window (one column earlier for a shifted model), and a shadow block
                    low, high = forward.query[computed, 0], forward.query[computed, 1]
                    token_cost[counted] += copies * (high - low + (shifted & (low > 0)).long()) + shadow_length
                else:  # a shadow block is part of its row: more token-forwards, not more rows
                    token_cost[counted] += copies * attention[counted].sum(dim=1) + shadow_length
                if forward.layerwise:
                    pass  # the policy's store was written by the forward itself
                elif (
                    forward.cached and forward.settled is not None
                ):  # the exact block cache: written in place by the forward itself
                    memory.kv.window_of[sample[index][forward.refresh], 1] = forward.settled[forward.refresh]
                elif forward.refresh.any():
                    keep = forward.refresh.nonzero().squeeze(1).to(kv[0][0].device)
                    memory.kv.store(
                        sample[index][forward.refresh],
                        forward.first,
                        [(k[keep], v[keep]) for k, v in kv],
                        forward.query[forward.refresh],
                        width,
                    )
        return Evaluation(uniform=uniform, **out), CallCost(
            rows=row_cost, tokens=token_cost, calls=torch.ones(rows, dtype=torch.long)
        )

    def _forward(
        self,
        forward: Forward,
        run: Callable[[Forward], tuple],
        sample_uid: torch.Tensor,
        planned_rows: int | None = None,
    ) -> Iterator[tuple[Forward, tuple]]:
        """Run one planned forward, yielding each piece that ran and its result.

        Out-of-memory back-off. When a forward of ``n`` rows runs out of memory (torch's or
        CUDA's OutOfMemoryError, or a RuntimeError saying "out of memory"), the CUDA cache is
        emptied and the forward is split into two of ``ceil(n / 2)`` and ``floor(n / 2)`` rows
        (same first column and window; each keeps its own rows' cache refreshes and windows),
        each retried the same way down to one row; a row that fails alone re-raises, naming its
        sample uid and the rows tried. Each failure lowers ``current_budget`` to ``ceil(n / 2)``
        for all later forwards (those already planned in this step are cut to it before they
        run); after ``regrow_after`` (20) successful forwards in a row the budget doubles, up to
        the configured ``row_budget`` (a budget that is still too large fails once more and halves
        again). Results do not change: a row's logits do not depend on its batch, and the
        counters count the logical step and its rows once, not the retries.
        """
        rows, budget = len(forward.rows), self.current_budget
        if (forward.distinct or rows) > budget:  # the budget dropped earlier in this step: no need to fail again first
            for start in range(0, rows, budget):
                yield from self._forward(self._piece(forward, slice(start, start + budget)), run, sample_uid)
            return
        try:
            result = run(forward)
        except RuntimeError as error:
            if not _out_of_memory(error):
                raise
            if rows == 1:
                uid = sorted(set(sample_uid[forward.rows].tolist()))
                raise torch.OutOfMemoryError(
                    f"out of memory forwarding a single row of sample uid(s) {uid} (split from a forward of "
                    f"{planned_rows or rows} row(s); row_budget={self.row_budget}{f' = {self.max_rows}' if self.row_budget == 'auto' else ''}): {error}"
                ) from error
        else:
            self._succeeded()
            yield forward, result
            return
        # Retried outside the except clause, so that the failed attempt's tensors (held by its traceback) are freed.
        half = (rows + 1) // 2
        self.budget, self.successes = min(self.current_budget, half), 0
        if str(self.adapter.device).startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()
        for part in (slice(0, half), slice(half, rows)):
            yield from self._forward(self._piece(forward, part), run, sample_uid, planned_rows or rows)

    @staticmethod
    def _piece(forward: Forward, part: slice) -> Forward:
        """Some of a forward's rows, with their cache refreshes and windows; same first column and columns."""
        settled = None if forward.settled is None else forward.settled[part]
        logits_from = None if forward.logits_from is None else forward.logits_from[part]
        return attrs.evolve(
            forward,
            rows=forward.rows[part],
            refresh=forward.refresh[part],
            query=forward.query[part],
            distinct=None,
            settled=settled,
            logits_from=logits_from,
        )

    @staticmethod
    def _span(forward: Forward, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The canvas columns a forward summarises per row ``[rows, columns]`` (a cached row's own
        window, left-aligned and clamped to the canvas; else the forward's columns), and which of
        them are real tokens of that row's window (only those are written)."""
        width = attention.shape[1]
        if forward.cached:
            low, high = forward.query[:, 0] if forward.logits_from is None else forward.logits_from, forward.query[:, 1]
            column = low[:, None] + torch.arange(int((high - low).max()))[None, :]
            inside = column.clamp(max=width - 1)
            return inside, attention.gather(1, inside) & (column < high[:, None])
        low, high = forward.columns
        return torch.arange(low, high).expand(len(forward.rows), -1), attention[:, low:high].bool()

    def _succeeded(self) -> None:
        """Count a successful forward; a lowered budget doubles after ``regrow_after`` of them in a row."""
        if self.budget is None:
            return
        self.successes += 1
        if self.successes >= self.regrow_after:
            self.budget, self.successes = 2 * self.budget, 0
            if self.budget >= self.max_rows:
                self.budget = None

    def _chunks(self, index: torch.Tensor, copy_of: torch.Tensor | None) -> Iterator[torch.Tensor]:
        """Rows ``index`` in chunks of at most ``current_budget`` distinct rows; rows that repeat
        another (``copy_of``) ride in their original's chunk, so merging never depends on chunking."""
        budget = self.current_budget
        if copy_of is None:
            for i in range(0, len(index), budget):
                yield index[i : i + budget]
            return
        original = copy_of[index]
        distinct = torch.unique(original)
        for i in range(0, len(distinct), budget):
            yield index[torch.isin(original, distinct[i : i + budget])]

    def _plan(
        self,
        attention: torch.Tensor,
        sample: torch.Tensor,
        row_key: torch.Tensor,
        from_column: int,
        window: tuple[torch.Tensor, torch.Tensor] | None,
        storage: KVStorage,
        copy_of: torch.Tensor | None = None,
    ) -> list[Forward]:
        """The forwards of one step: row chunks of at most ``current_budget`` rows.

        Columns that are padding in every row of a chunk are dropped, so a row costs the same
        alone or batched. A model that ignores the padding mask gets only rows of one prompt
        length per chunk, hence no padding at all: its results cannot depend on the batch.
        The cache policy names the rows that run against their slot's stored keys and values
        (forwarded together, each row its own columns) and, among the others (a full forward),
        those whose keys and values refresh their slot's storage. Rows that repeat another row
        (``copy_of``) travel with it.
        """
        rows, width = attention.shape
        first = attention.long().argmax(dim=1)  # first real column of each row
        if (
            self.layerwise and window is not None
        ):  # one forward of every row, each layer recomputing what the policy selects per row
            query = torch.stack(window, dim=1)
            no_refresh = torch.zeros(rows, dtype=torch.bool)
            return [
                Forward(part, 0, (from_column, width), True, no_refresh[part], query[part], layerwise=True)
                for part in self._chunks(torch.arange(rows), None)
            ]
        policy = self.cache if window is not None else NoCache()
        if isinstance(policy, BlockCache) and not storage.layers:  # filled by cached forwards alone
            storage.allocate(self.adapter.empty_kv(len(storage.window_of), width))
        query = (
            policy.columns(window[0], window[1], width, first, storage, sample)
            if window is not None
            else torch.zeros(rows, 2, dtype=torch.long)
        )
        hit = policy.hits(storage, sample, query)
        refreshes = policy.refreshes(hit, is_root(row_key))
        groups: list[tuple[torch.Tensor, bool]] = []
        full = (~hit).nonzero().squeeze(1)
        if self.capabilities.honours_padding:
            groups.append((full, False))
        else:
            groups += [(full[first[full] == f], False) for f in torch.unique(first[full]).tolist()]
        if bool(hit.any()):  # one forward for every cached row, whatever its window
            groups.append((hit.nonzero().squeeze(1), True))
        plan = []
        for index, cached in groups:
            for part in self._chunks(index, None if cached else copy_of):
                refresh = refreshes[part]
                distinct = None if cached or copy_of is None else len(torch.unique(copy_of[part]))
                start = 0 if cached else int(first[part].min())  # a cached row reads its whole canvas from the cache
                settled = policy.settled(window[0][part], query[part]) if cached and bool(refresh.any()) else None
                # an exact store: the columns before the window are forwarded only to be written (no logits)
                logits_from = (
                    torch.minimum(torch.maximum(query[part, 0], window[0][part]), query[part, 1])
                    if cached and policy.exact
                    else None
                )
                plan.append(
                    Forward(
                        part, start, (from_column, width), cached, refresh, query[part], distinct, settled, logits_from
                    )
                )
        return plan

    def _summarise(
        self,
        tokens: torch.Tensor,
        attention: torch.Tensor,
        draw: torch.Tensor | None,
        real: torch.Tensor,
        statistics: frozenset[str],
        uid: torch.Tensor,
        low: int | torch.Tensor,
        high: int | torch.Tensor,
        cache: tuple | None,  # (storage, slots, rows that may write in place, first column whose logits are read)
        sampling: Sampling,
        temperature: torch.Tensor | None = None,
        copy_of: torch.Tensor | None = None,
        prompt_end: int = 0,
        guidance: float = 0.0,
        history: tuple[SlotMemory, torch.Tensor, torch.Tensor] | None = None,
        shadow: tuple[torch.Tensor, int] | None = None,
    ) -> tuple[dict[str, torch.Tensor], list | None]:
        with self._timed("summary"):
            verify = None
            if shadow is not None:  # WINO: the block's shadow in the same forward (every row computed: no merging)
                with self._timed("model"):
                    starts = low if cache is not None else torch.full((len(tokens),), low)
                    logits, shadow_logits, kv = self.adapter.shadow_logits(
                        tokens, attention, starts, high, shadow[0], shadow[1], cache
                    )
                mirror = shadow[0][:, None] + torch.arange(shadow[1])[None, :]
                current = tokens.gather(1, mirror).to(logits.device)
                verified = (
                    torch.softmax(shadow_logits.double(), dim=-1).gather(-1, current[..., None]).squeeze(-1).float()
                )
                verify = torch.zeros(logits.shape[:2], device=logits.device).scatter(
                    1, (mirror - starts[:, None]).to(logits.device), verified
                )
            elif copy_of is None:
                logits, kv = self._model(tokens, attention, low, high, cache, prompt_end, guidance)
            else:  # rows that repeat an earlier row of their group: forward the distinct rows, then copy
                distinct = torch.unique(copy_of)
                logits, kv = self._model(tokens[distinct], attention[distinct], low, high, None, prompt_end, guidance)
                where = torch.searchsorted(distinct, copy_of).to(logits.device)
                logits = logits[where]
                kv = None if kv is None else [(k[where], v[where]) for k, v in kv]
            logits[..., self.adapter.never_proposed] = -math.inf  # a committed token can never be the mask
            summaries = summarise_logits(
                logits, sampling, temperature, draw, statistics_registry.of_distribution(statistics)
            )
            if verify is not None:
                summaries["verify"] = verify
            if (
                history is not None
            ):  # (the slots' memory, the rows' slots, which rows are roots); the columns start at the generation region
                summaries["kl"] = history[0].history.step(logits, history[1], low - prompt_end, history[2])
            token, confidence = summaries.pop("token"), summaries["confidence"]
            if self.adapter.deferred_ids:
                deferred = torch.isin(token, torch.tensor(self.adapter.deferred_ids, device=token.device))
                summaries["confidence"] = torch.where(deferred, 0.0, confidence)
            # One device-to-host transfer per forward: the tokens ride with the float summaries
            # (exact: token ids are below 2**24), so there is no per-row synchronisation.
            host = dict(zip(["token", *summaries], torch.stack([token.float(), *summaries.values()]).cpu().unbind(0)))
            bad = (host.pop("nan").bool() & real).any(dim=1)
            if bool(bad.any()):
                raise FloatingPointError(
                    f"model produced NaN logits for sample uid(s) {sorted(set(uid[bad].tolist()))}"
                )
            host["token"] = host["token"].long()
            return host, kv

    def _timed(self, part: str) -> AbstractContextManager[None]:
        """The profile's timer for ``part`` (``model`` or ``summary``), or nothing without a profile."""
        return nullcontext() if self.profile is None else self.profile.timing(part, self.adapter.device)

    def _model(
        self,
        tokens: torch.Tensor,
        attention: torch.Tensor,
        low: int | torch.Tensor,
        high: int | torch.Tensor,
        cache: tuple | None,
        prompt_end: int,
        guidance: float,
    ) -> tuple[torch.Tensor, list | None]:
        """The rows' logits: against the cache (each row its own window), or of the columns
        ``low:high`` (guided: each row beside its unconditional copy in the same call, combined;
        guidance never runs with a cache)."""
        if guidance > 0:
            rows = len(tokens)
            both = torch.cat([tokens, unconditional(tokens, attention, prompt_end, self.mask_id)])
            logits, _ = self._model(both, torch.cat([attention, attention]), low, high, None, prompt_end, 0.0)
            return combine(logits[:rows], logits[rows:], guidance), None
        with self._timed("model"):
            if isinstance(cache, LayerwiseForward):
                device = self.adapter.device
                return self._layerwise(tokens.to(device), attention.to(device), low.to(device), high.to(device), cache)
            if cache is not None:
                return self.adapter.cached_logits(tokens, attention, low, high, *cache), None
            return self.adapter.window_logits(tokens, attention, low, high)

    def _layerwise(
        self,
        tokens: torch.Tensor,
        attention: torch.Tensor,
        low: torch.Tensor,
        high: torch.Tensor,
        forward: LayerwiseForward,
    ) -> tuple[torch.Tensor, tuple]:
        """The rows' logits under a layerwise policy: each row computes on a copy of its slot's
        store; a slot's own canvas writes its copy back (a branch never does)."""
        module, store = self.adapter.module, forward.memory.layers
        call = LayerCall(
            tokens,
            attention.bool(),
            low,
            high,
            forward.gen_start,
            self.mask_id,
            self.capabilities.shift_logits,
            module.config,
        )
        self.cache.prepare(store, call, getattr(torch, self.adapter.dtype), self.adapter.device)
        fields = store.take(forward.slot)
        rule = self.cache.rule(fields, call)
        logits, read, recomputed = self.adapter.layerwise_logits(tokens, attention, low, high, rule)
        rule.finish(logits, read)
        self.store_peak_bytes = max(self.store_peak_bytes, store.nbytes + rule.extra_bytes)
        store.put(forward.slot, fields, forward.root)
        return logits, (read, recomputed)
