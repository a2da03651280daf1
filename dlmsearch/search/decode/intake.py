"""Request intake: a sample as the loop takes it (:class:`DecodeRequest`), what only the requests can
show checked against the plan, and the state before a batch's first round."""

from __future__ import annotations

import time

import attrs
import torch

from dlmsearch.core.sampling import Sampling
from dlmsearch.search.components.commit import row_options
from dlmsearch.search.decode.state import DecodeState
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.plan import DecodePlan
from dlmsearch.search.records.row_sampling import RowSampling
from dlmsearch.search.records.slots import Slots
from dlmsearch.search.records.state import ABSENT, Evaluation, block_aligned, initial_canvas
from dlmsearch.search.records.usage import Usage


@attrs.frozen
class DecodeRequest:
    """One sample: ``uid`` names it in the decode; ``generation`` holds the mask where to fill.
    Its randomness is keyed by ``seed`` (None: the engine's) and ``key`` (None: the uid), so a
    server's request decodes as item 0 of an offline run with its seed, beside other requests;
    its ``sampling`` lets it sample as an offline run with those engine settings would, in the
    same forward as requests that sample otherwise."""

    uid: int
    prompt: torch.Tensor
    generation: torch.Tensor
    seed: int | None = None
    key: int | None = None
    sampling: Sampling | None = None  # its own temperature, top_p, top_k over the decode's (None: the decode's)
    options: dict[str, float] | None = None  # its own values of the commit rule's row options (``threshold``)


def start(engine: RolloutEngine, plan: DecodePlan, requests: list[DecodeRequest]) -> DecodeState:
    """The state before the first round: checks the batch against the plan and lays out the
    canvases; the counters start at zero."""
    gen_length = len(requests[0].generation)
    check_requests(plan, requests)
    size = plan.population.size
    mask_id = engine.capabilities.open_id
    if plan.attention_block is None:
        prompts, templates = [r.prompt for r in requests], [r.generation for r in requests]
        region = torch.tensor([[0, gen_length]] * len(requests), dtype=torch.long)
    else:  # block diffusion: every row's blocks start at the same column (``block_aligned``)
        laid = [block_aligned(r.prompt, r.generation, plan.attention_block, mask_id) for r in requests]
        prompts, templates = [head for head, _, _ in laid], [template for _, template, _ in laid]
        region = torch.tensor([list(columns) for _, _, columns in laid], dtype=torch.long)
    layout = plan.layout(max(len(p) for p in prompts))
    extra = layout.gen_length - len(templates[0])  # a variable-length canvas's absent columns to its last block's end
    templates = (
        [torch.cat([t, torch.full((extra,), ABSENT, dtype=torch.long)]) for t in templates] if extra else templates
    )
    canvas = initial_canvas(
        [p for p in prompts for _ in range(size)],
        [t for t in templates for _ in range(size)],
        layout,
        mask_id,
        pad_id=mask_id,
    )
    canvas = plan.length.prepare(plan.commit.prepare(canvas))
    slots = len(requests) * size
    long = lambda values: torch.tensor(values, dtype=torch.long)
    slots_table = Slots.start(
        long([r.uid for r in requests]),
        size,
        long([engine.seed if r.seed is None else r.seed for r in requests]),
        region,
        long([r.uid if r.key is None else r.key for r in requests]),
        RowSampling.of([(r.sampling or Sampling()).over(plan.sampling) for r in requests]),
        {
            name: torch.tensor(
                [float((r.options or {}).get(name, getattr(plan.commit, name))) for r in requests],
                dtype=torch.float64,
            )
            for name in row_options(plan.commit)
        },
    )
    return DecodeState(
        plan=plan,
        layout=layout,
        canvas=canvas,
        evaluation=Evaluation.empty(slots, layout.width, plan.statistics),
        evaluated=torch.zeros(slots, dtype=torch.bool),
        late=torch.zeros(slots, dtype=torch.bool),
        slots=slots_table,
        population=plan.population.start(slots_table),
        usage=Usage.zeros(len(requests)),
        rounds=torch.zeros(len(requests), dtype=torch.long),
        memory=engine.memory(slots),
        started=torch.full((len(requests),), time.monotonic(), dtype=torch.float64),
    )


def check_requests(plan: DecodePlan, requests: list[DecodeRequest]) -> None:
    """What only the requests can show: one generation length, canvases that fit, ids in the vocabulary."""
    if any(len(r.generation) != plan.gen_length for r in requests):
        raise ValueError(f"all requests of a decode must share the plan's generation length ({plan.gen_length})")
    longest = max(requests, key=lambda r: len(r.prompt))
    plan.check_canvas(len(longest.prompt), f"the canvas of sample uid {longest.uid}")
    own = [(r.uid, r.sampling) for r in requests if r.sampling is not None]
    confidence = [uid for uid, s in own if s.confidence not in (None, plan.sampling.confidence)]
    if confidence:
        raise ValueError(
            f"sample uid(s) {confidence} read the confidence otherwise than the decode "
            f"(confidence={plan.sampling.confidence!r}): one decode reads it one way"
        )
    check_options(plan, requests)
    tempered = [uid for uid, s in own if s.temperature is not None]
    if tempered and not plan.temperature.takes_settings:  # the plan's rule 13, for a request's own temperature
        raise ValueError(
            f"the own temperature of sample uid(s) {tempered} would be ignored: {plan.temperature.source} "
            f"decides the temperature here; {plan.temperature.instead}"
        )
    bad = [r.uid for r in requests if bool(((r.prompt < 0) | (r.prompt >= plan.vocab_size)).any())]
    if bad:
        raise ValueError(f"prompt token ids outside the vocabulary [0, {plan.vocab_size}) in sample uid(s) {bad}")
    media = torch.tensor(plan.media_ids, dtype=torch.long)
    with_media = [r.uid for r in requests if bool(torch.isin(r.prompt, media).any())]
    if with_media:
        raise ValueError(
            f"the prompt of sample uid(s) {with_media} holds image or audio token ids {list(plan.media_ids)}: "
            "dlmsearch decodes text only (no image or audio inputs)"
        )


def check_options(plan: DecodePlan, requests: list[DecodeRequest]) -> None:
    """A sample's own commit options: ones its rule reads per row, each a value the rule accepts."""
    names = row_options(plan.commit)
    for request in requests:
        for name, value in (request.options or {}).items():
            if name not in names:
                raise ValueError(
                    f"sample uid {request.uid} sets decoder.commit.{name}, which decoder {plan.name!r} cannot take "
                    f"per sample (its commit rule takes {', '.join(names) or 'none'} per sample)"
                )
            attrs.evolve(plan.commit, **{name: value})  # the rule's own check, naming the field
