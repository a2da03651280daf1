"""The decode plan: every compatibility check in one place, run once before any forward, and
the frozen record a decode runs from.

A decoder (trigger, commit rule, revision, population, guidance) meets a model (its
:class:`~dlmsearch.core.capabilities.ModelCapabilities`), an engine (its cache policy), a
generation layout (length and block length) and a task's verifier. Combinations that cannot
work are refused here, each with one line that ends with the override(s) fixing it (the numbered
rules of :mod:`~dlmsearch.search.plan_rules`, :data:`RULES`; nothing in the engine, the adapter,
the model or the driver refuses a combination); what the layout fixes (a rule's steps per block,
a revision's schedule) is bound into copies of the components, so the configured decoder is
never written. The plan also names the one owner of
the token temperature (:class:`~dlmsearch.core.temperature.TemperatureOwner`). A run builds its
plan once and decodes every batch from it, so a refused combination fails once at the start,
not once per item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from dlmsearch.core.capabilities import ModelCapabilities
from dlmsearch.core.sampling import Sampling
from dlmsearch.core.temperature import SETTINGS, TemperatureOwner
from dlmsearch.search.components.candidates import CandidateGenerator
from dlmsearch.search.components.commit import CommitRule
from dlmsearch.search.components.expansion import ExpansionPolicy
from dlmsearch.search.components.length import FixedLength, LengthPolicy
from dlmsearch.search.components.revision import Revision
from dlmsearch.search.components.scorers import Scorer
from dlmsearch.search.components.selectors import Selector
from dlmsearch.search.components.tree_settings import TreeSettings
from dlmsearch.search.components.triggers import Trigger
from dlmsearch.search.components.uniform_noise_steps import UniformNoiseSteps
from dlmsearch.search.plan_rules import (  # noqa: F401  (RULES: re-exported, the rules' one list)
    RULES,
    DecoderSettings,
    Meeting,
    canvas_overflow,
    has_mask_token,
    validate,
)
from dlmsearch.search.records.state import Layout, aligned_generation_length
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.search.width.particle_scores import WeightedSum
from dlmsearch.search.width.population_hook import PopulationHook

if TYPE_CHECKING:
    from dlmsearch.search.engine.rollout import RolloutEngine


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
    max_length: int | None  # the model's longest canvas (None: unbounded)
    media_ids: tuple[int, ...]  # ids of image or audio inputs, refused in prompts (text only)
    temperature: TemperatureOwner  # who decides the token temperature, and at what (a run's summary records it)
    # a block-diffusion model's block size: canvases are block-aligned (``block_aligned``)
    attention_block: int | None = None
    tree: TreeSettings | None = None  # a Monte-Carlo tree search's settings (None: the trigger's lookahead explores)
    length: LengthPolicy = attrs.field(factory=FixedLength)  # bound to the model's end-of-sequence id

    @property
    def block_budget(self) -> int | None:
        return self.commit.block_budget

    @property
    def answer_ends_with_block(self) -> bool:
        """An answer ends with the block that holds its end: a block-diffusion model's, or a rule's that decides blocks whole."""
        return self.attention_block is not None or self.commit.decides_whole_block

    @property
    def longest_generation(self) -> int:
        """The most generation columns a sample may come to hold: the length policy's ceiling, else the generation."""
        return max(self.gen_length, self.length.max_length or 0) if self.length.changes else self.gen_length

    @property
    def canvas_gen_length(self) -> int:
        """Generation columns of the canvas: the generation, a block-aligned canvas's longest region, or a
        variable-length canvas's whole blocks."""
        if self.attention_block is not None:
            return aligned_generation_length(self.gen_length, self.attention_block)
        if self.length.changes:  # any initial length: the canvas runs to the end of its last block, absent after it
            return -(-self.gen_length // self.block_length) * self.block_length
        return self.gen_length

    def check_canvas(self, prompt_length: int, what: str, setting: str = "") -> None:
        """Rule 19 (:func:`canvas_overflow`) on a prompt: every entry point asks it of its longest prompt
        before decoding. ``setting`` names the generation length's setting where the caller has one, for the hint."""
        message = canvas_overflow(prompt_length, self.longest_generation, self.attention_block, self.max_length)
        if message is not None:
            raise ValueError(f"{what} {message}" + self._canvas_hint(prompt_length, setting))

    def _canvas_hint(self, prompt_length: int, setting: str) -> str:
        """What to change, where the caller names its generation length's setting (its first word: the
        override): the longest generation of whole blocks that fits (rule 18 refuses any other)."""
        if not setting or self.max_length is None:
            return ""
        unit = self.attention_block or 1  # a block-aligned canvas runs to the end of the last block
        room = self.max_length // unit * unit - prompt_length
        longest = room // self.block_length * self.block_length
        if longest <= 0:
            return f"; the prompt leaves no room for a block of {self.block_length}: shorten it"
        if self.length.changes and room >= self.gen_length:  # the ceiling is what overflows
            return f"; use `decoder.length.max_length={room}`, or shorten the prompt"
        key, _, aside = setting.partition(" ")
        return f"; use `{key}={longest}`{' ' + aside if aside else ''}, or shorten the prompt"

    def layout(self, gen_start: int) -> Layout:
        """The canvas layout of a batch whose longest prompt (its whole blocks, on a block-aligned canvas) ends at ``gen_start``."""
        return Layout(gen_start=gen_start, gen_length=self.canvas_gen_length, block_length=self.block_length)

    def max_rounds(self) -> int:
        """A bound on a sample's rounds: every round commits at least one position per decoding
        slot, except the steps a fixed schedule may leave empty (Dream's first steps: at most its
        budget per block) and the rounds a revision may add."""
        layout = self.layout(0)
        resized = self.longest_generation - self.gen_length + self.length.extra_rounds(self.gen_length)
        return (
            layout.gen_length
            + 1
            + (self.block_budget or 0) * layout.num_blocks
            + self.revision.extra_rounds(layout)
            + resized
        )


def make_plan(
    decoder: DecoderSettings, engine: RolloutEngine, gen_length: int, block_length: int, verifier: Verifier | None
) -> DecodePlan:
    """Check the decoder against the engine, the model, the layout and the verifier; bind what the layout fixes."""
    able = engine.capabilities
    decoder = with_model_parts(decoder, able)
    if able.attention_block is not None:  # a block-diffusion model decodes its own attention blocks
        block_length = able.attention_block
    elif able.canvas_length is not None:  # a uniform-noise model denoises its own canvas, whole
        block_length = able.canvas_length
    else:
        block_length = decoder.block_length or block_length
    temperature = temperature_owner(decoder, engine)
    own = engine.sampling.temperature  # engine.temperature; None: not set
    validate(Meeting(decoder, engine.cache, engine.compile, able, own, gen_length, block_length, temperature))
    # Rules that split a number of steps over the blocks split it over the generation's gen_length / block
    # blocks (a block-aligned canvas has one more, partly the prompt's: every block gets the same budget)
    reads_verdicts = decoder.tree is not None and getattr(decoder.scorer, "needs_verifier", False)
    if reads_verdicts and (verifier is None or not verifier.checks_complete):
        raise ValueError(
            f"decoder {decoder.name!r}'s leaf value ({type(decoder.scorer).__name__}) reads the task verifier's verdict "
            "on an output; this task gives none: use `decoder/scorer=likelihood_value`"
        )
    whole = -(-gen_length // block_length) * block_length if decoder.length.changes else gen_length
    layout = Layout(gen_start=0, gen_length=whole, block_length=block_length)  # what the rules bind to
    commit = decoder.commit.bind(layout)
    return DecodePlan(
        name=decoder.name,
        gen_length=gen_length,
        block_length=block_length,
        commit=commit,
        revision=decoder.revision.bind(layout, commit.block_budget),
        population=decoder.population.for_verifier(verifier),
        trigger=decoder.trigger,
        candidates=decoder.candidates,
        scorer=decoder.scorer,
        expansion=decoder.expansion,
        selector=decoder.selector,
        statistics=decoder.statistics,
        sampling=engine.sampling_over(decoder.sampling),
        guidance=decoder.guidance.scale,
        stop_ids=able.stop_ids if decoder.stop_at_eos else (),
        vocab_size=able.vocab_size,
        mask_id=able.open_id,
        max_length=able.max_length,
        media_ids=able.media_ids,
        temperature=temperature,
        attention_block=able.attention_block,
        tree=decoder.tree,
        length=decoder.length.bind(able.stop_ids[0] if able.stop_ids else None),
    )


def with_model_parts(decoder: DecoderSettings, able: ModelCapabilities) -> DecoderSettings:
    """The decoder as it runs on this model: a search (lookahead, population) is the same on every model,
    but on a model without a mask token a rule that fills masks cannot step, so the model's own step
    runs in its place (:class:`UniformNoiseSteps` at its defaults, transformers' and the shipped
    checkpoints'; ``decoder/commit=uniform_noise`` reads a checkpoint's own), and a population scores
    its particles without re-masking them (``score=log_probability``). The one place a decoder's parts
    are chosen by the model; the plan's ``commit`` names the rule that ran (a run's summary records it)."""
    if has_mask_token(able) or decoder.commit.decides_whole_block:
        return decoder
    population = decoder.population
    if population.rechecks:
        population = attrs.evolve(population, score=WeightedSum())
    return attrs.evolve(decoder, commit=UniformNoiseSteps(**dict(able.step_settings)), population=population)


def temperature_owner(decoder: DecoderSettings, engine: RolloutEngine) -> TemperatureOwner:
    """The one owner of a decode's token temperature: a commit rule that samples at its own
    (uniform noise's schedule), else a population that samples its particles at its own
    (``TokenTemperature``), else the settings layered as :meth:`RolloutEngine.sampling_over` layers
    them (``engine.temperature``, the checkpoint's, the decoder's; a request's own over them).
    Rule 13 refuses a temperature set for another owner; the driver samples at this owner's."""
    if decoder.commit.temperature_owner is not None:
        return decoder.commit.temperature_owner
    if decoder.population.temperature_owner is not None:
        return decoder.population.temperature_owner
    layered = (
        ("engine.temperature", engine.sampling.temperature),
        ("the checkpoint's generation_config.json", engine.adapter.generation_defaults.temperature),
        (f"decoder {decoder.name!r}'s sampling.temperature", decoder.sampling.temperature),
    )
    for source, value in layered:
        if value is not None:
            return TemperatureOwner(SETTINGS, source, float(value))
    return TemperatureOwner(SETTINGS, "no setting (argmax)", 0.0)
