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

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext

import attrs
import torch

from dlmsearch.core.capabilities import ModelCapabilities
from dlmsearch.core.sampling import CONFIDENCE_SOURCES, Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.group_decisions import GroupDecisions
from dlmsearch.models.kv_storage import CachedRows
from dlmsearch.search.engine import statistics as statistics_registry
from dlmsearch.search.engine import uniform_noise
from dlmsearch.search.engine.adaptive.layer_rules import LayerCall
from dlmsearch.search.engine.cache_policy import CachePolicy, ModelsExact, NoCache, RowWindows, cache_policy
from dlmsearch.search.engine.guidance import combine, unconditional
from dlmsearch.search.engine.host_memory import keep_freed_memory
from dlmsearch.search.engine.memory import auto_row_budget
from dlmsearch.search.engine.profile import ForwardProfile
from dlmsearch.search.engine.slot_memory import SlotMemory
from dlmsearch.search.engine.summaries import summarise_logits
from dlmsearch.search.records.randomness import Stream, hashed_uniform, is_root
from dlmsearch.search.records.row_sampling import RowSampling
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
    """What a layerwise forward needs beyond its rows' tokens: the slots' stores, each row's slot
    and the generation's first column (which rows write their stores back: :meth:`RolloutEngine._store`)."""

    memory: SlotMemory
    slot: torch.Tensor
    gen_start: int


@attrs.frozen
class CallRows:
    """One engine call's rows: their canvases, and what keys each row's stores and draws."""

    tokens: torch.Tensor  # [rows, width]
    attention: torch.Tensor  # [rows, width] real (non-padding) columns
    slot: torch.Tensor  # [rows] each row's slot: its stores in the memory
    draw_key: torch.Tensor  # [rows] the sample's draws key (its ``DecodeRequest.key``, by default its uid)
    row_key: torch.Tensor  # [rows] the branch within its sample, 0: the slot's root (a draws key)
    call: torch.Tensor  # [rows] model calls the row's sample made before this one (a draws key)
    window: tuple[torch.Tensor, torch.Tensor] | None  # [rows] first and end column each row decodes
    temperature: torch.Tensor | None = None  # [rows] token sampling's, over the decode's
    top_p: torch.Tensor | None = None  # [rows] nucleus mass (1: none), over the decode's
    top_k: torch.Tensor | None = None  # [rows] top-k (0: none), over the decode's
    seed: torch.Tensor | None = None  # [rows] the draws' first key (None: the engine's)
    group: torch.Tensor | None = None  # [rows] rows of one group with the same tokens share a forward
    uid: torch.Tensor | None = None  # [rows] the sample's uid, which messages name (None: the draws key)

    @property
    def named(self) -> torch.Tensor:
        """``[rows]`` the id an error message names each row's sample by: its uid (the draws key
        where none was given), never a key many samples share (a server's requests are all key 0)."""
        return self.draw_key if self.uid is None else self.uid

    @property
    def root(self) -> torch.Tensor:
        """``[rows]`` rows that are their slot's own canvas (they write its stores; a branch never does)."""
        return is_root(self.row_key)

    def take(self, at: torch.Tensor) -> CallRows:
        window = None if self.window is None else (self.window[0][at], self.window[1][at])
        optional = {
            name: None if getattr(self, name) is None else getattr(self, name)[at]
            for name in ("temperature", "top_p", "top_k", "seed", "group", "uid")
        }
        picked = {
            name: getattr(self, name)[at] for name in ("tokens", "attention", "slot", "draw_key", "row_key", "call")
        }
        return CallRows(**picked, window=window, **optional)


@attrs.frozen
class CallSettings:
    """What every row of one call shares."""

    memory: SlotMemory
    sampling: Sampling
    statistics: frozenset[str]
    from_column: int  # the generation region's first column: only columns from here on are summarised
    guidance: float = 0.0  # > 0: each row's unconditional copy (prompt masked) rides along; the logits combined


@attrs.frozen
class WrittenFirst:
    """A forward of their own that some rows took before the call (the block cache's separate write)."""

    rows: torch.Tensor  # [n] the rows of the call that took it
    cost: CallCost  # what it cost them


@attrs.frozen
class PreparedCall:
    """A call ready to run: its rows (temperature resolved), its settings, the seeded draws, and
    which rows repeat another of their group."""

    rows: CallRows
    settings: CallSettings
    uniform: torch.Tensor | None  # [rows, width] the ordering's draws (the ``uniform`` statistic)
    draw: torch.Tensor | None  # [rows, width] the token samples' draws
    copy_of: torch.Tensor | None  # [rows] the first row of its group with the same tokens
    shadow_length: int = 0  # WINO's shadow block (the ``shadow`` statistics' provider); 0: none


@attrs.frozen
class ForwardOutput:
    """What one forward returns: its summaries per summarised column, its keys and values (a full
    forward's, for a refresh; a layerwise one's columns read and recomputed, and its rows' updated
    stores), which rows it computed (not copied), the canvas columns summarised and which of them
    are real, and the slot-store writes it computed, pending until it succeeded (:meth:`RolloutEngine._store`)."""

    summaries: dict[str, torch.Tensor]
    kv: list | tuple | None
    computed: torch.Tensor  # [rows]
    span: torch.Tensor  # [rows, columns]
    real: torch.Tensor  # [rows, columns]
    writes: tuple[Callable[[], None], ...] = ()  # in order: a layerwise store, a canvas memory, KLASS's history


@attrs.define(eq=False)
class CallOutputs:
    """A call's results as its forwards come in (the one mutable record of a call: its buffers)."""

    summaries: dict[str, torch.Tensor]
    row_cost: torch.Tensor
    token_cost: torch.Tensor

    @classmethod
    def empty(cls, shape: torch.Size, statistics: frozenset[str], mask_id: int) -> CallOutputs:
        """Every column the mask with confidence 0 until a forward summarises it."""
        rows, width = shape
        summaries = {
            "token": torch.full((rows, width), mask_id, dtype=torch.long),
            "confidence": torch.zeros(rows, width),
        }
        drawn = statistics_registry.from_source(statistics, "draws")  # the draws themselves, not per forward
        summaries.update({name: torch.zeros(rows, width) for name in statistics - drawn})
        zeros = torch.zeros(rows, dtype=torch.long)
        return cls(summaries, zeros, zeros.clone())

    def write(self, forward: Forward, output: ForwardOutput) -> None:
        """A forward's summaries into their canvas columns (a cached row: its own window only)."""
        written = output.real if forward.cached else torch.ones_like(output.real)
        at = (forward.rows[:, None].expand_as(output.span)[written], output.span[written])
        for name, value in output.summaries.items():
            self.summaries[name][at] = value[written]

    def evaluation(self, uniform: torch.Tensor | None) -> Evaluation:
        return Evaluation(uniform=uniform, **self.summaries)

    def cost(self) -> CallCost:
        return CallCost(rows=self.row_cost, tokens=self.token_cost, calls=torch.ones_like(self.row_cost))


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
    # the agreement of the model's tensor-parallel group (one process: agrees with itself, no collective)
    decisions: GroupDecisions = attrs.field(init=False, factory=GroupDecisions, eq=False)
    layer_columns: int = attrs.field(
        init=False, default=0
    )  # real columns of the canvases the layerwise forwards carried (a full forward's work per layer)

    @property
    def uniform_noise(self) -> bool:
        """The model denoises uniform noise (DiffusionGemma): open positions get keyed random ids, an encoder writes the prefix."""
        return self.capabilities.noise == "uniform"

    @property
    def layerwise(self) -> bool:
        """The cache policy decides per layer inside the forward (dllm_cache, d2cache, elastic, dkv)."""
        return self.cache.layerwise

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
        """Set up what the cache policy and compile flag need; whether the model can run them is the
        plan's question (:func:`~dlmsearch.search.plan.validate`), asked before any forward."""
        able = self.capabilities
        self.decisions = GroupDecisions.of(self.adapter.module)  # sharded before the engine is built (loading)
        if isinstance(self.cache, ModelsExact):
            self.cache = self.cache.for_model(able.attention_block)
        if self.layerwise and able.layerwise:
            self.layer_forwards = torch.zeros(self.adapter.module.config.num_layers, dtype=torch.long)
        if not str(self.adapter.device).startswith("cuda"):
            keep_freed_memory()  # vocabulary-sized tensors are reused instead of page-faulted in every forward
        if self.compile and able.compiles and able.tensor_parallel == 1:  # sharded: the plan refuses it (its rule 15)
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

    def evaluate(self, rows: CallRows, settings: CallSettings) -> tuple[Evaluation, CallCost]:
        """One model call for every row here: forward all rows, summarise per position.

        Only columns from ``settings.from_column`` on (the generation region) are summarised: prompt
        logits are never computed where the model allows it, and read as the mask with confidence 0.
        The cache policy decides which rows run against their slot's stored keys and values (only
        their columns are forwarded; columns outside them then read as the mask with confidence 0)
        and which refresh them. Rows with equal ``group`` and the same tokens (particles of a sample
        that reached the same canvas) share one forward, counted once; each keeps its own draws.
        Returns the summaries and what the call cost per row (the caller charges it to the samples).

        With the block cache (``cache=block``, ``fuse_write=false``) a root row whose finished
        blocks are not stored yet first takes a forward of its own that writes them (the
        reference loops' prefill and ``store_kv`` forward; the policy names those rows in
        ``prepare_call``): two model calls for that row, its draws keyed by the second.

        Args:
            rows: the canvases and what keys each row's stores and draws (:class:`CallRows`).
            settings: what every row shares: the slots' stores, sampling, statistics, the
                generation's first column, guidance (:class:`CallSettings`).
        """
        statistics_registry.check(settings.statistics)
        rows, written = self._write_first(rows, settings)
        evaluation, cost = self._call(rows, settings)
        return evaluation, cost if written is None else cost.after(written.rows, written.cost)

    def _write_first(self, rows: CallRows, settings: CallSettings) -> tuple[CallRows, WrittenFirst | None]:
        """The forward of its own that the policy asks for before the call (the block cache's
        separate write of finished blocks): the rows after it (one call later) and what it cost."""
        if rows.window is None:
            return rows, None
        if self.uniform_noise:  # the encoder's call: what is finished before each root's canvas
            with self.decisions.paired(_out_of_memory):  # no back-off here: a sharded encoder's rank fails alone
                encoded = uniform_noise.encode_pending(
                    self.adapter, rows.tokens, rows.attention, rows.window[0], rows.slot, rows.root, settings.memory
                )
            if encoded is None:
                return rows, None
            at, cost = encoded
            return attrs.evolve(rows, call=rows.call.index_add(0, at, torch.ones_like(at))), WrittenFirst(at, cost)
        first = rows.attention.long().argmax(dim=1)
        windows = RowWindows(*rows.window, rows.tokens.shape[1], first, settings.memory.kv, rows.slot)
        writes = self.cache.prepare_call(windows, rows.root)
        if writes is None or not bool(writes.any()):
            return rows, None
        at = writes.nonzero().squeeze(1)
        start = rows.window[0][at]
        writing = attrs.evolve(rows.take(at), window=(start, start), group=None)
        _, cost = self._call(
            writing, CallSettings(settings.memory, settings.sampling, frozenset(), settings.from_column)
        )
        return attrs.evolve(rows, call=rows.call + writes.long()), WrittenFirst(at, cost)

    def _call(self, rows: CallRows, settings: CallSettings) -> tuple[Evaluation, CallCost]:
        """prepare -> run -> collect: the planned forwards of the rows, each piece's summaries
        written into the call's outputs and its keys and values into the stores."""
        prepared = self._prepare(rows, settings)
        outputs = CallOutputs.empty(rows.tokens.shape, settings.statistics, self.mask_id)
        run = functools.partial(self._run, prepared)
        for planned in self._forwards(rows, settings, prepared.copy_of):
            for forward, output in self._forward(planned, run, rows.named):
                outputs.write(forward, output)
                self._charge(prepared, forward, output, outputs)
                self._store(prepared, forward, output)
        return outputs.evaluation(prepared.uniform), outputs.cost()

    @staticmethod
    def _shadow_length(statistics: frozenset[str], window: tuple[torch.Tensor, torch.Tensor] | None) -> int:
        """WINO's shadow block (the provider of the ``shadow`` statistics): the length of the block
        every row decodes, or 0 where none is asked for (the plan checked the rest)."""
        if not statistics_registry.from_source(statistics, "shadow"):
            return 0
        assert window is not None, "the verify statistic needs the rows' windows"
        lengths = torch.unique(window[1] - window[0])
        assert len(lengths) == 1, "the verify statistic needs every row in one block of one length (the plan's rule 20)"
        return int(lengths[0])

    def _prepare(self, rows: CallRows, settings: CallSettings) -> PreparedCall:
        """The decode's sampling settings where the rows set none, the seeded draws where something reads
        them (the ordering's ``uniform`` and the token samples'), the rows that repeat another of
        their group, and the row budget for this canvas."""
        decode = RowSampling.uniform(settings.sampling, len(rows.slot))
        rows = attrs.evolve(
            rows,
            **{
                name: getattr(decode, name) for name in ("temperature", "top_p", "top_k") if getattr(rows, name) is None
            },
        )
        sampled = bool((rows.temperature > 0).any())
        ordering = statistics_registry.from_source(settings.statistics, "draws")
        seed = torch.tensor(self.seed) if rows.seed is None else rows.seed[:, None]
        if self.uniform_noise:  # open positions hold the ids drawn after the sample's previous call
            keys = [seed, rows.draw_key[:, None], rows.call[:, None] - 1, rows.row_key[:, None]]
            tokens = uniform_noise.noised(rows.tokens, rows.attention, keys, self.mask_id, self.adapter.vocab_size)
            rows = attrs.evolve(rows, tokens=tokens)
        uniform = draw = None
        if sampled or ordering:
            position = rows.attention.long().cumsum(dim=1) - 1  # the row's own positions, whatever its padding
            keys = [seed, rows.draw_key[:, None], rows.call[:, None], rows.row_key[:, None], position]
            uniform = hashed_uniform(keys) if ordering else None
            draw = hashed_uniform(keys + [torch.tensor(Stream.TOKEN_SAMPLE)]) if sampled else None
        self._estimate_budget(rows.attention, settings.from_column)
        copy_of = None if rows.group is None else _merged(rows.tokens, rows.group)
        return PreparedCall(
            rows, settings, uniform, draw, copy_of, self._shadow_length(settings.statistics, rows.window)
        )

    def _estimate_budget(self, attention: torch.Tensor, from_column: int) -> None:
        """``row_budget=auto``: the rows that fit the device, estimated once per canvas shape."""
        if self.row_budget != "auto":
            return
        width = attention.shape[1]
        key = (width - int(attention.long().argmax(dim=1).min()), width - from_column)
        if self.auto_key != key:
            self.auto_key = key
            dtype = getattr(torch, self.adapter.dtype)
            fits = auto_row_budget(self.adapter.module, self.adapter.device, dtype, *key, self.cache.stores)
            # a tensor-parallel group: what fits every rank's device, so every rank runs the same forwards
            self.auto_budget = self.decisions.least(fits)

    def _run(self, prepared: PreparedCall, forward: Forward) -> ForwardOutput:
        """One forward's rows through the model and the summaries."""
        rows = prepared.rows
        index = forward.rows
        span, real = self._span(forward, rows.attention[index])
        merged = None if forward.cached or prepared.shadow_length else prepared.copy_of  # shadow rows: all computed
        source = _within(index, merged)
        computed = source == torch.arange(len(index))
        summaries, kv, writes = self._summarise(prepared, forward, span, real, None if bool(computed.all()) else source)
        if forward.layerwise:  # columns the policy did not bring up to date read as the mask
            real = real & kv[0]
            # a slot's own canvas puts its copy of the slot's store back (a branch never does)
            put = functools.partial(prepared.settings.memory.layers.put, rows.slot[index], kv[2], rows.root[index])
            writes = (put, *writes)
        return ForwardOutput(summaries, kv, computed, span, real, writes)

    def _charge(self, prepared: PreparedCall, forward: Forward, output: ForwardOutput, outputs: CallOutputs) -> None:
        """A forward's cost per row it computed: rows (a guided row twice), and token-forwards (a
        cached row: its window, one column earlier for a shifted model; a layerwise one: the
        columns recomputed summed over layers, in whole-canvas forwards' units, rounded up; a
        shadow block is part of its row)."""
        rows, settings = prepared.rows, prepared.settings
        computed = output.computed
        counted = forward.rows[computed]
        copies = 2 if settings.guidance > 0 else 1
        outputs.row_cost[counted] += copies
        if forward.layerwise:
            recomputed = output.kv[1][computed]
            layers = recomputed.shape[1]
            outputs.token_cost[counted] += (recomputed.sum(dim=1) + layers - 1) // layers
            self.layer_forwards += recomputed.sum(dim=0)
            self.layer_columns += int(rows.attention[counted].sum())
        elif forward.cached:
            low, high = forward.query[computed, 0], forward.query[computed, 1]
            shifted = self.capabilities.shift_logits
            outputs.token_cost[counted] += copies * (high - low + (shifted & (low > 0)).long()) + prepared.shadow_length
        else:
            outputs.token_cost[counted] += copies * rows.attention[counted].sum(dim=1) + prepared.shadow_length

    def _store(self, prepared: PreparedCall, forward: Forward, output: ForwardOutput) -> None:
        """The forward's writes to its slots' stores, applied only once it succeeded, summaries
        included (a tensor-parallel group: on every rank), so a forward retried after running out of
        memory reads every store as it was: the pending writes it computed (a layerwise forward's
        roots' copies of their slots' stores, a uniform-noise canvas memory, KLASS's history), and
        refreshing rows' keys and values (an exact store's cached forward wrote theirs in place,
        into columns none of its rows reads, so a retry writes the same: it marks how far)."""
        for write in output.writes:
            write()
        if forward.layerwise:
            return
        storage, refresh = prepared.settings.memory.kv, forward.refresh
        slots = prepared.rows.slot[forward.rows][refresh]
        if forward.cached and forward.settled is not None:
            storage.mark_settled(slots, forward.settled[refresh])
        elif bool(refresh.any()):
            keep = refresh.nonzero().squeeze(1).to(output.kv[0][0].device)
            kv = [(k[keep], v[keep]) for k, v in output.kv]
            storage.store(slots, forward.first, kv, forward.query[refresh], prepared.rows.tokens.shape[1])

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

        A tensor-parallel group backs off as one: after every attempt the ranks agree whether any
        ran out of memory (:class:`~dlmsearch.models.group_decisions.GroupDecisions`), and all
        halve and retry together, so their next forwards (and all-reduces) pair.
        """
        rows, budget = len(forward.rows), self.current_budget
        if (forward.distinct or rows) > budget:  # the budget dropped earlier in this step: no need to fail again first
            for start in range(0, rows, budget):
                yield from self._forward(self._piece(forward, slice(start, start + budget)), run, sample_uid)
            return
        cause, decisions = None, self.decisions
        try:
            result = run(forward)
        except RuntimeError as error:
            if not _out_of_memory(error):
                raise
            if rows == 1 and decisions.group is None:
                raise self._row_out_of_memory(forward, sample_uid, planned_rows, str(error)) from error
            cause = str(error)
        if not decisions.highest(cause is not None):  # one process: its own outcome; a group: any rank's
            self._succeeded()
            yield forward, result
            return
        if rows == 1:
            cause = cause or "another rank of its tensor-parallel group ran out of memory"
            raise self._row_out_of_memory(forward, sample_uid, planned_rows, cause)
        # Retried outside the except clause, so that the failed attempt's tensors (held by its traceback) are freed.
        half = (rows + 1) // 2
        self.budget, self.successes = min(self.current_budget, half), 0
        if str(self.adapter.device).startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()
        for part in (slice(0, half), slice(half, rows)):
            yield from self._forward(self._piece(forward, part), run, sample_uid, planned_rows or rows)

    def _row_out_of_memory(
        self, forward: Forward, sample_uid: torch.Tensor, planned_rows: int | None, cause: str
    ) -> torch.OutOfMemoryError:
        """The error of a single row that ran out of memory: its sample, the rows tried, the budget and the cause."""
        uid = sorted(set(sample_uid[forward.rows].tolist()))
        auto = f" = {self.max_rows}" if self.row_budget == "auto" else ""
        return torch.OutOfMemoryError(
            f"out of memory forwarding a single row of sample uid(s) {uid} (split from a forward of "
            f"{planned_rows or len(forward.rows)} row(s); row_budget={self.row_budget}{auto}): {cause}"
        )

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

    def _forwards(self, rows: CallRows, settings: CallSettings, copy_of: torch.Tensor | None = None) -> list[Forward]:
        """The forwards of one call: row chunks of at most ``current_budget`` rows.

        Columns that are padding in every row of a chunk are dropped, so a row costs the same
        alone or batched. A model that ignores the padding mask gets only rows of one prompt
        length per chunk, hence no padding at all: its results cannot depend on the batch.
        The cache policy names the rows that run against their slot's stored keys and values
        (forwarded together, each row its own columns) and, among the others (a full forward),
        those whose keys and values refresh their slot's storage. Rows that repeat another row
        (``copy_of``) travel with it.
        """
        attention, slot, window, from_column = rows.attention, rows.slot, rows.window, settings.from_column
        storage, row_key = settings.memory.kv, rows.row_key
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
        if self.uniform_noise:  # the decoder reads each row's canvas against its slot's encoded prefix
            assert window is not None, "a uniform-noise model decodes the rows' canvases (their windows)"
            query = torch.stack(window, dim=1)
            no_refresh = torch.zeros(rows, dtype=torch.bool)
            return [
                Forward(part, 0, (from_column, width), True, no_refresh[part], query[part])
                for part in self._chunks(torch.arange(rows), None)
            ]
        policy = self.cache if window is not None else NoCache()
        if policy.exact and not storage.layers:  # filled in place by cached forwards alone
            storage.allocate(self.adapter.empty_kv(len(storage.window_of), width))
        query = (
            policy.columns(RowWindows(*window, width, first, storage, slot))
            if window is not None
            else torch.zeros(rows, 2, dtype=torch.long)
        )
        hit = policy.hits(storage, slot, query)
        refreshes = policy.refreshes(hit, is_root(row_key))
        groups: list[tuple[torch.Tensor, bool]] = []
        full = (~hit).nonzero().squeeze(1)
        if self.capabilities.honours_padding:
            groups.append((full, False))
        else:
            groups += [(full[first[full] == f], False) for f in torch.unique(first[full]).tolist()]
        if bool(hit.any()):  # one forward for every cached row, whatever its window
            groups.append((hit.nonzero().squeeze(1), True))
        forwards = []
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
                forwards.append(
                    Forward(
                        part, start, (from_column, width), cached, refresh, query[part], distinct, settled, logits_from
                    )
                )
        return forwards

    def _summarise(
        self,
        prepared: PreparedCall,
        forward: Forward,
        span: torch.Tensor,
        real: torch.Tensor,
        source: torch.Tensor | None,
    ) -> tuple[dict[str, torch.Tensor], list | tuple | None, tuple[Callable[[], None], ...]]:
        """A forward's per-position summaries on the host, its keys and values, and the writes to
        its slots' stores that it computed (a uniform-noise canvas memory, KLASS's history), pending:
        :meth:`_store` applies them once the forward succeeded.

        Args:
            prepared: the call (rows, settings, draws).
            forward: the piece that runs.
            span: ``[rows, columns]`` the canvas columns summarised per row.
            real: ``[rows, columns]`` which of them are real tokens of the row's window.
            source: ``[rows]`` the row each one copies (None: every row computed).
        """
        rows, settings = prepared.rows, prepared.settings
        index, writes = forward.rows, []
        with self._timed("summary"):
            # the model's all-reduces: a rank that runs out of memory among them alone ends the run (GroupDiverged)
            with self.decisions.paired(_out_of_memory):
                logits, kv, verify = self._logits(prepared, forward, source)
            logits[..., self.adapter.never_proposed] = -math.inf  # a committed token can never be the mask
            sampling = RowSampling(rows.temperature[index], rows.top_p[index], rows.top_k[index])
            draw = None if prepared.draw is None else prepared.draw[index[:, None], span]
            of_distribution = statistics_registry.of_distribution(settings.statistics)
            of_logits = statistics_registry.of_logits(settings.statistics)
            summaries = summarise_logits(
                logits, settings.sampling.confidence, sampling, draw, of_distribution, of_logits, self.uniform_noise
            )
            if self.uniform_noise:
                processed = summaries.pop("processed")
                draft = summaries["draft"].long().cpu()  # the uniform-noise rule asks for it (plan rule 11)
                repeats, remember = uniform_noise.remember(
                    settings.memory,
                    rows.slot[index],
                    forward.query[:, 0],
                    rows.row_key[index],
                    processed,
                    draft,
                    getattr(torch, self.adapter.dtype),
                )
                writes.append(remember)
                if "repeats" in settings.statistics:
                    summaries["repeats"] = repeats[:, None].float().expand(-1, logits.shape[1]).to(logits.device)
            if verify is not None:
                summaries["verify"] = verify
            history = statistics_registry.from_source(settings.statistics, "history")
            if history:  # KLASS: against the slot's previous distributions; columns start at the generation region
                low = forward.query[:, 0] if forward.cached else forward.columns[0]
                step, keep = settings.memory.history.step(
                    logits, rows.slot[index], low - settings.from_column, rows.root[index]
                )
                writes.append(keep)
                summaries.update(dict.fromkeys(history, step))
            return self._to_host(summaries, real, rows.named[index]), kv, tuple(writes)

    def _logits(
        self, prepared: PreparedCall, forward: Forward, source: torch.Tensor | None
    ) -> tuple[torch.Tensor, list | tuple | None, torch.Tensor | None]:
        """The forward's logits (left-aligned from its first summarised column), its keys and
        values, and WINO's ``verify`` where a shadow block rides along."""
        rows, settings = prepared.rows, prepared.settings
        index, first = forward.rows, forward.first
        tokens, attention = rows.tokens[index, first:], rows.attention[index, first:]
        low, high = (forward.query[:, 0], forward.query[:, 1]) if forward.cached else forward.columns
        low, high = low - first, high - first
        if self.uniform_noise:
            with self._timed("model"):
                logits = uniform_noise.denoise(
                    self.adapter,
                    rows.tokens[index],
                    rows.attention[index],
                    forward.query[:, 0],
                    rows.slot[index],
                    rows.row_key[index],
                    settings.memory,
                )
            return logits, None, None
        cached = self._cached_rows(prepared, forward)
        if prepared.shadow_length:  # every row computed: no merging
            return self._shadow(
                tokens, attention, low, high, rows.window[0][index] - first, prepared.shadow_length, cached
            )
        prompt_end = settings.from_column - first
        if source is None:
            logits, kv = self._model(tokens, attention, low, high, cached, prompt_end, settings.guidance)
            return logits, kv, None
        # rows that repeat an earlier row of their group: forward the distinct rows, then copy
        distinct = torch.unique(source)
        logits, kv = self._model(tokens[distinct], attention[distinct], low, high, None, prompt_end, settings.guidance)
        where = torch.searchsorted(distinct, source).to(logits.device)
        return logits[where], None if kv is None else [(k[where], v[where]) for k, v in kv], None

    def _cached_rows(self, prepared: PreparedCall, forward: Forward) -> CachedRows | LayerwiseForward | None:
        """What a forward reads of its slots' stores: a layerwise policy's stores, the key/value
        storage (an exact store: the refreshing rows write in place), or nothing (a full forward)."""
        rows, memory = prepared.rows, prepared.settings.memory
        index = forward.rows
        if forward.layerwise:
            return LayerwiseForward(memory, rows.slot[index], prepared.settings.from_column)
        if forward.cached:
            in_place = forward.refresh if self.cache.exact else None
            return CachedRows(memory.kv, rows.slot[index], in_place, forward.logits_from)
        return None

    def _shadow(
        self,
        tokens: torch.Tensor,
        attention: torch.Tensor,
        low: int | torch.Tensor,
        high: int | torch.Tensor,
        start: torch.Tensor,
        length: int,
        cached: CachedRows | None,
    ) -> tuple[torch.Tensor, list | None, torch.Tensor]:
        """WINO: the block's shadow in the same forward; ``verify`` is the shadow's probability of
        each block column's current token.

        Args:
            tokens: ``[rows, columns]`` from the forward's first column.
            attention: ``[rows, columns]``.
            low: the first column forwarded (per row, against a cache).
            high: the end column.
            start: ``[rows]`` the block's first column.
            length: the block's length.
            cached: the rows' stores, for a prefix cache.
        """
        with self._timed("model"):
            starts = low if cached is not None else torch.full((len(tokens),), low)
            logits, shadow_logits, kv = self.adapter.shadow_logits(
                tokens, attention, starts, high, start, length, cached
            )
        mirror = start[:, None] + torch.arange(length)[None, :]
        current = tokens.gather(1, mirror).to(logits.device)
        verified = torch.softmax(shadow_logits.double(), dim=-1).gather(-1, current[..., None]).squeeze(-1).float()
        columns = (mirror - starts[:, None]).to(logits.device)
        verify = torch.zeros(logits.shape[:2], device=logits.device).scatter(1, columns, verified)
        return logits, kv, verify

    def _to_host(self, summaries: dict[str, torch.Tensor], real: torch.Tensor, uid: torch.Tensor) -> dict:
        """Deferred tokens' confidence to 0, then one device-to-host transfer per forward (the
        tokens ride with the float summaries: exact, token ids are below 2**24, so there is no
        per-row synchronisation); NaN logits in a real column fail, naming the samples."""
        token, confidence = summaries.pop("token"), summaries["confidence"]
        if self.adapter.deferred_ids:
            deferred = torch.isin(token, torch.tensor(self.adapter.deferred_ids, device=token.device))
            summaries["confidence"] = torch.where(deferred, 0.0, confidence)
        host = dict(zip(["token", *summaries], torch.stack([token.float(), *summaries.values()]).cpu().unbind(0)))
        bad = (host.pop("nan").bool() & real).any(dim=1)
        if bool(bad.any()):
            raise FloatingPointError(f"model produced NaN logits for sample uid(s) {sorted(set(uid[bad].tolist()))}")
        host["token"] = host["token"].long()
        return host

    def _timed(self, part: str) -> AbstractContextManager[None]:
        """The profile's timer for ``part`` (``model`` or ``summary``), or nothing without a profile."""
        return nullcontext() if self.profile is None else self.profile.timing(part, self.adapter.device)

    def _model(
        self,
        tokens: torch.Tensor,
        attention: torch.Tensor,
        low: int | torch.Tensor,
        high: int | torch.Tensor,
        cached: CachedRows | LayerwiseForward | None,
        prompt_end: int,
        guidance: float,
    ) -> tuple[torch.Tensor, list | None]:
        """The rows' logits: against the cache (each row its own window), or of the columns
        ``low:high`` (guided: each row beside its unconditional copy in the same call, combined;
        guidance never runs with a cache).

        Args:
            tokens: ``[R, T]`` the rows' canvases.
            attention: ``[R, T]`` which columns are real (not padding).
            low: the first column read (``[R]`` per row, or one for all rows).
            high: the end of the columns read (``[R]`` per row, or one for all rows).
            cached: the rows' cached keys and values, a layerwise policy's forward, or None.
            prompt_end: the prompt's last column + 1 (what the unconditional copy masks).
            guidance: the classifier-free guidance scale (0: none).
        """
        if guidance > 0:
            rows = len(tokens)
            both = torch.cat([tokens, unconditional(tokens, attention, prompt_end, self.mask_id)])
            logits, _ = self._model(both, torch.cat([attention, attention]), low, high, None, prompt_end, 0.0)
            return combine(logits[:rows], logits[rows:], guidance), None
        with self._timed("model"):
            if isinstance(cached, LayerwiseForward):
                device = self.adapter.device
                return self._layerwise(tokens.to(device), attention.to(device), low.to(device), high.to(device), cached)
            if cached is not None:
                return self.adapter.cached_logits(tokens, attention, low, high, cached), None
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
        store, returned beside the columns read and recomputed; :meth:`_store` writes a slot's own
        canvas's copy back (a branch never does) once the forward's summaries succeeded, so a
        forward retried after running out of memory reads the store as it was."""
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
        return logits, (read, recomputed, fields)
