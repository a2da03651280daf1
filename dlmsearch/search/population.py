"""Width search: each sample carries a population of partial canvases (particles).

Particles are slots of the one decode loop (``slot = sample * size + particle``): the engine
forwards all particles of all samples, and their lookahead branches, in the same batched calls,
and particles of a sample that hold the same canvas share one forward. A population says how
its particles diverge (``diversity``), when they are pruned or resampled (``resampling``), how
they are scored (``score``) and which one is the output (``choice``); with a task verifier it
may end particles whose partial output breaks the task's rules (``prune_conflicts``) and stop a
sample once a complete particle is accepted (``stop_when_accepted``). ``size: 1`` is the plain
decoder, token for token.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch

from dlmsearch.search.diversity import Diversity, NoDiversity
from dlmsearch.search.randomness import Stream, hashed_uniform
from dlmsearch.search.final_choice import BestScore, FinalChoice
from dlmsearch.search.particle_scores import ParticleView, WeightedSum
from dlmsearch.search.resampling import NoResampling, Resampling
from dlmsearch.search.state import Canvas, Evaluation, Layout
from dlmsearch.search.verifier import Verifier
from dlmsearch.validation import check_type, number


@attrs.define(eq=False)
class Particles:
    """The state of one batch's populations, per slot (``[samples * size]``) or per sample."""

    size: int
    seed: int
    uid: torch.Tensor  # [slots] the sample's dataset-wide id
    owner: torch.Tensor  # [slots] sample index within the batch
    particle: torch.Tensor  # [slots] particle index within its sample
    rank: torch.Tensor  # [slots] rank within its family (copies of one state): who commits what at a split
    diverged: torch.Tensor  # [slots] the family has split since it was formed
    alive: torch.Tensor  # [slots] False: ended by the verifier
    verdict: torch.Tensor  # [slots] -1 not yet checked, 0 rejected, 1 accepted by the verifier
    base_score: torch.Tensor  # [slots] score at the last resampling point
    stopped: torch.Tensor  # [samples] a particle was accepted and the sample stopped early
    live_total: torch.Tensor  # [samples] particles decoding, summed over the sample's rounds
    rounds: torch.Tensor  # [samples] rounds in which the sample decoded

    @classmethod
    def start(cls, uid: torch.Tensor, size: int, seed: int) -> "Particles":
        samples = len(uid)
        slots = samples * size
        return cls(
            size=size,
            seed=seed,
            uid=uid.repeat_interleave(size),
            owner=torch.arange(samples).repeat_interleave(size),
            particle=torch.arange(size).repeat(samples),
            rank=torch.arange(size).repeat(samples),
            diverged=torch.zeros(slots, dtype=torch.bool),
            alive=torch.ones(slots, dtype=torch.bool),
            verdict=torch.full((slots,), -1, dtype=torch.long),
            base_score=torch.zeros(slots),
            stopped=torch.zeros(samples, dtype=torch.bool),
            live_total=torch.zeros(samples),
            rounds=torch.zeros(samples),
        )

    def running(self) -> torch.Tensor:
        """``[slots]`` particles that may still decode."""
        return self.alive & ~self.stopped[self.owner]

    def draw(self, slots: torch.Tensor, call: torch.Tensor, layout: Layout, stream: Stream) -> torch.Tensor:
        """``[R, width]`` seeded uniforms keyed by (seed, sample, call, particle, generation
        position, stream): the same whatever the batch's padding."""
        position = torch.arange(layout.width) - layout.gen_start
        keys = [torch.tensor(self.seed), self.uid[slots, None], call[:, None], self.particle[slots, None], position[None, :], torch.tensor(stream)]
        return hashed_uniform(keys)

    def adopt(self, source: torch.Tensor, resampled: torch.Tensor) -> None:
        """Slot ``i`` continues from slot ``source[i]``; in the ``resampled`` samples, copies of
        one state form a family that splits again (ranks 0, 1, ... with the state's own slot first)."""
        moved = source != torch.arange(len(source))
        for name in ("alive", "verdict", "base_score"):
            setattr(self, name, getattr(self, name)[source])
        family = torch.bincount(source, minlength=len(source))
        # rank: the original keeps rank 0 where it survived; copies count up in slot order
        slots = len(source)
        order = torch.argsort(source * 2 * slots + moved.long() * slots + torch.arange(slots))
        grouped = source[order]
        starts = torch.ones(slots, dtype=torch.bool)
        starts[1:] = grouped[1:] != grouped[:-1]
        position = torch.arange(slots)
        first = torch.where(starts, position, 0).cummax(dim=0).values
        rank = torch.empty_like(source)
        rank[order] = position - first
        self.rank = torch.where(resampled, rank, self.rank)
        self.diverged = torch.where(resampled, self.diverged[source] & (family[source] == 1), self.diverged)


@attrs.define
class Population:
    """Particles per sample and the components that steer them (see the module doc)."""

    size: int = number(int, 1, default=1)
    diversity: Diversity = attrs.field(factory=NoDiversity)
    resampling: Resampling = attrs.field(factory=NoResampling)
    choice: FinalChoice = attrs.field(factory=BestScore)
    score: WeightedSum = attrs.field(factory=WeightedSum)
    prune_conflicts: bool = attrs.field(default=False, validator=check_type(bool))
    stop_when_accepted: bool = attrs.field(default=False, validator=check_type(bool))

    @property
    def needs_verifier(self) -> bool:
        return self.prune_conflicts or self.stop_when_accepted or self.choice.needs_verifier or self.score.needs_verifier

    def check(self, verifier: Verifier | None) -> None:
        """Fail before decoding when a component needs a verifier the task does not give."""
        if self.needs_verifier and verifier is None:
            raise ValueError("this decoder's population needs a task verifier (prune_conflicts, stop_when_accepted, a verified or voted choice, or a consistency score); the task gives none")
        if self.prune_conflicts and verifier is not None and not verifier.checks_partial:
            raise ValueError(
                f"population.prune_conflicts needs a verifier that checks partial outputs; this task's ({type(verifier).__name__}) "
                "checks complete ones only: set decoder.population.prune_conflicts=false"
            )

    def token_temperature(self, particles: Particles, slots: torch.Tensor) -> torch.Tensor | None:
        return None if self.size == 1 else self.diversity.token_temperature(particles, slots)

    def perturb(self, evaluation: Evaluation, canvas: Canvas, slots: torch.Tensor, particles: Particles, call: torch.Tensor, layout: Layout) -> Evaluation:
        """The diversity's proposals (components only read the particles); slots whose commit
        order it changed are marked diverged here, in the population's own state."""
        if self.size == 1:
            return evaluation
        perturbed = self.diversity.perturb(evaluation, canvas, slots, particles, call, layout)
        if perturbed.order_noise is not None:
            particles.diverged[slots] |= (perturbed.order_noise != 0).any(dim=1)
        return perturbed

    def view(self, canvas: Canvas, particles: Particles, layout: Layout, verifier: Verifier | None, remask: torch.Tensor | None = None) -> ParticleView:
        gen = slice(layout.gen_start, layout.width)
        committed = canvas.commit_call[:, gen] >= 0
        log_confidence = torch.where(committed, torch.log(canvas.commit_confidence[:, gen].clamp(min=1e-30)), 0.0)
        return ParticleView(particles.owner, canvas.tokens[:, gen], canvas.masked[:, gen], committed, log_confidence, verifier, remask)

    def recheck(self, canvas: Canvas, particles: Particles, mask_id: int, evaluate: Callable[[Canvas, torch.Tensor], Evaluation]) -> torch.Tensor | None:
        """The model's re-check of complete particles (:class:`RemaskAgreement`), in one step
        over every sample that still has a choice to make; None where no score asks for it."""
        groups = self.score.remask_groups
        samples, size = len(particles.stopped), self.size
        if not groups or size == 1:
            return None
        complete = particles.alive & ~canvas.masked.any(dim=1) & ~particles.stopped[particles.owner]
        choosing = complete.view(samples, size).sum(dim=1) > 1
        slots = (complete & choosing[particles.owner]).nonzero().squeeze(1)
        scores = torch.zeros(len(complete))
        if not slots.numel():
            return scores
        rows = slots.repeat_interleave(groups)
        group = torch.arange(groups).repeat(len(slots))
        committed = canvas.commit_call[rows] >= 0
        remasked = committed & ((committed.long().cumsum(dim=1) - 1) % groups == group[:, None])
        probe = attrs.evolve(canvas.take(rows), tokens=torch.where(remasked, mask_id, canvas.tokens[rows]), masked=remasked)
        evaluation = evaluate(probe, rows)
        agree = evaluation.token == canvas.tokens[rows]
        confidence = evaluation.confidence.clamp(1e-30, 1 - 1e-7)
        log_p = torch.where(remasked, torch.where(agree, torch.log(confidence), torch.log1p(-confidence)), 0.0).sum(dim=1)
        total = torch.zeros(len(complete)).index_add_(0, rows, log_p)
        count = torch.zeros(len(complete)).index_add_(0, rows, remasked.sum(dim=1).float())
        scores[slots] = total[slots] / count[slots].clamp(min=1)
        return scores

    def after_round(self, canvas: Canvas, particles: Particles, layout: Layout, round_index: int, verifier: Verifier | None) -> torch.Tensor | None:
        """End conflicting particles, judge finished ones, stop accepted samples, and resample
        at the policy's rounds. Returns the slot each slot continues from (None: unchanged)."""
        samples, size = len(particles.stopped), self.size
        running = particles.running()
        open_ = canvas.masked.any(dim=1)
        decoding = (running & open_).view(samples, size).sum(dim=1)
        particles.live_total += decoding
        particles.rounds += decoding > 0
        if size == 1 and not self.needs_verifier:
            return None
        gen = slice(layout.gen_start, layout.width)
        tokens, masked = canvas.tokens[:, gen], canvas.masked[:, gen]
        if self.prune_conflicts and verifier is not None:
            rows = running.nonzero().squeeze(1)
            bad = torch.zeros_like(running)
            bad[rows] = ~verifier.consistent(particles.owner[rows], tokens[rows], masked[rows])
            spared = (running & ~bad).view(samples, size).any(dim=1)  # never end a sample's last particles
            particles.alive &= ~(bad & spared[particles.owner])
        unchecked = particles.alive & ~open_ & (particles.verdict < 0)
        if verifier is not None and bool(unchecked.any()):
            rows = unchecked.nonzero().squeeze(1)
            particles.verdict[rows] = verifier.accepts(particles.owner[rows], tokens[rows]).long()
        if self.stop_when_accepted:
            particles.stopped |= (particles.alive & (particles.verdict == 1)).view(samples, size).any(dim=1)
        every = self.resampling.every
        if size == 1 or not every or (round_index + 1) % every:
            return None
        scores = self.score(self.view(canvas, particles, layout, verifier))
        candidates = particles.alive & ~particles.stopped[particles.owner]
        busy = (candidates & open_).view(samples, size).any(dim=1)  # resample only where something still decodes
        uniform = hashed_uniform([torch.tensor(particles.seed), particles.uid.view(samples, size)[:, 0], torch.tensor(round_index), torch.tensor(Stream.RESAMPLING)])
        source = self.resampling.sources(
            scores.view(samples, size), particles.base_score.view(samples, size), (candidates.view(samples, size) & busy[:, None]),
            tokens.view(samples, size, -1), uniform,
        )
        if source is None:
            return None
        changed = (source != torch.arange(size)).any(dim=1)  # per sample: its own business, whatever the batch
        if not bool(changed.any()):
            return None
        slots = (source + torch.arange(samples)[:, None] * size).flatten()
        moved = changed[particles.owner]
        particles.base_score = torch.where(moved, scores, particles.base_score)
        particles.adopt(slots, moved)
        return slots

    def choose(
        self, canvas: Canvas, particles: Particles, layout: Layout, verifier: Verifier | None,
        evaluate: Callable[[Canvas, torch.Tensor], Evaluation], mask_id: int,
    ) -> torch.Tensor:
        """``[samples]`` the slot whose canvas is each sample's output. Where a score asks for the
        model's re-check, it is computed here through ``evaluate`` (one engine step for probe
        canvases of the given slots)."""
        samples, size = len(particles.stopped), self.size
        if size == 1:
            return torch.arange(samples)
        view = self.view(canvas, particles, layout, verifier, self.recheck(canvas, particles, mask_id, evaluate))
        scores = self.score(view).view(samples, size)
        complete = (particles.alive & ~canvas.masked.any(dim=1)).view(samples, size)
        candidates = torch.where(complete.any(dim=1, keepdim=True), complete, ~canvas.masked.any(dim=1).view(samples, size))
        accepted = (particles.verdict == 1).view(samples, size)
        candidates = torch.where(particles.stopped[:, None], candidates & accepted, candidates)  # a stopped sample's output is what stopped it
        particle = self.choice.choose(scores, candidates, accepted, view.tokens.view(samples, size, -1), verifier)
        return torch.arange(samples) * size + particle
