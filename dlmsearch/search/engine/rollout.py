"""The batched rollout engine: the only caller of the model.

It evaluates any flat set of rows (several samples, each with several hypotheses at any depth)
in one forward call, chunked to ``row_budget`` rows, and returns per-position summaries that the
components need, with what the call cost per row (:class:`~dlmsearch.search.records.usage.CallCost`).
Vocabulary-sized tensors live only inside a call. Rows belong to *slots* (one partial canvas
each: a sample's particle in a population search, else the sample itself); the engine keeps no
per-sample state: the caller hands it each slot's stores (:class:`SlotMemory`: key/value storage,
KLASS's history, an encoder's prefixes) and the sampling settings, and charges the cost to its own counters, so samples
can join and leave a decode between calls. A cache policy (``cache=``) decides which rows run
against their slots' stores, what some rows write first, and what a forward keeps for the next step;
the adapter fills the open positions a call carries as its model reads them (:meth:`_prepare`). Rows of one group (a sample's particles at the same branch)
that hold the same canvas are forwarded once and count once. A forward that runs out of device
memory is split and retried (:mod:`~dlmsearch.search.engine.back_off`). The call's records are in
:mod:`~dlmsearch.search.engine.call_records`, its forward planning in :mod:`~dlmsearch.search.engine.forward_plan`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import attrs
import torch

from dlmsearch.core.attention import positions
from dlmsearch.core.capabilities import ModelCapabilities
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.group_decisions import GroupDecisions
from dlmsearch.models.kv_storage import CachedRows, PrefixRead
from dlmsearch.search.engine import statistics as statistics_registry
from dlmsearch.search.engine.adaptive.layer_rules import LayerCall
from dlmsearch.search.engine.back_off import OutOfMemoryBackOff, check_budget, out_of_memory
from dlmsearch.search.engine.cache_policy import CachePolicy, RowWindows, Writer, cache_policy, for_model
from dlmsearch.search.engine.call_records import (
    CallOutputs,
    CallRows,
    CallSettings,
    Forward,
    ForwardOutput,
    LayerwiseForward,
    ModelInput,
    PreparedCall,
    WrittenFirst,
)
from dlmsearch.search.engine.forward_plan import ForwardPlanner, merged, span, within
from dlmsearch.search.engine.guidance import combine, unconditional
from dlmsearch.search.engine.host_memory import keep_freed_memory
from dlmsearch.search.engine.profile import ForwardProfile
from dlmsearch.search.engine.row_budget import auto_row_budget
from dlmsearch.search.engine.slot_memory import SlotMemory
from dlmsearch.search.engine.summaries import summarise_logits
from dlmsearch.search.records.randomness import Stream, hashed_uniform
from dlmsearch.search.records.row_sampling import RowSampling
from dlmsearch.search.records.state import Evaluation
from dlmsearch.search.records.usage import CallCost
from dlmsearch.validation import check_type


@attrs.define(eq=False, init=False)
class RolloutEngine(OutOfMemoryBackOff):
    """Batched, chunked model evaluation with a cache policy; the model and the call machinery only."""

    adapter: ModelAdapter
    row_budget: int | str = attrs.field(validator=lambda _, a, v: check_budget(v))  # rows per forward, or "auto"
    # Sampling as the user sets it (a field None: not set, so the checkpoint's generation_config.json, else the decoder's own)
    sampling: Sampling
    seed: int = attrs.field(validator=check_type(int))
    cache: CachePolicy = attrs.field(converter=cache_policy)  # cache=none|prefix|dual (engine.cache=NAME: the same)
    compile: bool = attrs.field(validator=check_type(bool))  # the model's per-token work under torch.compile, bucketed
    profile: ForwardProfile | None = attrs.field(eq=False)  # set: every forward is timed (benchmarks)
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

    def __init__(
        self,
        adapter: ModelAdapter,
        *,
        row_budget: int | str = 64,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        confidence: str | None = None,
        seed: int = 0,
        cache: CachePolicy | str = "none",
        compile: bool = False,
        profile: ForwardProfile | None = None,
    ) -> None:
        """The engine's settings as the config spells them (``engine.temperature``, ``engine.top_p``, ...,
        conf/engine/default.yaml): the four sampling settings are one :class:`Sampling`, which checks them.
        A subclass that adds fields keeps this constructor: ``@attrs.define(init=False)``, its fields defaulted.

        Args:
            adapter: the model.
            row_budget: rows per forward chunk (``auto``: what fits the free device memory).
            temperature: ``engine.temperature`` (None: not set here; the checkpoint's, else the decoder's).
            top_p: ``engine.top_p``, nucleus truncation in (0, 1].
            top_k: ``engine.top_k``, the most likely tokens kept.
            confidence: ``engine.confidence``: ``model`` or ``sampling`` (where a position's confidence is read).
            seed: the seed every draw is keyed by.
            cache: the cache policy, or its name.
            compile: the model's per-token work under torch.compile.
            profile: where forward timings are recorded (None: not recorded).
        """
        self.__attrs_init__(
            adapter=adapter,
            row_budget=row_budget,
            sampling=Sampling(temperature=temperature, top_p=top_p, top_k=top_k, confidence=confidence),
            seed=seed,
            cache=cache,
            compile=compile,
            profile=profile,
        )

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
        self.cache = for_model(self.cache, able)
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

    def sampling_over(self, decoder: Sampling) -> Sampling:
        """A decode's sampling: each setting the engine's own, else the checkpoint's
        ``generation_config.json``, else the decoder's (its reference loop's defaults: Dream's
        top-k 50), else neutral."""
        return self.sampling.over(self.adapter.generation_defaults).over(decoder).resolved()

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
        """The write of their own that the policy asks for before the call (the block cache's
        separate write of finished blocks, an encoder's call): the rows after it (one call later)
        and what it cost."""
        if rows.window is None:
            return rows, None
        first = rows.attention.long().argmax(dim=1)
        windows = RowWindows(*rows.window, rows.tokens.shape[1], first, settings.memory.kv, rows.slot)
        writer = Writer(settings.memory, functools.partial(self._write, settings), self.adapter, self.decisions)
        written = self.cache.write_first(rows, windows, writer)
        if written is None:
            return rows, None
        at, cost = written
        return attrs.evolve(rows, call=rows.call.index_add(0, at, torch.ones_like(at))), WrittenFirst(at, cost)

    def _write(self, settings: CallSettings, rows: CallRows) -> CallCost:
        """A write forward of these rows (no summaries), a call of its own: what it cost them."""
        _, cost = self._call(rows, CallSettings(settings.memory, settings.sampling, frozenset(), settings.from_column))
        return cost

    def _call(self, rows: CallRows, settings: CallSettings) -> tuple[Evaluation, CallCost]:
        """prepare -> run -> collect: the planned forwards of the rows, each piece's summaries
        written into the call's outputs and its keys and values into the stores."""
        prepared = self._prepare(rows, settings)
        outputs = CallOutputs.empty(rows.tokens.shape, settings.statistics, self.capabilities.open_id)
        run = functools.partial(self._run, prepared)
        planner = ForwardPlanner(
            self.cache, self.capabilities.honours_padding, self.current_budget, self.adapter.empty_kv
        )
        for planned in planner.forwards(rows, settings, prepared.copy_of):
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
        if (
            rows.open is not None
        ):  # open positions as the model reads them (its draws: after the sample's previous call)
            keys = [seed, rows.draw_key[:, None], rows.call[:, None] - 1, rows.row_key[:, None]]
            attention = rows.attention

            def renoise() -> torch.Tensor:  # only a model that reads noise asks: a masked one draws nothing
                return hashed_uniform([*keys, positions(attention), torch.tensor(int(Stream.RENOISE))]).double()

            rows = attrs.evolve(rows, tokens=self.adapter.materialise(rows.tokens, rows.open & attention, renoise))
        uniform = draw = None
        if sampled or ordering:
            position = rows.attention.long().cumsum(dim=1) - 1  # the row's own positions, whatever its padding
            keys = [seed, rows.draw_key[:, None], rows.call[:, None], rows.row_key[:, None], position]
            uniform = hashed_uniform(keys) if ordering else None
            draw = hashed_uniform(keys + [torch.tensor(Stream.TOKEN_SAMPLE)]) if sampled else None
        self._estimate_budget(rows.attention, settings.from_column)
        copy_of = None if rows.group is None else merged(rows.tokens, rows.group)
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
        columns, real = span(forward, rows.attention[index])
        copy_of = None if forward.cached or prepared.shadow_length else prepared.copy_of  # shadow rows: all computed
        source = within(index, copy_of)
        computed = source == torch.arange(len(index))
        summaries, kv, writes = self._summarise(
            prepared, forward, columns, real, None if bool(computed.all()) else source
        )
        if forward.layerwise:  # columns the policy did not bring up to date read as the mask
            real = real & kv[0]
            # a slot's own canvas puts its copy of the slot's store back (a branch never does)
            put = functools.partial(prepared.settings.memory.layers.put, rows.slot[index], kv[2], rows.root[index])
            writes = (put, *writes)
        return ForwardOutput(summaries, kv, computed, columns, real, writes)

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
        roots' copies of their slots' stores, what the policy keeps (self-conditioning), KLASS's history), and
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

    def _summarise(
        self,
        prepared: PreparedCall,
        forward: Forward,
        span: torch.Tensor,
        real: torch.Tensor,
        source: torch.Tensor | None,
    ) -> tuple[dict[str, torch.Tensor], list | tuple | None, tuple[Callable[[], None], ...]]:
        """A forward's per-position summaries on the host, its keys and values, and the writes to
        its slots' stores that it computed (what the policy keeps for the next step, KLASS's
        history), pending: :meth:`_store` applies them once the forward succeeded.

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
            with self.decisions.paired(out_of_memory):
                logits, kv, verify = self._logits(prepared, forward, source)
            logits[..., self.adapter.never_proposed] = -math.inf  # a committed token can never be the mask
            sampling = RowSampling(rows.temperature[index], rows.top_p[index], rows.top_k[index])
            draw = None if prepared.draw is None else prepared.draw[index[:, None], span]
            of_distribution = statistics_registry.of_distribution(settings.statistics)
            of_logits = statistics_registry.of_logits(settings.statistics)
            keep = self.cache.keeps_processed
            summaries = summarise_logits(
                logits, settings.sampling.confidence, sampling, draw, of_distribution, of_logits, keep
            )
            dtype = getattr(torch, self.adapter.dtype)
            writes += self.cache.remember(prepared, forward, summaries, dtype)
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
        low, high = (forward.query[:, 0], forward.query[:, 1]) if forward.cached else forward.columns
        given = ModelInput(rows.tokens[index, first:], rows.attention[index, first:], low - first, high - first)
        cached = self._cached_rows(prepared, forward)
        if prepared.shadow_length:  # every row computed: no merging
            return self._shadow(given, rows.window[0][index] - first, prepared.shadow_length, cached)
        prompt_end = settings.from_column - first
        if source is None:
            logits, kv = self._model(given, cached, prompt_end, settings.guidance)
            return logits, kv, None
        # rows that repeat an earlier row of their group: forward the distinct rows, then copy
        distinct = torch.unique(source)
        logits, kv = self._model(given.take(distinct), None, prompt_end, settings.guidance)
        where = torch.searchsorted(distinct, source).to(logits.device)
        return logits[where], None if kv is None else [(k[where], v[where]) for k, v in kv], None

    def _cached_rows(
        self, prepared: PreparedCall, forward: Forward
    ) -> CachedRows | PrefixRead | LayerwiseForward | None:
        """What a forward reads of its slots' stores: a layerwise policy's stores, what the policy
        reads for a cached forward (the key/value storage, an encoder's prefixes), or nothing (a full forward)."""
        rows, memory = prepared.rows, prepared.settings.memory
        if forward.layerwise:
            return LayerwiseForward(memory, rows.slot[forward.rows], prepared.settings.from_column)
        if forward.cached:
            return self.cache.read(prepared, forward)
        return None

    def _shadow(
        self, given: ModelInput, start: torch.Tensor, length: int, cached: CachedRows | None
    ) -> tuple[torch.Tensor, list | None, torch.Tensor]:
        """WINO: the block's shadow in the same forward; ``verify`` is the shadow's probability of
        each block column's current token (``start [rows]``: the block's first column, ``length``
        its length; ``cached``: the rows' stores, for a prefix cache; ``given.low``: the first
        column forwarded, per row against a cache)."""
        tokens = given.tokens
        with self._timed("model"):
            starts = given.low if cached is not None else torch.full((len(tokens),), given.low)
            logits, shadow_logits, kv = self.adapter.shadow_logits(
                tokens, given.attention, starts, given.high, start, length, cached
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
        given: ModelInput,
        cached: CachedRows | PrefixRead | LayerwiseForward | None,
        prompt_end: int,
        guidance: float,
    ) -> tuple[torch.Tensor, list | None]:
        """The rows' logits: against what ``cached`` reads of their stores (each row its own
        window: a policy's read, a layerwise forward), or of the columns ``given.low:given.high``
        (guided: each row beside its unconditional copy in the same call, combined, ``prompt_end``
        the prompt's last column + 1, what that copy masks; guidance never runs with a cache)."""
        tokens, attention, low, high = given.tokens, given.attention, given.low, given.high
        if guidance > 0:
            rows = len(tokens)
            both = torch.cat([tokens, unconditional(tokens, attention, prompt_end, self.capabilities.open_id)])
            logits, _ = self._model(
                ModelInput(both, torch.cat([attention, attention]), low, high), None, prompt_end, 0.0
            )
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
            self.capabilities.open_id,
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
