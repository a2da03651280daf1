"""The records of one engine call: its rows and shared settings, the call prepared (draws,
merged rows), each planned forward and what it returns, and the call's outputs as they come in.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from dlmsearch.core.sampling import Sampling
from dlmsearch.search.engine import statistics as statistics_registry
from dlmsearch.search.engine.slot_memory import SlotMemory
from dlmsearch.search.records.randomness import is_root
from dlmsearch.search.records.state import Evaluation
from dlmsearch.search.records.usage import CallCost


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

    def piece(self, part: slice) -> Forward:
        """Some of the forward's rows, with their cache refreshes and windows; same first column and columns."""
        settled = None if self.settled is None else self.settled[part]
        logits_from = None if self.logits_from is None else self.logits_from[part]
        return attrs.evolve(
            self,
            rows=self.rows[part],
            refresh=self.refresh[part],
            query=self.query[part],
            distinct=None,
            settled=settled,
            logits_from=logits_from,
        )


@attrs.frozen
class ModelInput:
    """What one model call reads: the rows' canvases from the forward's first column, which of
    their columns are real, and the columns whose logits come back (``[R]`` per row, or one for all)."""

    tokens: torch.Tensor  # [R, T]
    attention: torch.Tensor  # [R, T]
    low: int | torch.Tensor
    high: int | torch.Tensor

    def take(self, at: torch.Tensor) -> ModelInput:
        """These rows only (the same columns)."""
        return attrs.evolve(self, tokens=self.tokens[at], attention=self.attention[at])


@attrs.frozen
class LayerwiseForward:
    """What a layerwise forward needs beyond its rows' tokens: the slots' stores, each row's slot
    and the generation's first column (which rows write their stores back: :meth:`~dlmsearch.search.engine.rollout.RolloutEngine._store`)."""

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
    # [rows, width] the positions a step may still fill (the canvas's open mask), which the model call
    # materialises as the model reads them (the mask id, or keyed noise); None: none
    open: torch.Tensor | None = None

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
            for name in ("temperature", "top_p", "top_k", "seed", "group", "uid", "open")
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
    """A forward of their own that some rows took before the call (the block cache's separate write,
    an encoder's call)."""

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
    are real, and the slot-store writes it computed, pending until it succeeded (:meth:`~dlmsearch.search.engine.rollout.RolloutEngine._store`)."""

    summaries: dict[str, torch.Tensor]
    kv: list | tuple | None
    computed: torch.Tensor  # [rows]
    span: torch.Tensor  # [rows, columns]
    real: torch.Tensor  # [rows, columns]
    writes: tuple[
        Callable[[], None], ...
    ] = ()  # in order: a layerwise store, the policy's (self-conditioning), KLASS's history


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
