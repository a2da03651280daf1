"""The slot table: which sample and which particle each row of the decode state is.

A batch of ``samples`` with populations of ``size`` has ``samples * size`` slots
(``slot = sample * size + particle``). The table never changes during a decode: resampling
moves canvases between slots, not slots between samples. It keys every seeded draw, so it
sits apart from what a population keeps about its particles (``population.ParticleState``).
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.core.sampling import Sampling
from dlmsearch.search.records.randomness import Stream, hashed_uniform
from dlmsearch.search.records.row_sampling import RowSampling
from dlmsearch.search.records.state import Canvas, Layout


@attrs.frozen(eq=False)
class Slots:
    """Per slot: the sample's ``uid`` (its name in the decode), the ``seed`` and ``key`` its
    randomness is keyed by (by default the engine's seed and the uid: a dataset's item ``i`` is
    keyed ``i``; a server's requests are each item 0 of their own seed), its index in the batch
    (``owner``), the ``particle``, and the generation columns that are the sample's output
    (``region``: all of them, except on a block-diffusion canvas, where the prompt's partial last
    block leads the generation region and shorter rows end early)."""

    size: int  # particles per sample
    seed: torch.Tensor  # [slots]
    key: torch.Tensor  # [slots]
    uid: torch.Tensor  # [slots]
    owner: torch.Tensor  # [slots]
    particle: torch.Tensor  # [slots]
    region: torch.Tensor  # [slots, 2] first and end generation column of the sample's output
    sampling: RowSampling  # each slot's temperature, top-p and top-k (its request's, over the decode's)
    # each slot's value of the commit rule's row options (name -> [slots] float64; its request's, else the rule's)
    options: dict[str, torch.Tensor] = attrs.field(factory=dict)

    @classmethod
    def start(
        cls,
        uid: torch.Tensor,
        size: int,
        seed: torch.Tensor,
        region: torch.Tensor,
        key: torch.Tensor | None = None,
        sampling: RowSampling | None = None,
        options: dict[str, torch.Tensor] | None = None,
    ) -> Slots:
        """The table of ``len(uid)`` samples with ``size`` particles each.

        Args:
            uid: ``[samples]`` each sample's name in the decode.
            size: particles per sample.
            seed: ``[samples]`` (or one) the draws' first key.
            region: ``[samples, 2]`` its output columns within the generation region.
            key: ``[samples]`` the draws' second key (None: the uid).
            sampling: each sample's temperature, top-p and top-k (None: greedy, untruncated).
            options: each sample's values of the commit rule's row options (name -> ``[samples]``).
        """
        samples = len(uid)
        sampling = RowSampling.uniform(Sampling(), samples) if sampling is None else sampling
        per_slot = lambda values: values.repeat_interleave(size, dim=0)
        return cls(
            size=size,
            seed=per_slot(torch.broadcast_to(torch.as_tensor(seed, dtype=torch.long), (samples,))),
            key=per_slot(uid if key is None else key),
            uid=uid.repeat_interleave(size),
            owner=torch.arange(samples).repeat_interleave(size),
            particle=torch.arange(size).repeat(samples),
            region=region.repeat_interleave(size, dim=0),
            sampling=sampling.repeated(size),
            options={name: values.repeat_interleave(size) for name, values in (options or {}).items()},
        )

    def joined(self, other: Slots) -> Slots:
        """``other``'s slots after these, its samples numbered after these (samples joining a decode)."""
        if other.size != self.size:
            raise ValueError(f"cannot join slot tables of {self.size} and {other.size} particles per sample")
        cat = lambda a, b: torch.cat([a, b])
        return Slots(
            self.size,
            cat(self.seed, other.seed),
            cat(self.key, other.key),
            cat(self.uid, other.uid),
            cat(self.owner, other.owner + self.samples),
            cat(self.particle, other.particle),
            cat(self.region, other.region),
            self.sampling.joined(other.sampling),
            {name: cat(values, other.options[name]) for name, values in self.options.items()},
        )

    def kept(self, samples: torch.Tensor) -> tuple[Slots, torch.Tensor]:
        """The table of only these samples (renumbered in order), and the slots they keep."""
        slot = (samples[:, None] * self.size + torch.arange(self.size)[None, :]).flatten()
        owner = torch.arange(len(samples)).repeat_interleave(self.size)
        return Slots(
            self.size,
            self.seed[slot],
            self.key[slot],
            self.uid[slot],
            owner,
            self.particle[slot],
            self.region[slot],
            self.sampling.take(slot),
            {name: values[slot] for name, values in self.options.items()},
        ), slot

    def options_at(self, slot: torch.Tensor) -> dict[str, torch.Tensor]:
        """The commit rule's row options of these slots (name -> ``[rows]``), for :func:`commit.per_row`."""
        return {name: values[slot] for name, values in self.options.items()}

    @property
    def samples(self) -> int:
        return len(self.uid) // self.size

    def __len__(self) -> int:
        return len(self.uid)

    def draw(self, rows: torch.Tensor, call: torch.Tensor, layout: Layout, stream: Stream) -> torch.Tensor:
        """``[R, width]`` seeded uniforms keyed by (seed, sample, call, particle, generation
        position, stream) for the slots ``rows``: the same whatever the batch's padding."""
        position = torch.arange(layout.width) - layout.gen_start
        keys = [
            self.seed[rows, None],
            self.key[rows, None],
            call[:, None],
            self.particle[rows, None],
            position[None, :],
            torch.tensor(stream),
        ]
        return hashed_uniform(keys)


@attrs.frozen
class SlotRows:
    """Rows of one call, each a slot's canvas: what a population reads to perturb the base rule's proposals."""

    canvas: Canvas  # [R, T] the rows' canvases
    rows: torch.Tensor  # [R] the slot of each row
    slots: Slots  # the slot table (who each slot is: sample, particle, seed)
    call: torch.Tensor  # [R] each row's call index (seeds the draws)
    layout: Layout  # the decode's layout
