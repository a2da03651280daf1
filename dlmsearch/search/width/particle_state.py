"""What a population keeps about its particles between rounds, as one frozen record.

Apart from the slot table (:class:`~dlmsearch.search.records.slots.Slots`: who each slot is), this is
what a population learns as it goes: which particles are alive, what the verifier said, each
family's ranks (who commits what when copies of one state split) and the per-sample counts
behind ``live_particles``. Diversity components read it; only the population writes a new one.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.records.slots import Slots


@attrs.frozen(eq=False)
class ParticleState:
    """What a population keeps about its particles, per slot (``[samples * size]``) or per
    sample; updates return a new record (the slot table itself is :class:`Slots`)."""

    rank: torch.Tensor  # [slots] rank within its family (copies of one state): who commits what at a split
    diverged: torch.Tensor  # [slots] the family has split since it was formed
    alive: torch.Tensor  # [slots] False: ended by the verifier
    verdict: torch.Tensor  # [slots] -1 not yet checked, 0 rejected, 1 accepted by the verifier
    base_score: torch.Tensor  # [slots] score at the last resampling point
    stopped: torch.Tensor  # [samples] a particle was accepted and the sample stopped early
    live_total: torch.Tensor  # [samples] particles decoding, summed over the sample's rounds
    rounds: torch.Tensor  # [samples] rounds in which the sample decoded

    @classmethod
    def start(cls, slots: Slots) -> ParticleState:
        count, samples = len(slots), slots.samples
        return cls(
            rank=slots.particle.clone(),
            diverged=torch.zeros(count, dtype=torch.bool),
            alive=torch.ones(count, dtype=torch.bool),
            verdict=torch.full((count,), -1, dtype=torch.long),
            base_score=torch.zeros(count),
            stopped=torch.zeros(samples, dtype=torch.bool),
            live_total=torch.zeros(samples),
            rounds=torch.zeros(samples),
        )

    def running(self, slots: Slots) -> torch.Tensor:
        """``[slots]`` particles that may still decode."""
        return self.alive & ~self.stopped[slots.owner]

    def adopt(self, source: torch.Tensor, resampled: torch.Tensor) -> ParticleState:
        """Slot ``i`` continues from slot ``source[i]``; in the ``resampled`` samples, copies of
        one state form a family that splits again (ranks 0, 1, ... with the state's own slot first)."""
        moved = source != torch.arange(len(source))
        family = torch.bincount(source, minlength=len(source))
        # rank: the original keeps rank 0 where it survived; copies count up in slot order
        count = len(source)
        order = torch.argsort(source * 2 * count + moved.long() * count + torch.arange(count))
        grouped = source[order]
        starts = torch.ones(count, dtype=torch.bool)
        starts[1:] = grouped[1:] != grouped[:-1]
        position = torch.arange(count)
        first = torch.where(starts, position, 0).cummax(dim=0).values
        rank = torch.empty_like(source)
        rank[order] = position - first
        return attrs.evolve(
            self,
            alive=self.alive[source],
            verdict=self.verdict[source],
            base_score=self.base_score[source],
            rank=torch.where(resampled, rank, self.rank),
            diverged=torch.where(resampled, self.diverged[source] & (family[source] == 1), self.diverged),
        )

    def joined(self, other: ParticleState) -> ParticleState:
        """``other``'s slots and samples after these (samples joining a decode)."""
        return ParticleState(
            **{f.name: torch.cat([getattr(self, f.name), getattr(other, f.name)]) for f in attrs.fields(ParticleState)}
        )

    def kept(self, slots: torch.Tensor, samples: torch.Tensor) -> ParticleState:
        """Only these slots and samples (the others left the decode)."""
        per_sample = {"stopped", "live_total", "rounds"}
        return ParticleState(
            **{
                f.name: getattr(self, f.name)[samples if f.name in per_sample else slots]
                for f in attrs.fields(ParticleState)
            }
        )
