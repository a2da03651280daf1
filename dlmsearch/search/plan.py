"""The decode plan: every compatibility check in one place, run once before any forward, and
the frozen record a decode runs from.

A decoder (trigger, commit rule, revision, population, guidance) meets a model (its
:class:`~dlmsearch.core.capabilities.ModelCapabilities`), an engine (its cache policy), a
generation layout (length and block length) and a task's verifier. Combinations that cannot
work are refused here, each with one line naming the setting to change (:data:`RULES`, numbered;
nothing in the engine, the adapter, the model or the driver refuses a combination); what the
layout fixes (a rule's steps per block, a revision's schedule) is bound into copies of the
components, so the configured decoder is never written. The plan also names the one owner of
the token temperature (:class:`~dlmsearch.core.temperature.TemperatureOwner`). A run builds its
plan once and decodes every batch from it, so a refused combination fails once at the start,
not once per item.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import attrs

from dlmsearch.core.capabilities import ModelCapabilities
from dlmsearch.core.sampling import Sampling
from dlmsearch.core.temperature import SETTINGS, TemperatureOwner
from dlmsearch.search.components.candidates import CandidateGenerator
from dlmsearch.search.components.commit import CommitRule
from dlmsearch.search.components.expansion import ExpansionPolicy
from dlmsearch.search.components.revision import Revision
from dlmsearch.search.components.scorers import Scorer
from dlmsearch.search.components.selectors import Selector
from dlmsearch.search.components.tree_settings import TreeSettings
from dlmsearch.search.components.triggers import Trigger
from dlmsearch.search.components.uniform_noise_steps import UniformNoiseSteps
from dlmsearch.search.engine.cache_policy import CachePolicy
from dlmsearch.search.engine.guidance import Guidance
from dlmsearch.search.engine.statistics import from_source
from dlmsearch.search.records.state import Layout, aligned_generation_length
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.search.width.particle_scores import WeightedSum
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
    tree: TreeSettings | None
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
    max_length: int | None  # the model's longest canvas (None: unbounded)
    media_ids: tuple[int, ...]  # ids of image or audio inputs, refused in prompts (text only)
    temperature: TemperatureOwner  # who decides the token temperature, and at what (a run's summary records it)
    # a block-diffusion model's block size: canvases are block-aligned (``block_aligned``)
    attention_block: int | None = None
    tree: TreeSettings | None = None  # a Monte-Carlo tree search's settings (None: the trigger's lookahead explores)

    @property
    def block_budget(self) -> int | None:
        return self.commit.block_budget

    @property
    def answer_ends_with_block(self) -> bool:
        """An answer ends with the block that holds its end: a block-diffusion model's, or a rule's that decides blocks whole."""
        return self.attention_block is not None or self.commit.decides_whole_block

    @property
    def canvas_gen_length(self) -> int:
        """Generation columns of the canvas: the generation, or a block-aligned canvas's longest region."""
        return (
            self.gen_length
            if self.attention_block is None
            else aligned_generation_length(self.gen_length, self.attention_block)
        )

    def check_canvas(self, prompt_length: int, what: str, setting: str = "") -> None:
        """Rule 19 (:func:`canvas_overflow`) on a prompt: every entry point asks it of its longest prompt
        before decoding. ``setting`` names the generation length's setting where the caller has one, for the hint."""
        message = canvas_overflow(prompt_length, self.gen_length, self.attention_block, self.max_length)
        if message is not None:
            raise ValueError(f"{what} {message}" + self._canvas_hint(prompt_length, setting))

    def _canvas_hint(self, prompt_length: int, setting: str) -> str:
        """What to change, where the caller names its generation length's setting."""
        if not setting or self.max_length is None:
            return ""
        if prompt_length >= self.max_length:
            return "; the prompt alone does not fit: shorten it"
        return f"; set {setting} to at most {self.max_length - prompt_length}, or shorten the prompt"

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
            "on an output; this task gives none: use decoder/scorer=likelihood_value (or +decoder=mcts)"
        )
    layout = Layout(gen_start=0, gen_length=gen_length, block_length=block_length)
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
    )


def has_mask_token(able: ModelCapabilities) -> bool:
    """Whether the model's open positions hold a mask token (else uniform noise that each step draws afresh)."""
    return able.noise == "mask"


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


def canvas_overflow(
    prompt_length: int, gen_length: int, attention_block: int | None, max_length: int | None
) -> str | None:
    """Rule 19's check: the prompt and the generation, on a block-aligned canvas up to the end of
    the last block, fit the model (None), else what does not (the tail of a one-line message)."""
    length = prompt_length + gen_length
    if attention_block is not None:  # the reference canvas runs to the end of the last block
        length = -(-length // attention_block) * attention_block
    if max_length is None or length <= max_length:
        return None
    return (
        f"(prompt {prompt_length} + generation {gen_length}) is {length} tokens, "
        f"longer than the model's maximum length of {max_length}"
    )


@attrs.frozen
class Meeting:
    """What the cross-object rules read: a decoder, the engine's cache policy and compile flag, the
    model, the generation layout, the temperature's owner (and, for rule 19 only, a prompt's length)."""

    decoder: DecoderSettings
    cache: CachePolicy
    compile: bool
    able: ModelCapabilities
    temperature: float | None  # the engine's own (engine.temperature, a request's), None: not set
    gen_length: int
    # the decoding blocks: the model's (attention blocks, a uniform-noise canvas), else the decoder's or task's
    block_length: int
    owner: TemperatureOwner
    prompt_length: int | None = None  # known with requests only (:meth:`DecodePlan.check_canvas`)

    @property
    def block_model(self) -> str:
        return f"this block-diffusion model (blocks of {self.able.attention_block})"


def validate(meeting: Meeting) -> None:
    """Refuse a combination that cannot work, with the first rule it breaks (one line naming the
    setting to change), as transformers' ``GenerationConfig.validate`` lists its checks: the rules
    are :data:`RULES`, in order (a later rule may assume the earlier ones hold), and nothing else
    in the engine, adapter, model or driver refuses a combination of objects."""
    for rule in RULES:
        message = rule(meeting)
        if message is not None:
            raise ValueError(message)


def _layerwise_cache(m: Meeting) -> str | None:
    """1. A layerwise cache (dllm_cache, d2cache, elastic, dkv) needs the native full-attention forward."""
    if m.cache.layerwise and not has_mask_token(m.able):
        return f"cache={m.cache.name} recomputes stale keys and values of a masked canvas; {m.able.name} denoises uniform noise: use cache=none"
    if not m.cache.layerwise or m.able.layerwise:
        return None
    if m.able.attention_block is not None:
        return (
            f"cache={m.cache.name} recomputes stale keys and values of a full-attention model; {m.block_model} "
            "has an exact cache instead, which needs no refresh: use cache=block (or cache=none)"
        )
    return f"cache={m.cache.name} runs the layerwise forward of the native LLaDA and Dream models; {m.able.name} cannot: use cache=none"


def _cache_the_model_runs(m: Meeting) -> str | None:
    """2. Any other cache must be one the model can store keys and values for."""
    if m.cache.layerwise or m.cache.name in m.able.cache_policies:
        return None
    if not has_mask_token(m.able):
        return (
            f"cache={m.cache.name} caches a masked canvas; {m.able.name} denoises uniform noise and its decoder already "
            "reads the encoder's exact cache of everything before the canvas: use cache=none (or cache=auto)"
        )
    if m.cache.name == "encoder":
        return f"cache=encoder is the prefix cache of an encoder-decoder model (model=diffusion_gemma); {m.able.name} has no encoder: use cache=auto"
    if m.able.attention_block is not None:
        return f"cache={m.cache.name} is a full-attention model's cache; {m.block_model} has an exact one: use cache=block (or cache=none)"
    if m.cache.name == "block":
        return (
            "cache=block is the exact cache of block-diffusion models (model=sdar); "
            f"{m.able.name} attends to the whole canvas: use cache=none, prefix or dual"
        )
    return (
        f"cache={m.cache.name} needs a model that can cache keys and values (the native LLaDA and Dream "
        f"models); {m.able.name} cannot: use cache=none"
    )


def _compile(m: Meeting) -> str | None:
    """3. engine.compile needs blocks that compile."""
    if m.compile and not m.able.compiles:
        return f"engine.compile=true compiles the native LLaDA and Dream models' blocks; {m.able.name} has none: use engine.compile=false"
    return None


def _model_blocks(m: Meeting) -> str | None:
    """4. A block-diffusion model decodes its own attention blocks."""
    blocks, own = m.decoder.block_length, m.able.attention_block
    if own is None or blocks is None or blocks == own:
        return None
    return (
        f"decoder {m.decoder.name!r} decodes blocks of {blocks}, but this block-diffusion model attends in blocks of "
        f"{own}: its blocks are the model's (decoder.block_length=null adopts them)"
    )


def _guidance(m: Meeting) -> str | None:
    """5. Guidance's unconditional rows would need caches of their own."""
    if m.decoder.guidance.active and m.cache.stores:
        return (
            f"decoder.guidance.scale={m.decoder.guidance.scale} needs cache=none (the unconditional rows would need "
            f"key/value caches of their own); got cache={m.cache.name}"
        )
    return None


def _stop_tokens(m: Meeting) -> str | None:
    """6. Stopping at the end of the answer needs the model's stop tokens."""
    if m.decoder.stop_at_eos and not m.able.stop_ids:
        return "decoder.stop_at_eos needs the model's stop tokens (model.stop_ids); this model has none"
    return None


def _whole_prefix(m: Meeting) -> str | None:
    """7. Saber's whole-prefix rule re-reads columns the block cache does not compute."""
    if m.cache.name == "block" and m.decoder.commit.whole_prefix:
        return (
            f"decoder {m.decoder.name!r} re-reads every committed position of the generation (Saber's whole-prefix rule), "
            "but the block cache computes the blocks being decoded only: use cache=none"
        )
    return None


def _revision_over_layerwise(m: Meeting) -> str | None:
    """8. A layerwise cache's stored selections assume that commits are final."""
    if m.cache.layerwise and m.decoder.revision.revises:
        return (
            f"decoder {m.decoder.name!r} re-masks committed tokens, but cache={m.cache.name} decides what to recompute from a canvas "
            "whose commits are final (its stored keys, values and selections assume it): use cache=none, prefix or dual"
        )
    return None


def _history(m: Meeting) -> str | None:
    """9. A statistic of the previous step's distributions (KLASS's kl) needs every column recomputed."""
    names = from_source(m.decoder.statistics, "history")
    if names and m.cache.stores:
        return (
            f"the {', '.join(sorted(names))} statistic (KLASS) compares full distributions step to step and needs cache=none; "
            f"got cache={m.cache.name}"
        )
    return None


def _shadow(m: Meeting) -> str | None:
    """10. A statistic of a shadow block (WINO's verify) needs its rows beside the canvas, unshifted."""
    names = from_source(m.decoder.statistics, "shadow")
    if not names:
        return None
    what = f"the {', '.join(sorted(names))} statistic (WINO's shadow block)"
    if m.cache.name not in ("none", "prefix") or m.decoder.guidance.active:
        return f"{what} needs cache=none or prefix and no guidance; got cache={m.cache.name}"
    if not m.able.shadow:
        return (
            f"{what} needs a model that takes an explicit attention mask and unshifted logits; {m.able.name} does not"
        )
    return None


def _whole_block_steps(m: Meeting) -> str | None:
    """11. A rule that decides blocks whole opens what it does not keep to fresh noise: a model with a mask token cannot
    (a rule that fills masks on a model without one is replaced by the model's own step: :func:`with_model_parts`)."""
    if m.decoder.commit.decides_whole_block and has_mask_token(m.able):
        return (
            f"decoder {m.decoder.name!r} re-decides a canvas of uniform noise every step; {m.able.name} fills a masked "
            "canvas: use a decoder for masked diffusion (e.g. +decoder=llada)"
        )
    return None


def _parts_without_mask_token(m: Meeting) -> str | None:
    """12. Without a mask token, re-masking revisions, guidance's masked prompt and the re-mask re-check have no meaning."""
    if has_mask_token(m.able):
        return None
    if m.decoder.revision.revises:
        return (
            f"decoder {m.decoder.name!r} returns committed tokens to the mask; on {m.able.name} every step already "
            "re-noises what it does not keep: use decoder/revision=none"
        )
    if m.decoder.guidance.active:
        return f"decoder.guidance masks the prompt with the mask token; {m.able.name} has none: use decoder.guidance.scale=0"
    if m.decoder.population.rechecks:
        return (
            f"decoder {m.decoder.name!r} scores its particles by re-masking groups of committed tokens for the model to "
            f"re-check; {m.able.name} has no mask: use decoder/population/score=log_probability"
        )
    return None


def _temperature(m: Meeting) -> str | None:
    """13. One owner decides the token temperature (:func:`temperature_owner`): a temperature set for another is refused."""
    owner = m.owner
    if owner.takes_settings:
        return None
    population = m.decoder.population.temperature_owner
    if population is not None and population != owner:
        return (
            f"{population.source} would be ignored: {owner.source} decides the temperature here; use another "
            "diversity (decoder/population/diversity=order_temperature)"
        )
    settings = (("engine.temperature", m.temperature), ("decoder.sampling.temperature", m.decoder.sampling.temperature))
    for setting, value in settings:
        if value is not None and value != owner.value:
            return f"{setting}={value} would be ignored: {owner.source} decides the temperature here; {owner.instead}"
    return None


def _sharded_layerwise(m: Meeting) -> str | None:
    """14. A layerwise cache's per-layer choices need every head: not a tensor-parallel model's shard."""
    if m.cache.layerwise and m.able.tensor_parallel > 1:
        return (
            f"cache={m.cache.name} chooses what to recompute per layer from every attention head; with "
            f"model.tensor_parallel={m.able.tensor_parallel} a rank holds some heads only: use cache=none, prefix, dual "
            "or block (or model.tensor_parallel=1)"
        )
    return None


def _sharded_compile(m: Meeting) -> str | None:
    """15. engine.compile's per-token graphs cannot hold a tensor-parallel model's all-reduce."""
    if m.compile and m.able.tensor_parallel > 1:
        return (
            f"engine.compile=true with model.tensor_parallel={m.able.tensor_parallel}: the all-reduce would sit inside "
            "the compiled per-token graphs, which dlmsearch does not support; use engine.compile=false"
        )
    return None


def _lookahead_parts(m: Meeting) -> str | None:
    """17. A trigger that explores needs the whole lookahead: candidates, scorer, expansion and selector."""
    if not m.decoder.trigger.explores:
        return None
    missing = [n for n in ("candidates", "scorer", "expansion", "selector") if getattr(m.decoder, n) is None]
    if not missing:
        return None
    return (
        f"decoder {m.decoder.name!r} explores (trigger {type(m.decoder.trigger).__name__}) but has no "
        f"{', '.join(missing)}: set decoder/{missing[0]}=..., or use decoder/trigger=never"
    )


def _lookahead_over_revision(m: Meeting) -> str | None:
    """16. Lookahead branches roll with the base rule alone: a revision would not see them."""
    if m.decoder.trigger.explores and m.decoder.revision.revises:
        return (
            f"decoder {m.decoder.name!r} revises commits ({type(m.decoder.revision).__name__}) and explores (trigger "
            f"{type(m.decoder.trigger).__name__}): lookahead branches roll with the base rule alone, so the two are refused "
            "together; use decoder/trigger=never (populations do combine with a revision)"
        )
    return None


def _tree_search(m: Meeting) -> str | None:
    """21. A tree search commits masked positions with its own parts, one sample per tree, from exact evaluations
    (no cache, or an exact one: an approximate cache's error would reach the values it compares)."""
    decoder = m.decoder
    if decoder.tree is None:
        return None
    parts = (("expansion", "select"), ("scorer", "value"), ("selector", "child"))
    wrong = [f"decoder/{n}" for n, method in parts if not hasattr(getattr(decoder, n), method)]
    if wrong or not decoder.trigger.explores or decoder.candidates is None:
        return (
            f"decoder {decoder.name!r} sets decoder.tree, which needs a trigger that explores, candidates, and a tree "
            f"policy (expansion), leaf value (scorer) and tree selector{': check ' + ', '.join(wrong) if wrong else ''} "
            "(see +decoder=mcts)"
        )
    if not has_mask_token(m.able):
        return (
            f"decoder {decoder.name!r} searches a tree of commits to masked positions; {m.able.name} denoises uniform "
            "noise, which re-decides every position each step: use +decoder=best_of_n or +decoder=adalook"
        )
    if decoder.population.size > 1:
        return f"decoder {decoder.name!r} searches a tree per sample: use decoder/population=null"
    if m.cache.layerwise or (m.cache.stores and not m.cache.exact):
        return (
            f"cache={m.cache.name} reuses stale keys and values (of positions that changed since), and their error would "
            "reach the values the tree compares: use cache=none (or cache=block on a block-diffusion model: exact)"
        )
    return None


def _whole_blocks(m: Meeting) -> str | None:
    """18. The generation is a whole number of blocks (a uniform-noise model's canvases, a block model's blocks)."""
    if m.gen_length % m.block_length == 0:
        return None
    whole = -(-m.gen_length // m.block_length) * m.block_length
    if m.able.canvas_length is not None:
        what = f"this model's canvases of {m.block_length} (it denoises a canvas whole)"
    elif m.able.attention_block is not None:
        what = f"the blocks of {m.block_model}"
    else:
        what = f"decoding blocks of {m.block_length} (task.block_length, or the decoder's)"
    return f"the generation length ({m.gen_length}) must be a whole number of {what}: set task.gen_length to {whole}"


def _canvas_fits(m: Meeting) -> str | None:
    """19. The prompt and the generation fit the model's longest canvas: asked with each batch's longest
    prompt (:meth:`DecodePlan.check_canvas`, by every entry point before any forward); without one, nothing."""
    if m.prompt_length is None:
        return None
    message = canvas_overflow(m.prompt_length, m.gen_length, m.able.attention_block, m.able.max_length)
    return None if message is None else f"the canvas {message}"


def _shadow_blocks(m: Meeting) -> str | None:
    """20. A shadow block (WINO's verify) is one block long for every row: no rule that leaves a block unfinished."""
    names = from_source(m.decoder.statistics, "shadow")
    if not names or m.decoder.commit.block_budget is None:
        return None
    return (
        f"the {', '.join(sorted(names))} statistic (WINO's shadow block) needs every row to decode one block, but "
        f"decoder {m.decoder.name!r}'s commit rule moves on after {m.decoder.commit.block_budget} rounds and may "
        "leave masks behind (rows would decode windows of different lengths): use decoder/commit=wide_in"
    )


RULES: tuple[Callable[[Meeting], str | None], ...] = (
    _layerwise_cache,
    _cache_the_model_runs,
    _compile,
    _model_blocks,
    _guidance,
    _stop_tokens,
    _whole_prefix,
    _revision_over_layerwise,
    _history,
    _shadow,
    _whole_block_steps,
    _parts_without_mask_token,
    _temperature,
    _sharded_layerwise,
    _sharded_compile,
    _lookahead_over_revision,
    _lookahead_parts,
    _whole_blocks,
    _canvas_fits,
    _shadow_blocks,
    _tree_search,
)
