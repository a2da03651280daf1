"""The decode plan: every compatibility check in one place, run once before any forward, and
the frozen record a decode runs from.

A decoder (trigger, commit rule, revision, population, guidance) meets a model (its
:class:`~dlmsearch.core.capabilities.ModelCapabilities`), an engine (its cache policy), a
generation layout (length and block length) and a task's verifier. Combinations that cannot
work are refused here, each with one line naming the setting to change; what the layout fixes
(a rule's steps per block, a revision's schedule) is bound into copies of the components, so
the configured decoder is never written. A run builds its plan once and decodes every batch
from it, so a refused combination fails once at the start, not once per item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

from dlmsearch.core.sampling import Sampling
from dlmsearch.search.components.candidates import CandidateGenerator
from dlmsearch.search.components.commit import CommitRule
from dlmsearch.search.components.expansion import ExpansionPolicy
from dlmsearch.search.components.revision import Revision
from dlmsearch.search.components.scorers import Scorer
from dlmsearch.search.components.selectors import Selector
from dlmsearch.search.components.triggers import Trigger
from dlmsearch.search.engine.guidance import Guidance
from dlmsearch.search.records.state import Layout, aligned_generation_length
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.search.width.population_hook import PopulationHook

if TYPE_CHECKING:
    from dlmsearch.search.engine.rollout import RolloutEngine


class DecoderSettings(Protocol):
    """What :func:`make_plan` reads of a decoder (:class:`~dlmsearch.search.driver.SearchDecoder`),
    so this module needs nothing from the driver that imports it."""

    name: str
    commit: CommitRule
    trigger: Trigger
    candidates: CandidateGenerator | None
    scorer: Scorer | None
    expansion: ExpansionPolicy | None
    selector: Selector | None
    population: PopulationHook
    revision: Revision
    block_length: int | None
    sampling: Sampling
    guidance: Guidance
    stop_at_eos: bool

    @property
    def statistics(self) -> frozenset[str]: ...


@attrs.frozen
class DecodePlan:
    """What one decoder decodes with on one engine at one generation layout (checked, frozen): every
    component the decode loop calls, so a step reads the plan and nothing else."""

    name: str
    gen_length: int
    block_length: int
    commit: CommitRule  # bound to the layout
    revision: Revision  # bound to the layout and the rule's steps per block
    population: PopulationHook  # what the task's verifier allows (e.g. pruning only where it checks partial outputs)
    trigger: Trigger  # when a slot looks ahead (never: the base rule alone)
    candidates: CandidateGenerator | None  # the lookahead's parts: all set where the trigger explores
    scorer: Scorer | None
    expansion: ExpansionPolicy | None
    selector: Selector | None
    statistics: frozenset[str]  # what the engine computes per position beyond token and confidence
    sampling: Sampling  # resolved: the engine's settings, else the checkpoint's, else the decoder's, else neutral
    guidance: float
    stop_ids: tuple[int, ...]  # empty unless the decoder stops at the end of the answer
    vocab_size: int
    mask_id: int
    # a block-diffusion model's block size: canvases are block-aligned (``block_aligned``)
    attention_block: int | None = None

    @property
    def block_budget(self) -> int | None:
        return self.commit.block_budget

    @property
    def canvas_gen_length(self) -> int:
        """Generation columns of the canvas: the generation, or a block-aligned canvas's longest region."""
        return (
            self.gen_length
            if self.attention_block is None
            else aligned_generation_length(self.gen_length, self.attention_block)
        )

    def layout(self, gen_start: int) -> Layout:
        """The canvas layout of a batch whose longest prompt (its whole blocks, on a block-aligned canvas) ends at ``gen_start``."""
        return Layout(gen_start=gen_start, gen_length=self.canvas_gen_length, block_length=self.block_length)

    def max_rounds(self) -> int:
        """A bound on a sample's rounds: every round commits at least one position per decoding
        slot, except the steps a fixed schedule may leave empty (Dream's first steps: at most its
        budget per block) and the rounds a revision may add."""
        layout = self.layout(0)
        return layout.gen_length + 1 + (self.block_budget or 0) * layout.num_blocks + self.revision.extra_rounds(layout)


def make_plan(
    decoder: DecoderSettings, engine: RolloutEngine, gen_length: int, block_length: int, verifier: Verifier | None
) -> DecodePlan:
    """Check the decoder against the engine, the model, the layout and the verifier; bind what the layout fixes."""
    able = engine.capabilities
    cache = engine.cache.name
    if able.attention_block is not None:  # a block-diffusion model decodes its own attention blocks
        if decoder.block_length is not None and decoder.block_length != able.attention_block:
            raise ValueError(
                f"decoder {decoder.name!r} decodes blocks of {decoder.block_length}, but this block-diffusion model attends in blocks of "
                f"{able.attention_block}: its blocks are the model's (decoder.block_length=null adopts them)"
            )
        block_length = able.attention_block
    else:
        block_length = decoder.block_length or block_length
    statistics = decoder.statistics
    if decoder.guidance.active and engine.cache.stores:
        raise ValueError(
            f"decoder.guidance.scale={decoder.guidance.scale} needs cache=none (the unconditional rows would need "
            f"key/value caches of their own); got cache={cache}"
        )
    if decoder.stop_at_eos and not able.stop_ids:
        raise ValueError("decoder.stop_at_eos needs the model's stop tokens (model.stop_ids); this model has none")
    if cache == "block" and decoder.commit.whole_prefix:
        raise ValueError(
            f"decoder {decoder.name!r} re-reads every committed position of the generation (Saber's whole-prefix rule), but the block "
            "cache computes the blocks being decoded only: use cache=none"
        )
    if engine.layerwise and decoder.revision.revises:
        raise ValueError(
            f"decoder {decoder.name!r} re-masks committed tokens, but cache={cache} decides what to recompute from a canvas whose "
            "commits are final (its stored keys, values and selections assume it): use cache=none, prefix or dual"
        )
    if "kl" in statistics and engine.cache.stores:
        raise ValueError(
            f"the kl statistic (KLASS) compares full distributions step to step and needs cache=none; got cache={cache}"
        )
    if "verify" in statistics:
        if cache not in ("none", "prefix") or decoder.guidance.active:
            raise ValueError(
                f"the verify statistic (WINO's shadow block) needs cache=none or prefix and no guidance; got cache={cache}"
            )
        if not able.shadow:
            raise ValueError(
                f"the verify statistic (WINO's shadow block) needs a model that takes an explicit attention mask and unshifted logits; {able.name} does not"
            )
    # Checks the block length against the generation. Rules that split a number of steps over the blocks split it
    # over the generation's gen_length / block blocks (a block-aligned canvas has one more, partly the prompt's: every
    # block gets the same budget)
    layout = Layout(gen_start=0, gen_length=gen_length, block_length=block_length)
    commit = decoder.commit.bind(layout)
    revision = decoder.revision.bind(layout, commit.block_budget)
    population = decoder.population.for_verifier(verifier)
    sampling = engine.sampling_over(decoder.sampling)
    return DecodePlan(
        name=decoder.name,
        gen_length=gen_length,
        block_length=block_length,
        commit=commit,
        revision=revision,
        population=population,
        trigger=decoder.trigger,
        candidates=decoder.candidates,
        scorer=decoder.scorer,
        expansion=decoder.expansion,
        selector=decoder.selector,
        statistics=statistics,
        sampling=sampling,
        guidance=decoder.guidance.scale,
        stop_ids=able.stop_ids if decoder.stop_at_eos else (),
        vocab_size=able.vocab_size,
        mask_id=able.mask_id,
        attention_block=able.attention_block,
    )
