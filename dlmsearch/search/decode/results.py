"""Results: each sample's output as the loop hands it back (:class:`DecodeResult`), read from the slot its
population chose after the final re-check."""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.decode.calls import evaluate
from dlmsearch.search.decode.state import DecodeState, check_current
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.randomness import BRANCH_KEYS
from dlmsearch.search.records.slots import Slots
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.search.records.usage import Usage
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.search.width.population_hook import PopulationOutcome, SlotCanvases

RECHECK_KEY = BRANCH_KEYS - 1  # the rows of a population's final re-check by the model


@attrs.frozen
class DecodeResult:
    """A decoded generation region and how it was produced (per-position commit record)."""

    uid: int
    # [n]; a block-diffusion model's: its region after the prompt, to the end of its last block (n or more)
    tokens: torch.Tensor
    steps: int
    row_forwards: int
    tokens_committed: int
    token_forwards: int  # positions the model computed for this sample (a cache's saving shows here)
    deadline_hit: bool  # the time budget ran out and the sample was finished by the base rule alone
    commit_call: torch.Tensor  # [n], -1 where the token was given
    commit_confidence: torch.Tensor
    commit_depth: torch.Tensor  # 0: base rule on the root; d >= 1: lookahead depth d
    commit_branch: torch.Tensor  # lookahead branch index, -1 for base commits
    revisions: torch.Tensor  # [n] times each position was returned to the mask (0 for decoders that never revise)
    population: PopulationOutcome = attrs.field(factory=lambda: PopulationOutcome())
    writes: int = 0  # of the steps, the calls that only wrote a cache (an encoder's separate write)

    @property
    def length(self) -> int:
        """The generation's length: the decode's own where a length policy changed it."""
        return len(self.tokens)

    @property
    def decoder_forwards(self) -> int:
        """The denoising forwards: model calls that were not a cache's separate write (DiffusionGemma's ``decoder_forward_passes``)."""
        return self.steps - self.writes


def length_record(tokens: torch.Tensor, stop_ids: tuple[int, ...]) -> dict[str, int]:
    """A result's ``length`` (its generation's columns) and ``effective_tokens``: those before the first
    end token (the answer; what follows is padding), the numerator of the effective-token ratio."""
    ends = torch.isin(tokens, torch.tensor(stop_ids, dtype=tokens.dtype)).nonzero()
    return {"length": len(tokens), "effective_tokens": int(ends[0, 0]) if len(ends) else len(tokens)}


def finish(engine: RolloutEngine, state: DecodeState, verifier: Verifier | None = None) -> list[DecodeResult]:
    """Each sample's output: the population's re-check and choice, then the chosen slot's result."""
    check_current(state)
    layout, canvas, slots, population, plan = state.layout, state.canvas, state.slots, state.population, state.plan
    spent = [state.usage]  # the re-check's calls count too

    def recheck(probe: Canvas, rows: torch.Tensor) -> Evaluation:
        evaluation, spent[0] = evaluate(engine, state, spent[0], probe, rows, torch.full_like(rows, RECHECK_KEY))
        return evaluation

    chosen_slot = plan.population.choose(
        SlotCanvases(canvas, slots, layout, verifier), population, recheck, engine.capabilities.open_id
    )
    late_sample = state.late.view(slots.samples, slots.size).any(dim=1)
    return [
        result(
            canvas,
            spent[0],
            slots,
            plan.population.outcome(population, int(chosen_slot[i]), i),
            int(chosen_slot[i]),
            i,
            layout,
            bool(late_sample[i]),
        )
        for i in range(slots.samples)
    ]


def result(
    canvas: Canvas,
    usage: Usage,
    slots: Slots,
    outcome: PopulationOutcome,
    slot: int,
    sample: int,
    layout: Layout,
    late: bool,
) -> DecodeResult:
    """One sample's result, read from the slot the population chose for it.

    Args:
        canvas: the final canvases (``[slots, T]``).
        usage: the decode's counters (``[samples]`` each).
        slots: the slot table (each slot's uid and generation region).
        outcome: the population's account of the sample.
        slot: the chosen slot's index.
        sample: the sample's index (its counters' row).
        layout: the decode's layout (where the generation starts).
        late: whether the sample passed its deadline.
    """
    # the sample's output: after its prompt (a block-aligned row's whole blocks of it), to the canvas's end
    # (a block-aligned row's last block; a variable-length canvas's own length)
    gen = slice(layout.gen_start + int(slots.region[slot, 0]), int(canvas.extent[slot]))
    call = canvas.commit_call[slot, gen]
    return DecodeResult(
        uid=int(slots.uid[slot]),
        tokens=canvas.tokens[slot, gen].clone(),
        steps=int(usage.steps[sample]),
        writes=int(usage.writes[sample]),
        row_forwards=int(usage.row_forwards[sample]),
        token_forwards=int(usage.token_forwards[sample]),
        deadline_hit=late,
        tokens_committed=int((call >= 0).sum()),
        commit_call=call.clone(),
        commit_confidence=canvas.commit_confidence[slot, gen].clone(),
        commit_depth=canvas.commit_depth[slot, gen].clone(),
        commit_branch=canvas.commit_branch[slot, gen].clone(),
        revisions=canvas.revisions[slot, gen].clone(),
        population=outcome,
    )
