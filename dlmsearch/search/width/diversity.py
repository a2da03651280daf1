"""How the particles of a population come to differ.

Token temperature alone hardly diversifies a confident model (its argmax tokens stay likely);
the order in which positions are committed does. Each strategy either perturbs the commit
order (``perturb``: noise added to the base rule's ranking, never to its thresholds) or asks
the engine to sample tokens (``temperature``). ``keep_greedy`` leaves particle 0 as the plain
decoder, so a population never loses the baseline's own path.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import torch

from dlmsearch.core.temperature import DIVERSITY, TemperatureOwner
from dlmsearch.search.records.randomness import Stream
from dlmsearch.search.records.slots import SlotRows, Slots
from dlmsearch.search.records.state import Evaluation
from dlmsearch.search.width.particle_state import ParticleState
from dlmsearch.validation import check_type, number


def varied(slots: Slots, rows: torch.Tensor, keep_greedy: bool) -> torch.Tensor:
    """``[R]`` the rows whose particle departs from the plain decoder: all, or all but particle 0 (``keep_greedy``)."""
    particle = slots.particle[rows]
    return particle > 0 if keep_greedy else torch.ones_like(particle, dtype=torch.bool)


class Diversity(Protocol):
    @property
    def temperature_owner(self) -> TemperatureOwner | None:
        """What it declares where it decides the particles' token temperature (None: it leaves it to the settings)."""

    def token_temperature(self, slots: Slots, rows: torch.Tensor) -> torch.Tensor | None:
        """``[R]`` token temperature for the rows of slots ``rows``, or None: the engine's own."""

    def perturb(self, evaluation: Evaluation, at: SlotRows, state: ParticleState) -> Evaluation:
        """The evaluation the base rule commits from (order noise added where the particle diverges).

        Args:
            evaluation: the model's proposals for the rows (``[R, T]`` per position).
            at: the rows (canvases, slots, call indices, layout; :class:`SlotRows`).
            state: the particles' state (read only: ranks, who has diverged).
        """


@attrs.define
class NoDiversity:
    """Every particle decodes as the plain decoder (a population of one)."""

    @property
    def temperature_owner(self) -> TemperatureOwner | None:
        return None

    def token_temperature(self, slots: Slots, rows: torch.Tensor) -> torch.Tensor | None:
        return None

    def perturb(self, evaluation: Evaluation, at: SlotRows, state: ParticleState) -> Evaluation:
        """``evaluation`` as it is: the plain decoder's proposals.

        Args:
            evaluation: returned unchanged.
            at: the rows (canvases, slots, call indices, layout; :class:`SlotRows`).
            state: unused.
        """
        return evaluation


@attrs.define
class OrderTemperature(NoDiversity):
    """Seeded Gumbel noise of scale ``temperature`` on the commit order's scores: where no
    position clears the rule's threshold, the position committed is drawn from
    ``softmax(confidence / temperature)`` instead of taken as the argmax."""

    temperature: float = number(float, 0.0, default=0.1)
    keep_greedy: bool = attrs.field(default=True, validator=check_type(bool))

    def perturb(self, evaluation: Evaluation, at: SlotRows, state: ParticleState) -> Evaluation:
        """Gumbel noise on the ranking of the rows whose particle varies.

        Args:
            evaluation: ``[R, T]`` proposals; ``order_noise`` is set on its copy.
            at: the rows (canvases, slots, call indices, layout; :class:`SlotRows`).
            state: unused.
        """
        rows, slots, call, layout = at.rows, at.slots, at.call, at.layout
        noisy = varied(slots, rows, self.keep_greedy)
        if self.temperature == 0 or not bool(noisy.any()):
            return evaluation
        uniform = slots.draw(rows, call, layout, Stream.ORDER_NOISE).clamp(1e-12, 1 - 1e-7)
        gumbel = -torch.log(-torch.log(uniform))
        return attrs.evolve(evaluation, order_noise=torch.where(noisy[:, None], self.temperature * gumbel, 0.0))


@attrs.define
class TokenTemperature(NoDiversity):
    """Particles sample their tokens at ``temperature`` (seeded per particle)."""

    temperature: float = number(float, 0.0, default=0.7)
    keep_greedy: bool = attrs.field(default=True, validator=check_type(bool))

    @property
    def temperature_owner(self) -> TemperatureOwner:
        """Every particle's temperature is its own (particle 0's 0 with ``keep_greedy``): the plan refuses one set elsewhere."""
        greedy = " (particle 0: 0.0)" if self.keep_greedy else ""
        return TemperatureOwner(
            DIVERSITY,
            f"the population's diversity TokenTemperature (particles at {self.temperature}{greedy})",
            f"{self.temperature}{greedy}" if greedy else self.temperature,
            "set decoder.population.diversity.temperature instead",
        )

    def token_temperature(self, slots: Slots, rows: torch.Tensor) -> torch.Tensor | None:
        return torch.where(varied(slots, rows, self.keep_greedy), self.temperature, 0.0)


@attrs.define
class DistinctFirst(NoDiversity):
    """Particles of one family (a sample's copies of one state) stay identical, and cost one
    row, until the first uncertain step (the best open position's confidence below
    ``uncertain_below``); there the particle of rank r commits the r-th most confident position
    instead of the first. After resampling (beam) the copies of a survivor split again."""

    uncertain_below: float = number(float, 0.0, 1.0, default=0.9)

    def perturb(self, evaluation: Evaluation, at: SlotRows, state: ParticleState) -> Evaluation:
        """The r-th most confident open position first, for a family's particle of rank r, at its first uncertain step.

        Args:
            evaluation: ``[R, T]`` proposals (``confidence`` ranks the open positions).
            at: the rows (canvases, slots, call indices, layout; :class:`SlotRows`).
            state: the particles' ranks and which families have already split.
        """
        canvas, rows, layout = at.canvas, at.rows, at.layout
        waiting = ~state.diverged[rows]
        if not bool(waiting.any()):
            return evaluation
        open_ = canvas.masked & canvas.unlocked(layout)
        ranked = torch.where(open_, evaluation.confidence, -1.0)
        best = ranked.max(dim=1).values
        split = waiting & open_.any(dim=1) & (best < self.uncertain_below)
        if not bool(split.any()):
            return evaluation
        order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
        pick = state.rank[rows] % open_.sum(dim=1).clamp(min=1)
        target = order.gather(1, pick[:, None]).squeeze(1)
        noise = torch.zeros_like(evaluation.confidence)
        rows = split.nonzero().squeeze(1)
        noise[rows, target[rows]] = 2.0  # above any probability: this position is committed first
        return attrs.evolve(evaluation, order_noise=noise)  # the population marks these slots diverged
