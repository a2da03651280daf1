"""The compatibility rules of a decode plan (:func:`~dlmsearch.search.plan.make_plan`): one numbered
list, :data:`RULES`, over a :class:`Meeting` of a decoder, an engine's cache and compile flag, a model,
a generation layout and the temperature's owner.

Each rule refuses a combination that cannot work in one line that ends with its fix: the override(s)
to add to the command line, in backticks (several in one span: all of them; ``+decoder=NAME``: that
preset in place of the command's own; an alternative in parentheses is a whole fix too), so that the
command with them passes the plan. A rule whose fix would only meet a later rule's refusal, because
the decoder cannot run on this model whatever its settings, yields to that rule. tests/test_refusal_advice.py
breaks every rule and applies every fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs

from dlmsearch.core.capabilities import ModelCapabilities
from dlmsearch.core.sampling import Sampling
from dlmsearch.core.temperature import TemperatureOwner
from dlmsearch.search.components.candidates import CandidateGenerator
from dlmsearch.search.components.commit import CommitRule
from dlmsearch.search.components.expansion import ExpansionPolicy
from dlmsearch.search.components.length import LengthPolicy
from dlmsearch.search.components.revision import Revision
from dlmsearch.search.components.scorers import Scorer
from dlmsearch.search.components.selectors import Selector
from dlmsearch.search.components.tree_settings import TreeSettings
from dlmsearch.search.components.triggers import Trigger
from dlmsearch.search.engine.cache_policy import CachePolicy
from dlmsearch.search.engine.guidance import Guidance
from dlmsearch.search.engine.statistics import REGISTRY, from_source
from dlmsearch.search.width.population_hook import PopulationHook


class DecoderSettings(Protocol):
    """What the plan (:func:`~dlmsearch.search.plan.make_plan` and its rules) reads of a decoder
    (:class:`~dlmsearch.search.driver.SearchDecoder`), so neither module needs the driver that imports them."""

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
    length: LengthPolicy
    block_length: int | None
    sampling: Sampling
    guidance: Guidance
    stop_at_eos: bool

    @property
    def statistics(self) -> frozenset[str]: ...


def has_mask_token(able: ModelCapabilities) -> bool:
    """Whether the model's open positions hold a mask token (else uniform noise that each step draws afresh)."""
    return able.noise == "mask"


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
    """Refuse a combination that cannot work, with the first rule it breaks (one line ending with its
    fix), as transformers' ``GenerationConfig.validate`` lists its checks: the rules are :data:`RULES`,
    in order (a later rule may assume the earlier ones hold), and nothing else in the engine, adapter,
    model or driver refuses a combination of objects."""
    for rule in RULES:
        message = rule(meeting)
        if message is not None:
            raise ValueError(message)


def _exact_cache(m: Meeting) -> str:
    """The cache a refusal names: the model's exact one (``cache=auto``: an encoder's prefix, a block model's
    blocks) where this decoder may run it, else none (guidance, KLASS, WINO and Saber's rule refuse a stored one)."""
    if not has_mask_token(m.able):
        return "auto"
    reads = {REGISTRY[name].source for name in m.decoder.statistics}
    whole = m.decoder.commit.whole_prefix or m.decoder.guidance.active or bool(reads & {"history", "shadow"})
    return "block" if m.able.attention_block is not None and not whole else "none"


def _needs_another_decoder(m: Meeting) -> bool:
    """Whether a later rule refuses this decoder on this model whatever its settings (10, 11 and 21 name
    another preset): a rule that names a setting of the decoder yields to it, so its advice is not followed in vain."""
    whole_block = m.decoder.commit.decides_whole_block and has_mask_token(m.able)
    shadow = bool(from_source(m.decoder.statistics, "shadow")) and not m.able.shadow
    return whole_block or shadow or (m.decoder.tree is not None and not has_mask_token(m.able))


def _layerwise_cache(m: Meeting) -> str | None:
    """1. A layerwise cache (dllm_cache, d2cache, elastic, dkv) needs the native full-attention forward."""
    if m.cache.layerwise and not has_mask_token(m.able):
        return f"cache={m.cache.name} recomputes stale keys and values of a masked canvas; {m.able.name} denoises uniform noise: use `cache=auto`"
    if not m.cache.layerwise or m.able.layerwise:
        return None
    if m.able.attention_block is not None:
        return (
            f"cache={m.cache.name} recomputes stale keys and values of a full-attention model; {m.block_model} "
            f"has an exact cache instead, which needs no refresh: use `cache={_exact_cache(m)}`"
        )
    return f"cache={m.cache.name} runs the layerwise forward of the native LLaDA and Dream models; {m.able.name} cannot: use `cache=none`"


def _cache_the_model_runs(m: Meeting) -> str | None:
    """2. Any other cache must be one the model can store keys and values for."""
    if m.cache.layerwise or m.cache.name in m.able.cache_policies:
        return None
    if not has_mask_token(m.able):
        return (
            f"cache={m.cache.name} caches a masked canvas; {m.able.name} denoises uniform noise and its decoder already "
            "reads the encoder's exact cache of everything before the canvas: use `cache=auto`"
        )
    if m.cache.name == "encoder":
        return (
            "cache=encoder is the prefix cache of an encoder-decoder model (model=diffusion_gemma); "
            f"{m.able.name} has no encoder: use `cache={_exact_cache(m)}`"
        )
    if m.able.attention_block is not None:
        return f"cache={m.cache.name} is a full-attention model's cache; {m.block_model} has an exact one: use `cache={_exact_cache(m)}`"
    if m.cache.name == "block":
        return (
            "cache=block is the exact cache of block-diffusion models (model=sdar); "
            f"{m.able.name} attends to the whole canvas: use `cache=none`"
        )
    return (
        f"cache={m.cache.name} needs a model that can cache keys and values (the native LLaDA and Dream "
        f"models); {m.able.name} cannot: use `cache=none`"
    )


def _compile(m: Meeting) -> str | None:
    """3. engine.compile needs blocks that compile."""
    if m.compile and not m.able.compiles:
        return f"engine.compile=true compiles the native LLaDA and Dream models' blocks; {m.able.name} has none: use `engine.compile=false`"
    return None


def _model_blocks(m: Meeting) -> str | None:
    """4. A block-diffusion model decodes its own attention blocks."""
    blocks, own = m.decoder.block_length, m.able.attention_block
    if own is None or blocks is None or blocks == own or _needs_another_decoder(m):
        return None
    return (
        f"decoder {m.decoder.name!r} decodes blocks of {blocks}, but this block-diffusion model attends in blocks of "
        f"{own}: use `++decoder.block_length=null` (the model's blocks)"
    )


def _guidance(m: Meeting) -> str | None:
    """5. Guidance's unconditional rows would need caches of their own (no mask token: rule 12 refuses guidance)."""
    if m.decoder.guidance.active and m.cache.stores and has_mask_token(m.able):
        return (
            f"decoder.guidance.scale={m.decoder.guidance.scale} needs cache=none (the unconditional rows would need "
            f"key/value caches of their own); got cache={m.cache.name}: use `cache=none` (or `decoder.guidance.scale=0`)"
        )
    return None


def _stop_tokens(m: Meeting) -> str | None:
    """6. Stopping at the end of the answer needs the model's stop tokens."""
    if m.decoder.stop_at_eos and not m.able.stop_ids and not _needs_another_decoder(m):
        return f"decoder.stop_at_eos needs the model's stop tokens (model.stop_ids); {m.able.name} has none: use `decoder.stop_at_eos=false`"
    return None


def _whole_prefix(m: Meeting) -> str | None:
    """7. Saber's whole-prefix rule re-reads columns the block cache does not compute."""
    if m.cache.name == "block" and m.decoder.commit.whole_prefix:
        return (
            f"decoder {m.decoder.name!r} re-reads every committed position of the generation (Saber's whole-prefix rule), "
            "but the block cache computes the blocks being decoded only: use `cache=none`"
        )
    return None


def _revision_over_layerwise(m: Meeting) -> str | None:
    """8. A layerwise cache's stored selections assume that commits are final."""
    if m.cache.layerwise and m.decoder.revision.revises:
        return (
            f"decoder {m.decoder.name!r} re-masks committed tokens, but cache={m.cache.name} decides what to recompute from a canvas "
            "whose commits are final (its stored keys, values and selections assume it): use `cache=none`"
        )
    return None


def _history(m: Meeting) -> str | None:
    """9. A statistic of the previous step's distributions (KLASS's kl) needs every column recomputed."""
    names = from_source(m.decoder.statistics, "history")
    if names and m.cache.stores:
        return (
            f"the {', '.join(sorted(names))} statistic (KLASS) compares full distributions step to step and needs "
            f"cache=none; got cache={m.cache.name}: use `cache=none`"
        )
    return None


def _shadow(m: Meeting) -> str | None:
    """10. A statistic of a shadow block (WINO's verify) needs its rows beside the canvas, unshifted."""
    names = from_source(m.decoder.statistics, "shadow")
    if not names:
        return None
    what = f"the {', '.join(sorted(names))} statistic (WINO's shadow block)"
    if not m.able.shadow:
        return (
            f"{what} needs a model that takes an explicit attention mask and unshifted logits; {m.able.name} does not: "
            f"use `+decoder=fast_dllm` instead of decoder {m.decoder.name!r} (WINO's wide draft without the shadow block)"
        )
    fix = ["cache=none"] if m.cache.name not in ("none", "prefix") else []
    fix += ["decoder.guidance.scale=0"] if m.decoder.guidance.active else []
    if fix:
        return f"{what} needs cache=none or prefix and no guidance; got cache={m.cache.name}: use `{' '.join(fix)}`"
    return None


def _whole_block_steps(m: Meeting) -> str | None:
    """11. A rule that decides blocks whole opens what it does not keep to fresh noise: a model with a mask token cannot
    (a rule that fills masks on a model without one is replaced by the model's own step: :func:`with_model_parts`)."""
    if m.decoder.commit.decides_whole_block and has_mask_token(m.able):
        return (
            f"decoder {m.decoder.name!r} re-decides a canvas of uniform noise every step; {m.able.name} fills a masked "
            f"canvas: use `+decoder=llada` instead of decoder {m.decoder.name!r} (a decoder for masked diffusion)"
        )
    return None


def _parts_without_mask_token(m: Meeting) -> str | None:
    """12. Without a mask token, re-masking revisions, guidance's masked prompt and the re-mask re-check have no meaning."""
    if has_mask_token(m.able):
        return None
    if m.decoder.revision.revises:
        return (
            f"decoder {m.decoder.name!r} returns committed tokens to the mask; on {m.able.name} every step already "
            "re-noises what it does not keep: use `'~decoder.revision'` (the decoder without its revision)"
        )
    if m.decoder.guidance.active:
        return f"decoder.guidance masks the prompt with the mask token; {m.able.name} has none: use `decoder.guidance.scale=0`"
    if m.decoder.population.rechecks:
        return (
            f"decoder {m.decoder.name!r} scores its particles by re-masking groups of committed tokens for the model to "
            f"re-check; {m.able.name} has no mask: use `decoder/population/score=log_probability`"
        )
    return None


def _temperature(m: Meeting) -> str | None:
    """13. One owner decides the token temperature (:func:`~dlmsearch.search.plan.temperature_owner`): a temperature
    set for another is refused."""
    owner = m.owner
    if owner.takes_settings:
        return None
    population = m.decoder.population.temperature_owner
    if population is not None and population != owner:
        return (
            f"{population.source} would be ignored: {owner.source} decides the temperature here: use another "
            "diversity, `decoder/population/diversity=order_temperature`"
        )
    settings = (("engine.temperature", m.temperature), ("decoder.sampling.temperature", m.decoder.sampling.temperature))
    for setting, value in settings:
        if value is not None and value != owner.value:
            return (
                f"{setting}={value} would be ignored: {owner.source} decides the temperature here: "
                f"use `{setting}=null`; to change the temperature, {owner.instead}"
            )
    return None


def _sharded_layerwise(m: Meeting) -> str | None:
    """14. A layerwise cache's per-layer choices need every head: not a tensor-parallel model's shard."""
    if m.cache.layerwise and m.able.tensor_parallel > 1:
        return (
            f"cache={m.cache.name} chooses what to recompute per layer from every attention head; with "
            f"model.tensor_parallel={m.able.tensor_parallel} a rank holds some heads only: use `cache=none` "
            "(or `model.tensor_parallel=1`)"
        )
    return None


def _sharded_compile(m: Meeting) -> str | None:
    """15. engine.compile's per-token graphs cannot hold a tensor-parallel model's all-reduce."""
    if m.compile and m.able.tensor_parallel > 1:
        return (
            f"engine.compile=true with model.tensor_parallel={m.able.tensor_parallel}: the all-reduce would sit inside "
            "the compiled per-token graphs, which dlmsearch does not support: use `engine.compile=false`"
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
        f"{', '.join(missing)}: use `decoder/trigger=never` (or a preset with a whole lookahead, e.g. +decoder=adalook)"
    )


def _lookahead_over_revision(m: Meeting) -> str | None:
    """16. Lookahead branches roll with the base rule alone: a revision would not see them."""
    if not (m.decoder.trigger.explores and m.decoder.revision.revises):
        return None
    fix = "`decoder/trigger=never` (populations do combine with a revision)"
    if m.decoder.tree is not None:  # a tree search explores by definition: drop the revision instead
        fix = "`'~decoder.revision'` (the tree search without a revision)"
    return (
        f"decoder {m.decoder.name!r} revises commits ({type(m.decoder.revision).__name__}) and explores (trigger "
        f"{type(m.decoder.trigger).__name__}): lookahead branches roll with the base rule alone, so the two are refused "
        f"together: use {fix}"
    )


# +decoder=mcts's parts: what a tree search that lacks one is told to set
TREE_PARTS = {
    "trigger": "always",
    "candidates": "top_confidence",
    "expansion": "puct",
    "scorer": "likelihood_value",
    "selector": "most_visited",
}


def _tree_parts(decoder: DecoderSettings) -> list[str]:
    """The overrides that give a tree search the parts it lacks (``+decoder/X=``: a group the preset has not)."""
    methods = {"candidates": "moves", "expansion": "select", "scorer": "value", "selector": "child"}
    wrong = [n for n, method in methods.items() if not hasattr(getattr(decoder, n), method)]
    wrong = ["trigger"] * (not decoder.trigger.explores) + wrong
    return [f"{'+' * (getattr(decoder, n) is None)}decoder/{n}={TREE_PARTS[n]}" for n in wrong]


def _tree_search(m: Meeting) -> str | None:
    """21. A tree search commits masked positions with its own parts, one sample per tree, from exact evaluations
    (no cache, or an exact one: an approximate cache's error would reach the values it compares)."""
    decoder = m.decoder
    if decoder.tree is None:
        return None
    if not has_mask_token(m.able):  # first: no part would make it run here
        return (
            f"decoder {decoder.name!r} searches a tree of commits to masked positions; {m.able.name} denoises uniform "
            f"noise, which re-decides every position each step: use `+decoder=best_of_n` instead of decoder {decoder.name!r} "
            "(and no +decoder/tree)"
        )
    parts = _tree_parts(decoder)
    if parts:  # the whole fix: the parts, and no revision (rule 16) or population (below) to refuse next
        fix = parts + ["'~decoder.revision'"] * decoder.revision.revises
        fix += ["'~decoder.population'"] * (decoder.population.size > 1)
        return (
            f"decoder {decoder.name!r} sets decoder.tree, which needs a trigger that explores, candidates, and a tree "
            f"policy (expansion), leaf value (scorer) and tree selector: use `{' '.join(fix)}` (+decoder=mcts's parts)"
        )
    if decoder.population.size > 1:
        return f"decoder {decoder.name!r} searches a tree per sample: use `'~decoder.population'` (one tree, no population)"
    if m.cache.layerwise or (m.cache.stores and not m.cache.exact):
        return (
            f"cache={m.cache.name} reuses stale keys and values (of positions that changed since), and their error would "
            f"reach the values the tree compares: use `cache={_exact_cache(m)}`"
        )
    return None


def _whole_blocks(m: Meeting) -> str | None:
    """18. The generation is a whole number of blocks (a uniform-noise model's canvases, a block model's blocks;
    not a length that changes while decoding, whose canvas runs to the end of its last block)."""
    if m.gen_length % m.block_length == 0 or (m.decoder.length.changes and m.able.attention_block is None):
        return None
    whole = -(-m.gen_length // m.block_length) * m.block_length
    fix = f"task.gen_length={whole}"
    if m.able.canvas_length is not None:
        what = f"this model's canvases of {m.block_length} (it denoises a canvas whole)"
    elif m.able.attention_block is not None:
        what = f"the blocks of {m.block_model}"
    elif m.decoder.block_length is not None:  # the decoder's blocks: the largest that divide the generation
        what = f"the blocks of {m.block_length} of decoder {m.decoder.name!r}"
        fix = f"++decoder.block_length={max(b for b in range(1, m.block_length) if m.gen_length % b == 0)}"
    else:
        what = f"decoding blocks of {m.block_length} (task.block_length)"
    return f"the generation length ({m.gen_length}) must be a whole number of {what}: use `{fix}`"


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
        "leave masks behind (rows would decode windows of different lengths): use `decoder/commit=wide_in`"
    )


def _length_policy(m: Meeting) -> str | None:
    """22. A length that changes while decoding: a ceiling at least the initial length, on a masked model
    whose canvas columns are its own (no block diffusion, no uniform noise), with nothing stored per column
    that would have to move with an insertion (no cache, KLASS's history, a revision's record)."""
    length = m.decoder.length
    if not length.changes:
        return None
    if length.max_length is not None and length.max_length < m.gen_length:
        return (
            f"decoder.length.max_length ({length.max_length}) is below the initial length task.gen_length="
            f"{m.gen_length}: use `decoder.length.max_length={m.gen_length}`"
        )
    name = type(length).__name__
    reads = {REGISTRY[statistic].source for statistic in m.decoder.statistics}
    fixed, no_cache = "decoder/length=fixed", "cache=none"
    # a model that decodes block by block (canvas by canvas) and stops at its end token spends only the
    # blocks it decodes: a fixed canvas at the ceiling is its growth by whole blocks, its exact cache untouched
    at_ceiling = "decoder/length=fixed decoder.stop_at_eos=true"
    blockers = [  # (why, whether it holds, the fix): the model's own first (no setting of the decoder helps there)
        (
            (
                "a block-diffusion model's blocks are fixed in the canvas and decode one after another, so a "
                "canvas at the ceiling (task.gen_length) costs only the blocks decoded up to the end token"
            ),
            m.able.attention_block is not None,
            at_ceiling,
        ),
        (
            (
                "a uniform-noise model denoises canvases of its own length one after another, so a canvas at "
                "the ceiling (task.gen_length) costs only the canvases decoded up to the end token"
            ),
            not has_mask_token(m.able),
            at_ceiling,
        ),
        (
            "the model declares no end-of-sequence id to read its confidence in",
            not (m.able.stop_ids or length.eos_id),
            fixed,
        ),
        ("a cache's stored keys would not follow the columns", m.cache.stores or m.cache.layerwise, no_cache),
        ("a revision keeps a record per column", m.decoder.revision.revises, fixed),
        ("KLASS's history is kept per column", "history" in reads, fixed),
        (
            "a fixed number of steps per block cannot follow blocks that grow (both papers commit by Fast-dLLM's threshold)",
            getattr(m.decoder.commit, "steps", None) is not None,
            "decoder/commit=threshold",
        ),
    ]
    why, fix = next(((reason, fix) for reason, blocks, fix in blockers if blocks), (None, None))
    if why is None:
        return None
    return f"decoder {m.decoder.name!r} cannot change its length ({name}): {why}: use `{fix}`"


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
    _length_policy,
)
