"""What a batch's decoding carries between rounds (:class:`DecodeState`), and the check that a state
is the latest one (its slots' stores move on with every step)."""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.engine.slot_memory import SlotMemory
from dlmsearch.search.plan import DecodePlan
from dlmsearch.search.records.slots import Slots
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.search.records.tree import Tree
from dlmsearch.search.records.usage import Usage


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
    evaluated: torch.Tensor  # [slots] ``evaluation`` is of the current canvas
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
    # [slots] the subtree each slot's last tree search kept, rooted at its canvas (``count`` 0: none); None: no search yet
    tree: Tree | None = None

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


def check_current(state: DecodeState) -> None:
    """Refuse a state older than its slots' stores (they were written for a newer one)."""
    if state.memory_version != state.memory.version:
        raise ValueError(
            f"this decode state is stale: its slots' stores moved on to version {state.memory.version} "
            f"(the state was made at {state.memory_version}); step the state the last step returned"
        )
