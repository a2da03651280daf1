"""What the decode loop asks of a population, and the population of one that answers with no-ops.

The driver knows a population only through this hook: which slots still decode, the token
temperature of a slot's rows, the proposals the base rule commits from (``perturb``), what
happens after a round (``after_round``: the slot each slot continues from), which slot is each
sample's output (``choose``) and what the result records about it (``outcome``). The hook's
own bookkeeping is an opaque ``state`` the driver carries in its frozen decode state and hands
back; :class:`SinglePath` (no state) is the default, and ``dlmsearch.search.width.population``
implements the hook for width search.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
import torch

from dlmsearch.core.temperature import TemperatureOwner
from dlmsearch.search.records.slots import SlotRows, Slots
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.search.records.verifier import Verifier

# One engine step for probe canvases of the given slots (the final re-check of a population).
Evaluate = Callable[[Canvas, torch.Tensor], Evaluation]


@attrs.frozen
class PopulationOutcome:
    """What a population adds to a sample's result (a population of one: the defaults)."""

    particle: int = 0  # the particle chosen as the output
    live_particles: float = 1.0  # particles decoding, averaged over the sample's rounds
    accepted: bool | None = None  # the task verifier's verdict on the output (None: not checked)


@attrs.frozen
class SlotCanvases:
    """The decode's slots at the end of a round (or of the decode): what a population judges,
    resamples and chooses from."""

    canvas: Canvas  # [slots, T] the slots' canvases
    slots: Slots  # the slot table (who each slot is)
    layout: Layout  # the decode's layout (where the generation region is)
    verifier: Verifier | None  # the task's verifier, or None where the task gives none


class PopulationHook(Protocol):
    size: int  # particles per sample
    rechecks: bool  # its final choice re-masks committed positions for the model to re-check (RemaskAgreement)
    temperature_owner: TemperatureOwner | None  # where it decides the token temperature (token_temperature), else None

    def for_verifier(self, verifier: Verifier | None) -> PopulationHook:
        """The population as this task's verifier allows (the decode plan's); fails when it needs what the task does not give."""

    def start(self, slots: Slots) -> Any:
        """The population's state before the first round."""

    def join(self, state: Any, other: Any) -> Any:
        """The state of a decode that ``other``'s samples joined (after this one's)."""

    def keep(self, state: Any, slots: torch.Tensor, samples: torch.Tensor) -> Any:
        """The state with only these slots and samples (the others left the decode)."""

    def running(self, state: Any, slots: Slots) -> torch.Tensor:
        """``[slots]`` the slots that may still decode."""

    def token_temperature(self, state: Any, slots: Slots, rows: torch.Tensor) -> torch.Tensor | None:
        """``[R]`` token temperature for rows of these slots, or None: the engine's own."""

    def perturb(self, evaluation: Evaluation, at: SlotRows, state: Any) -> tuple[Evaluation, Any]:
        """The evaluation the base rule commits from at these slots, and the state after it.

        Args:
            evaluation: the model's proposals for the rows (``[R, T]`` per position).
            at: the rows (canvases, slots, call indices, layout; :class:`SlotRows`).
            state: the population's state.
        """

    def after_round(self, at: SlotCanvases, state: Any, round_index: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        """The state after a round and the slot each slot continues from (None: its own).

        Args:
            at: the slots' canvases, the slot table, the layout and the verifier (:class:`SlotCanvases`).
            state: the population's state.
            round_index: ``[samples]`` each sample's own round.
        """

    def choose(self, at: SlotCanvases, state: Any, evaluate: Evaluate, mask_id: int) -> torch.Tensor:
        """``[samples]`` the slot whose canvas is each sample's output.

        Args:
            at: the slots' canvases, the slot table, the layout and the verifier (:class:`SlotCanvases`).
            state: the population's state.
            evaluate: one engine step for probe canvases of the given slots (the final re-check).
            mask_id: the mask token's id (for the probe canvases).
        """

    def outcome(self, state: Any, slot: int, sample: int) -> PopulationOutcome:
        """What the result of ``sample`` (output slot ``slot``) records about the population."""


@attrs.define
class SinglePath:
    """No population: one slot per sample, decoded by the plain loop."""

    @property
    def size(self) -> int:
        return 1

    @property
    def rechecks(self) -> bool:
        return False

    @property
    def temperature_owner(self) -> None:
        return None

    def for_verifier(self, verifier: Verifier | None) -> SinglePath:
        return self

    def start(self, slots: Slots) -> None:
        return None

    def join(self, state: None, other: None) -> None:
        return None

    def keep(self, state: None, slots: torch.Tensor, samples: torch.Tensor) -> None:
        return None

    def running(self, state: None, slots: Slots) -> torch.Tensor:
        return torch.ones(len(slots), dtype=torch.bool)

    def token_temperature(self, state: None, slots: Slots, rows: torch.Tensor) -> None:
        return None

    def perturb(self, evaluation: Evaluation, at: SlotRows, state: None) -> tuple[Evaluation, None]:
        """The model's own proposals; no state.

        Args:
            evaluation: returned unchanged.
            at: the rows (canvases, slots, call indices, layout; :class:`SlotRows`).
            state: None (a single path keeps none).
        """
        return evaluation, None

    def after_round(self, at: SlotCanvases, state: None, round_index: torch.Tensor) -> tuple[None, None]:
        """Nothing to judge or resample: no state, every slot continues from itself.

        Args:
            at: the slots' canvases, the slot table, the layout and the verifier (:class:`SlotCanvases`).
            state: None.
            round_index: unused.
        """
        return None, None

    def choose(self, at: SlotCanvases, state: None, evaluate: Evaluate, mask_id: int) -> torch.Tensor:
        """``[samples]`` each sample's one slot (slot = sample).

        Args:
            at: the slots' canvases, the slot table, the layout and the verifier (:class:`SlotCanvases`).
            state: None.
            evaluate: unused (no re-check).
            mask_id: unused.
        """
        slots = at.slots
        return torch.arange(slots.samples)

    def outcome(self, state: None, slot: int, sample: int) -> PopulationOutcome:
        return PopulationOutcome()
