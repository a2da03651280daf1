"""Width search: each sample carries a population of partial canvases (particles).

Particles are slots of the one decode loop (``slot = sample * size + particle``): the engine
forwards all particles of all samples, and their lookahead branches, in the same batched calls,
and particles of a sample that hold the same canvas share one forward. A population says how
its particles diverge (``diversity``), when they are pruned or resampled (``resampling``), how
they are scored (``score``) and which one is the output (``choice``); with a task verifier it
may end particles whose partial output breaks the task's rules (``prune_conflicts``) and stop a
sample once a complete particle is accepted (``stop_when_accepted``). ``size: 1`` is the plain
decoder, token for token. :class:`Population` implements the driver's
:class:`~dlmsearch.search.width.population_hook.PopulationHook`; its bookkeeping is a frozen
:class:`ParticleState` beside the slot table (:class:`~dlmsearch.search.records.slots.Slots`).
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.core.temperature import TemperatureOwner
from dlmsearch.search.records.randomness import Stream, hashed_uniform
from dlmsearch.search.records.slots import SlotRows, Slots
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.search.width.diversity import Diversity, NoDiversity
from dlmsearch.search.width.final_choice import BestScore, FinalChoice, Finalists
from dlmsearch.search.width.particle_scores import ParticleView, WeightedSum
from dlmsearch.search.width.particle_state import ParticleState
from dlmsearch.search.width.population_hook import Evaluate, PopulationOutcome, SlotCanvases
from dlmsearch.search.width.resampling import NoResampling, Resampling, ResamplingPoint
from dlmsearch.validation import check_type, number


def _generated(values: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``[slots, n]`` the generation region of a per-position ``[slots, T]`` tensor."""
    return values[:, layout.gen_start : layout.width]


def _check_prune(value: object) -> None:
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"population.prune_conflicts must be true, false or auto, got {value!r}")


@attrs.define
class Population:
    """Particles per sample and the components that steer them (see the module doc)."""

    size: int = number(int, 1, default=1)
    diversity: Diversity = attrs.field(factory=NoDiversity)
    resampling: Resampling = attrs.field(factory=NoResampling)
    choice: FinalChoice = attrs.field(factory=BestScore)
    score: WeightedSum = attrs.field(factory=WeightedSum)
    prune_conflicts: bool | str = attrs.field(
        default=False, validator=lambda _, a, v: _check_prune(v)
    )  # true | false | auto (where the verifier checks partial outputs)
    stop_when_accepted: bool = attrs.field(default=False, validator=check_type(bool))

    @property
    def needs_verifier(self) -> bool:
        return (
            self.prune_conflicts is True
            or self.stop_when_accepted
            or self.choice.needs_verifier
            or self.score.needs_verifier
        )

    @property
    def rechecks(self) -> bool:
        """Its final choice asks the model to re-check re-masked groups of committed positions."""
        return self.size > 1 and bool(self.score.remask_groups)

    def for_verifier(self, verifier: Verifier | None) -> Population:
        """The population as the task's verifier allows (the decode plan's; this one is not written):
        ``prune_conflicts=auto`` prunes on partial outputs where the verifier checks them and
        keeps only the final check where it does not; ``true`` needs such a verifier. Fails
        before decoding when a component needs a verifier the task does not give."""
        prune = self.prune_conflicts
        if prune == "auto":
            prune = verifier is not None and verifier.checks_partial
        resolved = attrs.evolve(self, prune_conflicts=prune)
        if resolved.needs_verifier and verifier is None:
            raise ValueError(
                "this decoder's population needs a task verifier (prune_conflicts, stop_when_accepted, a verified or "
                f"voted choice, or a consistency score); the task gives none: use `{' '.join(resolved.unverified())}`"
            )
        if prune and verifier is not None and not verifier.checks_partial:
            raise ValueError(
                f"population.prune_conflicts needs a verifier that checks partial outputs; this task's ({type(verifier).__name__}) "
                "checks complete ones only: use `decoder.population.prune_conflicts=auto` (prune where the task can)"
            )
        return resolved

    def unverified(self) -> list[str]:
        """The overrides that leave this population nothing that reads a task verifier (a refusal's fix)."""
        fix = ["decoder.population.prune_conflicts=auto"] * (self.prune_conflicts is True)
        fix += ["decoder.population.stop_when_accepted=false"] * self.stop_when_accepted
        fix += ["decoder/population/choice=best_score"] * self.choice.needs_verifier
        return fix + ["decoder/population/score=log_probability"] * self.score.needs_verifier

    def start(self, slots: Slots) -> ParticleState:
        return ParticleState.start(slots)

    def join(self, state: ParticleState, other: ParticleState) -> ParticleState:
        return state.joined(other)

    def keep(self, state: ParticleState, slots: torch.Tensor, samples: torch.Tensor) -> ParticleState:
        return state.kept(slots, samples)

    def running(self, state: ParticleState, slots: Slots) -> torch.Tensor:
        return state.running(slots)

    @property
    def temperature_owner(self) -> TemperatureOwner | None:
        """The diversity's, where it decides the particles' temperature (a population of one: the plain decoder's)."""
        return None if self.size == 1 else self.diversity.temperature_owner

    def token_temperature(self, state: ParticleState, slots: Slots, rows: torch.Tensor) -> torch.Tensor | None:
        return None if self.size == 1 else self.diversity.token_temperature(slots, rows)

    def perturb(self, evaluation: Evaluation, at: SlotRows, state: ParticleState) -> tuple[Evaluation, ParticleState]:
        """The diversity's proposals (components only read the particles); slots whose commit
        order it changed are marked diverged here, in the population's own state.

        Args:
            evaluation: the model's proposals for the rows (``[R, T]`` per position).
            at: the rows (canvases, slots, call indices, layout; :class:`SlotRows`).
            state: the particles' state before the proposals.
        """
        if self.size == 1:
            return evaluation, state
        perturbed = self.diversity.perturb(evaluation, at, state)
        if perturbed.order_noise is None:
            return perturbed, state
        diverged = state.diverged.clone()
        diverged[at.rows] |= (perturbed.order_noise != 0).any(dim=1)
        return perturbed, attrs.evolve(state, diverged=diverged)

    def view(
        self,
        canvas: Canvas,
        slots: Slots,
        layout: Layout,
        verifier: Verifier | None,
        remask: torch.Tensor | None = None,
    ) -> ParticleView:
        committed = _generated(canvas.commit_call, layout) >= 0
        confidence = _generated(canvas.commit_confidence, layout)
        log_confidence = torch.where(committed, torch.log(confidence.clamp(min=1e-30)), 0.0)
        tokens, masked = _generated(canvas.tokens, layout), _generated(canvas.masked, layout)
        return ParticleView(slots.owner, tokens, masked, committed, log_confidence, verifier, remask)

    def recheck(
        self, canvas: Canvas, slots: Slots, state: ParticleState, mask_id: int, evaluate: Evaluate
    ) -> torch.Tensor | None:
        """The model's re-check of complete particles (:class:`RemaskAgreement`), in one step
        over every sample that still has a choice to make; None where no score asks for it."""
        groups = self.score.remask_groups
        samples, size = slots.samples, self.size
        if not groups or size == 1:
            return None
        complete = state.alive & ~canvas.masked.any(dim=1) & ~state.stopped[slots.owner]
        choosing = complete.view(samples, size).sum(dim=1) > 1
        chosen = (complete & choosing[slots.owner]).nonzero().squeeze(1)
        scores = torch.zeros(len(complete))
        if not chosen.numel():
            return scores
        rows = chosen.repeat_interleave(groups)
        group = torch.arange(groups).repeat(len(chosen))
        committed = canvas.commit_call[rows] >= 0
        remasked = committed & ((committed.long().cumsum(dim=1) - 1) % groups == group[:, None])
        probe = attrs.evolve(
            canvas.take(rows), tokens=torch.where(remasked, mask_id, canvas.tokens[rows]), masked=remasked
        )
        evaluation = evaluate(probe, rows)
        agree = evaluation.token == canvas.tokens[rows]
        confidence = evaluation.confidence.clamp(1e-30, 1 - 1e-7)
        log_p = torch.where(remasked, torch.where(agree, torch.log(confidence), torch.log1p(-confidence)), 0.0).sum(
            dim=1
        )
        total = torch.zeros(len(complete)).index_add_(0, rows, log_p)
        count = torch.zeros(len(complete)).index_add_(0, rows, remasked.sum(dim=1).float())
        scores[chosen] = total[chosen] / count[chosen].clamp(min=1)
        return scores

    def after_round(
        self, at: SlotCanvases, state: ParticleState, round_index: torch.Tensor
    ) -> tuple[ParticleState, torch.Tensor | None]:
        """End conflicting particles, judge finished ones, stop accepted samples, and resample
        at the policy's rounds (each sample on its own schedule, so a sample that joined a decode
        later resamples on its own).

        Args:
            at: the slots' canvases, the slot table, the layout and the verifier (:class:`SlotCanvases`).
            state: the particles' state before the round's judgement.
            round_index: ``[samples]`` each sample's own round.

        Returns:
            The new state and ``[samples * size]`` the slot each slot continues from (None: unchanged).
        """
        canvas, slots, layout, verifier = at.canvas, at.slots, at.layout, at.verifier
        samples, size = slots.samples, self.size
        running = state.running(slots)
        open_ = canvas.masked.any(dim=1)
        decoding = (running & open_).view(samples, size).sum(dim=1)
        state = attrs.evolve(state, live_total=state.live_total + decoding, rounds=state.rounds + (decoding > 0))
        if size == 1 and not self.needs_verifier:
            return state, None
        if verifier is not None:
            state = self._judge(canvas, slots, state, layout, verifier)
        every = self.resampling.every
        due = (round_index + 1) % every == 0 if every else torch.zeros(samples, dtype=torch.bool)
        if size == 1 or not bool(due.any()):
            return state, None
        return self._resample(at, state, round_index, due)

    def _judge(
        self, canvas: Canvas, slots: Slots, state: ParticleState, layout: Layout, verifier: Verifier
    ) -> ParticleState:
        """End the running particles whose partial output conflicts (``prune_conflicts``; never a
        sample's last ones), judge the complete ones not yet judged, and stop the samples with an
        accepted particle (``stop_when_accepted``)."""
        tokens, masked = _generated(canvas.tokens, layout), _generated(canvas.masked, layout)
        samples, size = slots.samples, self.size
        if self.prune_conflicts:
            running = state.running(slots)
            rows = running.nonzero().squeeze(1)
            bad = torch.zeros_like(running)
            bad[rows] = ~verifier.consistent(slots.owner[rows], tokens[rows], masked[rows])
            spared = (running & ~bad).view(samples, size).any(dim=1)  # never end a sample's last particles
            state = attrs.evolve(state, alive=state.alive & ~(bad & spared[slots.owner]))
        unchecked = state.alive & ~canvas.masked.any(dim=1) & (state.verdict < 0)
        if bool(unchecked.any()):
            rows = unchecked.nonzero().squeeze(1)
            verdict = state.verdict.clone()
            verdict[rows] = verifier.accepts(slots.owner[rows], tokens[rows]).long()
            state = attrs.evolve(state, verdict=verdict)
        if self.stop_when_accepted:
            state = attrs.evolve(
                state, stopped=state.stopped | (state.alive & (state.verdict == 1)).view(samples, size).any(dim=1)
            )
        return state

    def _resample(
        self, at: SlotCanvases, state: ParticleState, round_index: torch.Tensor, due: torch.Tensor
    ) -> tuple[ParticleState, torch.Tensor | None]:
        """The resampling policy's sources where it is ``due`` and the sample still decodes
        (``round_index [samples]``, each sample's own round, seeds the policy's draw); ``state``
        is the particles' state after the round's judgement.

        Returns:
            The new state (the moved slots adopt their sources' state and score) and
            ``[samples * size]`` the slot each slot continues from, or None where nothing moves.
        """
        canvas, slots, layout, verifier = at.canvas, at.slots, at.layout, at.verifier
        samples, size = slots.samples, self.size
        scores = self.score(self.view(canvas, slots, layout, verifier))
        candidates = state.alive & ~state.stopped[slots.owner]
        decoding = (candidates & canvas.masked.any(dim=1)).view(samples, size).any(dim=1)
        busy = decoding & due  # resample only where something still decodes
        uniform = hashed_uniform(
            [
                slots.seed.view(samples, size)[:, 0],
                slots.key.view(samples, size)[:, 0],
                round_index,
                torch.tensor(Stream.RESAMPLING),
            ]
        )
        point = ResamplingPoint(
            scores.view(samples, size),
            state.base_score.view(samples, size),
            (candidates.view(samples, size) & busy[:, None]),
            _generated(canvas.tokens, layout).view(samples, size, -1),
            uniform,
        )
        source = self.resampling.sources(point)
        if source is None:
            return state, None
        changed = (source != torch.arange(size)).any(dim=1)  # per sample: its own business, whatever the batch
        if not bool(changed.any()):
            return state, None
        moved_from = (source + torch.arange(samples)[:, None] * size).flatten()
        moved = changed[slots.owner]
        state = attrs.evolve(state, base_score=torch.where(moved, scores, state.base_score))
        return state.adopt(moved_from, moved), moved_from

    def choose(self, at: SlotCanvases, state: ParticleState, evaluate: Evaluate, mask_id: int) -> torch.Tensor:
        """``[samples]`` the slot whose canvas is each sample's output. Where a score asks for the
        model's re-check, it is computed here through ``evaluate`` (one engine step for probe
        canvases of the given slots).

        Args:
            at: the slots' canvases, the slot table, the layout and the verifier (:class:`SlotCanvases`).
            state: the particles' state (alive, verdicts, stopped samples).
            evaluate: one engine step for probe canvases of the given slots (:meth:`recheck`).
            mask_id: the mask token's id (for the probe canvases).
        """
        canvas, slots, layout, verifier = at.canvas, at.slots, at.layout, at.verifier
        samples, size = slots.samples, self.size
        if size == 1:
            return torch.arange(samples)
        view = self.view(canvas, slots, layout, verifier, self.recheck(canvas, slots, state, mask_id, evaluate))
        scores = self.score(view).view(samples, size)
        complete = (state.alive & ~canvas.masked.any(dim=1)).view(samples, size)
        candidates = torch.where(
            complete.any(dim=1, keepdim=True), complete, ~canvas.masked.any(dim=1).view(samples, size)
        )
        accepted = (state.verdict == 1).view(samples, size)
        candidates = torch.where(
            state.stopped[:, None], candidates & accepted, candidates
        )  # a stopped sample's output is what stopped it
        finalists = Finalists(scores, candidates, accepted, view.tokens.view(samples, size, -1))
        particle = self.choice.choose(finalists, verifier)
        return torch.arange(samples) * size + particle

    def outcome(self, state: ParticleState, slot: int, sample: int) -> PopulationOutcome:
        verdict = int(state.verdict[slot])
        return PopulationOutcome(
            particle=slot % self.size,
            live_particles=round(float(state.live_total[sample] / state.rounds[sample].clamp(min=1)), 3),
            accepted=None if verdict < 0 else bool(verdict),
        )
