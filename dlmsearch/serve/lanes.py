"""A lane: one combination of the settings that shape a decode, built once and shared.

A decode's plan depends on its generation length (the presets' schedules read
``task.gen_length``), on sampling (``engine.temperature``, ``top_p``, ``top_k``), on the preset
and its options, and on the deadline. Requests that agree on all of these but sampling share one
:class:`~dlmsearch.search.session.DecodeSession` (one forward per step for all of them, each
with its own seed, temperature, top-p and top-k, which ride along as per-row vectors: see
:attr:`Lane.shares`); requests that differ otherwise decode in different sessions, stepped in
turn by the one decode loop. Each lane is composed exactly as ``python -m dlmsearch`` composes a run from
``conf/serve.yaml`` (the server's own overrides, then the request's), so a served request
decodes what the CLI decodes.
"""

from __future__ import annotations

import fnmatch
from collections import OrderedDict
from typing import Any

import attrs
import torch
from omegaconf import DictConfig

from dlmsearch.api import compose_settings, with_ceiling
from dlmsearch.config import ConfigError, build, decoder_presets
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.components.commit import row_options
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.plan import DecodePlan
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.serve.protocol import APIError
from dlmsearch.tasks.text import TextTask


@attrs.frozen
class LaneKey:
    """What a lane's decode depends on (everything else is per request: prompt, seed, choices)."""

    preset: str
    gen_length: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    options: tuple[tuple[str, Any], ...] = ()  # sorted (key, value) pairs of decoder options
    deadline_s: float | None = None

    def shared(self, row_options: tuple[str, ...]) -> LaneKey:
        """The same settings at the server's own sampling and without the request's own values of the
        commit rule's ``row_options``: the lane whose session this one's requests may join."""
        per_row = {f"commit.{name}" for name in row_options}
        options = tuple(o for o in self.options if o[0] not in per_row)
        return attrs.evolve(self, temperature=None, top_p=None, top_k=None, options=options)

    def own_options(self, row_options: tuple[str, ...]) -> dict[str, float]:
        """The request's own values of the commit rule's ``row_options`` (``decoder.commit.NAME``)."""
        return {name: float(value) for key, value in self.options for name in row_options if key == f"commit.{name}"}

    @property
    def sampling(self) -> Sampling | None:
        """The request's own sampling settings (None: the server's)."""
        if self.temperature is None and self.top_p is None and self.top_k is None:
            return None
        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


@attrs.frozen(eq=False)
class Lane:
    """A built decoder, its engine over the server's model, the checked plan and the text task that reads outputs."""

    key: LaneKey
    decoder: SearchDecoder
    engine: RolloutEngine
    plan: DecodePlan
    verifier: Verifier | None
    task: TextTask
    deadline_s: float | None
    # The lane at the server's own sampling (and commit rule settings) whose session this lane's requests
    # join, each sampling and committing as it says (``key.sampling``, :attr:`own_options`); None: its own
    # session (it is that lane, or their plans differ otherwise).
    shares: Lane | None = None

    @property
    def host(self) -> Lane:
        """The lane whose session this lane's requests decode in."""
        return self.shares or self

    @property
    def own_sampling(self) -> Sampling | None:
        """What a request of this lane sets in its :class:`~dlmsearch.search.decode.intake.DecodeRequest` (``sampling``)."""
        return None if self.shares is None else self.key.sampling

    @property
    def own_options(self) -> dict[str, float] | None:
        """What a request of this lane sets in its :class:`~dlmsearch.search.decode.intake.DecodeRequest` (``options``)."""
        if self.shares is None:
            return None
        return self.key.own_options(row_options(self.plan.commit)) or None

    @property
    def rows_per_sample(self) -> int:
        """Rows one sample holds in a step: its particles, each with its lookahead branches, doubled under guidance."""
        explores = self.decoder.trigger.explores and self.decoder.candidates is not None
        width = 1 + (self.decoder.candidates.k if explores else 0)  # type: ignore[union-attr]
        return self.plan.population.size * width * (2 if self.plan.guidance > 0 else 1)

    @property
    def streams_blocks(self) -> bool:
        """Whether a committed block is final: no revision, one path (a population chooses its output at the end)."""
        return not self.plan.revision.revises and self.plan.population.size == 1


def _same(a: Any, b: Any) -> bool:
    """Whether two plans (or their parts) are equal field by field, tensors by value (a component
    holding one, PC-Sampler's position prior, has no boolean ``==``); anything else compares as it says."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if type(a) is not type(b):
        return False
    if attrs.has(type(a)):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in attrs.fields(type(a)))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@attrs.define(eq=False)
class Lanes:
    """Builds lanes from the server's config and keeps the most recently used ``limit`` of them."""

    overrides: tuple[str, ...]  # the server's own Hydra overrides (``+decoder=NAME`` among them)
    base: DictConfig  # composed from them
    adapter: ModelAdapter
    task: TextTask  # reads every lane's outputs (a lane's settings never change the tokenizer or the stop ids)
    allowed_presets: tuple[str, ...]
    allowed_options: tuple[str, ...]
    limit: int = 32
    built: OrderedDict = attrs.field(factory=OrderedDict)

    @property
    def preset(self) -> str:
        """The server's own decoder preset."""
        return self.allowed_presets[0]

    def key(
        self,
        preset: str | None,
        gen_length: int,
        temperature: float | None,
        top_p: float | None,
        top_k: int | None,
        options: dict[str, Any],
        deadline_s: float | None,
    ) -> LaneKey:
        """The lane a request asks for; an option or preset the server does not allow is a 400.

        Args:
            preset: the request's decoder preset; None is the server's own.
            gen_length: the canvas length, ``max_tokens`` rounded up to whole blocks.
            temperature: the request's sampling temperature; None keeps the preset's.
            top_p: the request's nucleus mass; None keeps the preset's.
            top_k: the request's top-k; None keeps the preset's.
            options: the request's ``decoder.*`` overrides, each checked against ``serve.request_options``.
            deadline_s: the request's time budget; None takes the server's ``deadline_s``.
        """
        preset = preset or self.preset
        if preset not in self.allowed_presets:
            known = "" if preset in decoder_presets() else " (no such preset)"
            raise APIError(
                400,
                f"preset {preset!r}{known} is not served here; this server allows: {', '.join(self.allowed_presets)}",
                param="preset",
                code="preset_not_allowed",
            )
        for name, value in options.items():
            key = f"decoder.{name}"
            if not any(fnmatch.fnmatchcase(key, pattern) for pattern in self.allowed_options):
                allowed = ", ".join(self.allowed_options) or "none"
                raise APIError(
                    400,
                    f"decoder option {name!r} may not be set by a request here (serve.request_options: {allowed})",
                    param=f"decoder.{name}",
                    code="option_not_allowed",
                )
            if isinstance(value, (dict, list)):
                raise APIError(
                    400, f"decoder option {name!r} must be a number, string or boolean", param=f"decoder.{name}"
                )
        if deadline_s is None:
            deadline_s = self.base.get("deadline_s")
        return LaneKey(preset, gen_length, temperature, top_p, top_k, tuple(sorted(options.items())), deadline_s)

    def get(self, key: LaneKey) -> Lane:
        """The lane for ``key``, built on first use (a refused combination is a 400 naming the cause)."""
        if key in self.built:
            self.built.move_to_end(key)
            return self.built[key]
        lane = self._sharing(self._build(key))
        self.built[key] = lane
        while len(self.built) > self.limit:
            self.built.popitem(last=False)
        return lane

    def _sharing(self, lane: Lane) -> Lane:
        """``lane`` joining the session of the lane without its own sampling settings and commit
        thresholds, where their plans agree on everything else (the engine and the commit rule apply
        each row's own); else ``lane`` as it is (another preset, other options: its own session)."""
        names = row_options(lane.plan.commit)
        host_key = lane.key.shared(names)
        if host_key == lane.key:
            return lane
        try:
            host = self.get(host_key)
        except APIError:
            return lane
        own = lane.key.own_options(names)
        commit = lane.plan.commit  # at the host's values of the row options, to compare the rest
        if own:
            commit = attrs.evolve(commit, **{name: getattr(host.plan.commit, name) for name in own})
        # the rows carry their own sampling settings: the host's plan may name another of them as the temperature's source
        shared = attrs.evolve(lane.plan, sampling=host.plan.sampling, commit=commit, temperature=host.plan.temperature)
        same = _same(shared, host.plan)
        confidence = lane.plan.sampling.confidence == host.plan.sampling.confidence
        return attrs.evolve(lane, shares=host) if same and confidence else lane

    def config(self, key: LaneKey) -> DictConfig:
        """The config a lane decodes with: what ``python -m dlmsearch`` composes for the same settings."""
        overrides = [o for o in self.overrides if not o.lstrip("+").startswith("decoder=")] + [f"+decoder={key.preset}"]
        engine = [
            (f"engine.{name}", getattr(key, name))
            for name in ("temperature", "top_p", "top_k")
            if getattr(key, name) is not None
        ]
        settings = [
            ("task.gen_length", key.gen_length),
            *engine,
            *((f"decoder.{k}", v) for k, v in key.options),
            ("deadline_s", key.deadline_s),
        ]
        return compose_settings(overrides, settings, "serve")

    def _length(self, decoder: SearchDecoder, tokens: int) -> tuple[SearchDecoder, int]:
        """A decoder whose length changes starts at the server's ``task.gen_length`` and stops at the
        request's ``max_tokens`` (in whole blocks); any other generates ``max_tokens``."""
        if not decoder.length.changes:
            return decoder, tokens
        return with_ceiling(decoder, tokens), min(int(self.base.task.gen_length), tokens)

    def _build(self, key: LaneKey) -> Lane:
        try:
            cfg = self.config(key)
            decoder, gen_length = self._length(build(cfg, "decoder"), key.gen_length)
            engine = build(cfg, "engine", adapter=self.adapter)
            verifier = self.task.verifier([])
            plan = decoder.plan(engine, gen_length, int(cfg.task.block_length), verifier)
        except (ConfigError, ValueError, TypeError) as error:
            param = "decoder" if key.options else "preset" if key.preset != self.preset else None
            raise APIError(
                400, f"this decoder cannot serve the request: {error}", param=param, code="decoder_refused"
            ) from None
        return Lane(key, decoder, engine, plan, verifier, self.task, cfg.get("deadline_s"))
