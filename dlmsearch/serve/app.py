"""The HTTP face: OpenAI's endpoints over the decode loop (FastAPI).

``POST /v1/completions`` and ``POST /v1/chat/completions`` turn a body into a :class:`Job`
(prompts encoded as the text tasks encode them, ``max_tokens`` rounded up to whole blocks as
the generation length, the lane its settings need), queue it, and answer with the whole
response or, with ``stream: true``, Server-Sent Events. ``GET /v1/models``, ``GET /health``
and ``GET /metrics`` report on the server. Every failure is OpenAI's error body with its status;
nothing a request does can stop the server. A request that the shutdown cuts off (still running
when ``serve.grace_s`` is over) gets a 503 ``server_shutdown`` body too, or on a stream an error
event and ``[DONE]``, and the log one line for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from omegaconf import DictConfig
from starlette.exceptions import HTTPException

from dlmsearch.api import prompt_list
from dlmsearch.config import build, decoder_presets
from dlmsearch.search.driver import DecodeRequest, DecodeResult
from dlmsearch.serve.lanes import Lanes
from dlmsearch.serve.metrics import ServerMetrics
from dlmsearch.serve.protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    Sampled,
    chunk_body,
    completion_body,
    parse,
    usage,
)
from dlmsearch.serve.scheduler import Choice, Job, Scheduler
from dlmsearch.tasks.text import TextTask
from dlmsearch.validation import number

DISCONNECT_POLL_S = 0.25
COUNTERS = ("steps", "decoder_forwards", "row_forwards", "token_forwards", "tokens_committed")


def _cut_at_stops(text: str, stops: list[str], final: bool) -> tuple[str, bool]:
    """``text`` up to the first stop string (and whether one was found); while streaming, a tail
    that could still become a stop string is held back."""
    found = [at for at in (text.find(s) for s in stops) if at >= 0]
    if found:
        return text[: min(found)], True
    if not final:
        for keep in range(min(len(text), max((len(s) for s in stops), default=1) - 1), 0, -1):
            if any(s.startswith(text[-keep:]) for s in stops):
                return text[:-keep], False
    return text, False


@attrs.frozen(kw_only=True)
class ServeLimits:
    """The server's limits (``serve.*``), typed and in range before the model loads."""

    max_batch: int = number(int, 1)
    max_queue: int = number(int, 1)
    max_n: int = number(int, 1)
    max_body_bytes: int = number(int, 1)
    max_lanes: int = number(int, 1)
    batch_wait_ms: float = number(float, 0)
    grace_s: float = number(float, 0)
    max_rows: int | None = number(int, 1, optional=True)  # None: the engine's row budget


def check_limits(serve: DictConfig) -> ServeLimits:
    """``serve``'s limits, or one line naming the key that is out of range (``serve.KEY must be ...``)."""
    try:
        return ServeLimits(**{field.name: serve.get(field.name) for field in attrs.fields(ServeLimits)})
    except (TypeError, ValueError) as error:
        raise ValueError(f"serve.{error}") from None


class Server:
    """The model, the lanes built over it, the decode loop, and how requests become jobs and results become bodies."""

    def __init__(self, cfg: DictConfig, overrides: list[str], model_name: str) -> None:
        serve = cfg.serve
        limits = check_limits(serve)
        self.cfg, self.model_name = cfg, str(serve.model_name or model_name)
        self.adapter = build(cfg, "model")
        # One tokenizer: completions encode raw text (``task.chat=false``), chat requests go through
        # ``encode_messages`` (the chat template, as ``task.chat=true`` encodes one user message)
        self.task: TextTask = prompt_list(cfg.task, chat=False)
        self.block_length = int(cfg.task.block_length)
        self.default_tokens = int(cfg.task.gen_length)
        self.max_n, self.max_body, self.grace_s = limits.max_n, limits.max_body_bytes, limits.grace_s
        decoder = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("decoder=")), None)
        if decoder is None:
            raise ValueError("no decoder chosen: add +decoder=NAME")
        presets = decoder_presets() if serve.presets == "all" else list(serve.presets)
        unknown = sorted(set(presets) - set(decoder_presets()))
        if unknown:
            raise ValueError(
                f"serve.presets names unknown preset(s) {', '.join(unknown)}; one of: {', '.join(decoder_presets())} (or all)"
            )
        self.lanes = Lanes(
            tuple(overrides),
            cfg,
            self.adapter,
            self.task,
            tuple(dict.fromkeys([decoder, *presets])),
            tuple(serve.request_options),
            limits.max_lanes,
        )
        self.lane_lock = asyncio.Lock()
        own = self.lanes.get(
            self.lanes.key(None, self.default_tokens, None, None, None, {}, None)
        )  # the server's own settings are checked before it listens
        self.metrics = ServerMetrics()
        max_rows = limits.max_rows or own.engine.max_rows
        self.scheduler = Scheduler(
            self.metrics,
            limits.max_batch,
            max_rows,
            limits.max_queue,
            self._result,
            self._progress,
            limits.batch_wait_ms / 1000,
        )

    # ------------------------------------------------------------------ requests into jobs

    def _prompts(self, body: Sampled) -> list[torch.Tensor]:
        task = self.task
        if isinstance(body, ChatRequest):
            try:
                return [task.encode_messages([{"role": m.role, "content": m.text()} for m in body.messages])]
            except ValueError as error:  # a content part that is not text, or a tokenizer without a chat template
                raise APIError(400, f"messages: {error}", param="messages") from None
        assert isinstance(body, CompletionRequest)
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if any(not t for t in texts):
            raise APIError(400, "prompt: an empty prompt gives the model nothing to condition on", param="prompt")
        return [task.encode(t) for t in texts]

    async def job(self, body: Sampled, post: Any) -> Job:
        """Check a request against the server and build its job (nothing is queued yet)."""
        if body.model != self.model_name:
            raise APIError(
                404,
                f"the model {body.model!r} does not exist here; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        if body.n > self.max_n:
            raise APIError(400, f"n={body.n} is above this server's limit of {self.max_n} (serve.max_n)", param="n")
        prompts = self._prompts(body)
        max_tokens = body.max_tokens or self.default_tokens
        gen_length = -(-max_tokens // self.block_length) * self.block_length
        key = self.lanes.key(
            body.preset, gen_length, body.temperature, body.top_p, body.top_k, dict(body.decoder), body.deadline_s
        )
        async with self.lane_lock:  # Hydra's composition is not thread-safe: one lane is built at a time
            lane = await asyncio.to_thread(self.lanes.get, key)
        try:
            lane.plan.check_canvas(max(len(p) for p in prompts), f"the prompt with max_tokens={max_tokens}")
        except ValueError as error:
            raise APIError(400, str(error), param="max_tokens", code="context_length_exceeded") from None
        seed = int(self.cfg.seed) if body.seed is None else int(body.seed)
        mask = torch.full((gen_length,), self.adapter.mask_id, dtype=torch.long)
        choices = [
            # Item ``p * n + i`` of an offline task holding each prompt n times, with this seed.
            Choice(
                uid,
                p * body.n + i,
                DecodeRequest(uid=uid, prompt=prompt, generation=mask.clone(), seed=seed, key=p * body.n + i),
            )
            for p, prompt in enumerate(prompts)
            for i in range(body.n)
            for uid in [self.scheduler.new_uid()]
        ]
        return Job(
            lane=lane,
            choices=choices,
            post=post,
            max_tokens=max_tokens,
            stops=list(body.stop or []),
            stream=body.stream,
            prompt_tokens=sum(len(p) for p in prompts),
        )

    # ------------------------------------------------------------------ results into bodies (called on the loop's thread)

    def _text(self, job: Job, tokens: torch.Tensor, final: bool) -> tuple[str, str, int]:
        """The choice's text so far, why it ended (final only) and its completion tokens."""
        task = job.lane.task
        ids = task.generated_ids(tokens)
        ended = len(ids) < len(tokens)
        if len(ids) > job.max_tokens:
            ids, ended = ids[: job.max_tokens], False
        text, stopped = _cut_at_stops(task.decode(torch.tensor(ids, dtype=torch.long)), job.stops, final)
        if not final and text.endswith("\ufffd"):  # a character whose bytes are not all committed yet
            text = text.rstrip("\ufffd")
        return text, "stop" if ended or stopped else "length", len(ids)

    def _result(self, job: Job, choice: Choice, result: DecodeResult) -> dict[str, Any]:
        text, reason, count = self._text(job, result.tokens, final=True)
        unsent = text.removeprefix(choice.sent)
        self.metrics.tokens.inc(count)
        counters = {name: getattr(result, name) for name in COUNTERS} | {"deadline_hit": result.deadline_hit}
        return {
            "index": choice.index,
            "text": text,
            "unsent": unsent,
            "finish_reason": reason,
            "completion_tokens": count,
            **counters,
        }

    def _progress(self, job: Job, choice: Choice, tokens: torch.Tensor, settled: int) -> None:
        block = job.lane.plan.block_length
        if settled < len(tokens):
            settled -= settled % block  # whole blocks only
        if settled == 0:
            return
        text, _, _ = self._text(job, tokens[:settled], final=False)
        if len(text) > len(choice.sent) and text.startswith(choice.sent):
            delta, choice.sent = text[len(choice.sent) :], text
            job.post(("delta", choice.index, delta))

    # ------------------------------------------------------------------ shutting down

    def cut_off(self) -> int:
        """The grace after SIGTERM is over: answer every request still queued or running with a 503
        ``server_shutdown`` (a client should retry it elsewhere: the same seed gives the same text),
        and log one line for each instead of the cancelled tasks' tracebacks. Returns how many."""
        error = APIError(
            503,
            f"the server shut down before this request finished: serve.grace_s ({self.grace_s:g} s after SIGTERM) was over; retry it",
            code="server_shutdown",
        )
        now = time.monotonic()
        jobs = self.scheduler.expire(error)
        for job in jobs:
            print(_cut_off_line(job, now), file=sys.stderr, flush=True)
        return len(jobs)

    def totals(self, job: Job, done: list[dict[str, Any]]) -> dict[str, Any]:
        """The response's usage: OpenAI's token counts, then the decode's counters summed over the choices."""
        counters = {name: sum(c[name] for c in done) for name in COUNTERS}
        counters |= {
            "deadline_hit": any(c["deadline_hit"] for c in done),
            "gen_length": job.choices[0].request.generation.numel(),
            "preset": job.lane.key.preset,
        }
        return usage(job.prompt_tokens, sum(c["completion_tokens"] for c in done), counters)


def _cut_off_line(job: Job, now: float) -> str:
    """The log line for a request the shutdown cut off: which, how long it ran, how far it got."""
    state = "queued" if job.admitted is None else f"running {now - job.admitted:.1f} s"
    answer = (
        "its stream ended with a server_shutdown error event and [DONE]"
        if job.stream
        else "answered 503 server_shutdown"
    )
    return f"dlmsearch.serve: {job.request_id} cut off by the shutdown ({state}, {job.finished} of {len(job.choices)} choices done): {answer}"


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The decode loop runs exactly as long as the app does."""
    server: Server = app.state.server
    server.scheduler.start()
    yield
    server.scheduler.stop()


async def _api_error(request: Request, error: APIError) -> JSONResponse:
    """A request's own failure answers with OpenAI's error body and its status."""
    return JSONResponse(error.body(), status_code=error.status)


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's errors (an unknown path, a wrong method) answer in OpenAI's error body too."""
    return JSONResponse(
        APIError(
            error.status_code,
            f"{request.method} {request.url.path}: {error.detail}",
            code="not_found" if error.status_code == 404 else None,
        ).body(),
        status_code=error.status_code,
    )


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    """A bug answers 500 in OpenAI's error body instead of stopping the server."""
    return JSONResponse(
        APIError(500, f"{type(error).__name__}: {error}", code="internal_error").body(), status_code=500
    )


class _Endpoints:
    """The routes over one server: the two completion endpoints and the three reports."""

    def __init__(self, server: Server) -> None:
        self.server = server

    async def read_body(self, request: Request) -> bytes:
        """The body, refused with a 413 as soon as it is known to be above ``serve.max_body_bytes``."""
        server = self.server
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > server.max_body:
            raise APIError(
                413,
                f"the request body is {declared} bytes, above this server's limit of {server.max_body} (serve.max_body_bytes)",
                code="body_too_large",
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > server.max_body:
                raise APIError(
                    413,
                    f"the request body is above this server's limit of {server.max_body} bytes (serve.max_body_bytes)",
                    code="body_too_large",
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def complete(self, request: Request, kind: type[Sampled], chat: bool) -> Response:
        """Queue the request's job, then answer with a stream or, once every choice is done, the whole body."""
        server = self.server
        server.scheduler.check_open()
        body = parse(await self.read_body(request), kind)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        job = await server.job(body, lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        request_id = job.request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        server.scheduler.submit(job)
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage", False))
            return StreamingResponse(
                _sse(server, job, events, request_id, chat, include_usage, request), media_type="text/event-stream"
            )
        done = await self.wait_for_choices(job, events, request)
        if done is None:
            return Response(status_code=499)
        done.sort(key=lambda c: c["index"])
        return JSONResponse(completion_body(request_id, server.model_name, chat, done, server.totals(job, done)))

    async def wait_for_choices(self, job: Job, events: asyncio.Queue, request: Request) -> list[dict[str, Any]] | None:
        """Every choice's result, or None once the client has gone (its job's slots are freed then)."""
        server = self.server
        done: list[dict[str, Any]] = []
        try:
            while len(done) < len(job.choices):
                try:
                    event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        server.scheduler.cancel(job)
                        return None
                    continue
                if event[0] == "error":
                    raise event[1]
                if event[0] == "choice":
                    done.append(event[2])
        except asyncio.CancelledError:
            server.scheduler.cancel(job)
            raise
        return done

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``: raw text prompts."""
        return await self.complete(request, CompletionRequest, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``: messages through the chat template."""
        return await self.complete(request, ChatRequest, chat=True)

    async def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the one model this server serves."""
        return {
            "object": "list",
            "data": [
                {"id": self.server.model_name, "object": "model", "created": int(time.time()), "owned_by": "dlmsearch"}
            ],
        }

    async def health(self) -> JSONResponse:
        """``GET /health``: the scheduler's state, 503 while draining so a balancer stops sending."""
        state = self.server.scheduler.snapshot()
        draining = self.server.scheduler.draining
        return JSONResponse({"status": "draining" if draining else "ok", **state}, status_code=503 if draining else 200)

    async def metrics(self) -> Response:
        """``GET /metrics``: Prometheus' text format."""
        return Response(self.server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def create_app(server: Server) -> FastAPI:
    """The FastAPI application over ``server`` (its decode loop starts with the app)."""
    app = FastAPI(title="dlmsearch", docs_url=None, redoc_url=None, openapi_url=None, lifespan=_lifespan)
    app.state.server = server
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    endpoints = _Endpoints(server)
    app.post("/v1/completions")(endpoints.completions)
    app.post("/v1/chat/completions")(endpoints.chat_completions)
    app.get("/v1/models")(endpoints.models)
    app.get("/health")(endpoints.health)
    app.get("/metrics")(endpoints.metrics)
    return app


async def _sse(
    server: Server, job: Job, events: asyncio.Queue, request_id: str, chat: bool, include_usage: bool, request: Request
) -> AsyncIterator[str]:
    """Each choice's settled text as it comes, its finish chunk, the usage chunk if asked, then ``[DONE]``.
    Between events it asks whether the client is still there (a send to a closed connection
    alone would notice only at the next block), and frees the request's slots when it is not.

    Args:
        server: the server whose scheduler runs the job and whose model names the chunks.
        job: the queued job; its choices say how many finish chunks to wait for.
        events: the job's events as the decode loop posts them: ``("delta", index, text)``,
            ``("choice", index, result)`` or ``("error", APIError)``.
        request_id: the response's id (``cmpl-...`` or ``chatcmpl-...``), repeated in every chunk.
        chat: chat chunks (a role chunk first, ``delta`` bodies) rather than completion chunks.
        include_usage: send the usage chunk (``stream_options.include_usage``) before ``[DONE]``.
        request: the client's request, polled for a disconnect between events.
    """
    model = server.model_name
    line = lambda data: f"data: {json.dumps(data)}\n\n"
    done: list[dict[str, Any]] = []
    try:
        if chat:
            for choice in job.choices:
                yield line(chunk_body(request_id, model, chat, choice.index, "", None, role=True))
        while len(done) < len(job.choices):
            try:
                event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                event = None
            if await request.is_disconnected():
                return
            if event is None:
                continue
            if event[0] == "error":
                yield line(event[1].body())
                break
            if event[0] == "delta":
                yield line(chunk_body(request_id, model, chat, event[1], event[2], None))
            elif event[0] == "choice":
                result = event[2]
                done.append(result)
                if result["unsent"]:
                    yield line(chunk_body(request_id, model, chat, result["index"], result["unsent"], None))
                yield line(
                    chunk_body(request_id, model, chat, result["index"], None if chat else "", result["finish_reason"])
                )
        else:
            if include_usage:
                body = chunk_body(
                    request_id, model, chat, 0, None, None, server.totals(job, sorted(done, key=lambda c: c["index"]))
                )
                body["choices"] = []
                yield line(body)
        yield "data: [DONE]\n\n"
    finally:
        if len(done) < len(job.choices):
            server.scheduler.cancel(job)
