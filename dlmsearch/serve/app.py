"""The HTTP face: OpenAI's endpoints in a front process, the decode loop in the engine process (FastAPI).

A :class:`Front` parses a body, checks it against what it can check without the model (the
model's name, ``n``, the prompts), tokenises it (the tokenizer is its own: cheap to load) and
hands the engine a :class:`~dlmsearch.serve.engine.Submission` over its pipe; the engine checks
the lane (preset, options, the canvas), queues the job or answers the error, and then sends the
choices' token ids, which the front turns into the whole response or, with ``stream: true``,
Server-Sent Events. ``GET /v1/models`` is the front's own answer; ``GET /health`` and ``GET
/metrics`` ask the engine. Every failure is OpenAI's error body with its status; nothing a
request does can stop the server. A request that the shutdown cuts off (still running when
``serve.grace_s`` is over) gets a 503 ``server_shutdown`` body too, or on a stream an error event
and ``[DONE]``; the engine logs one line for it.

``python -m dlmsearch.serve`` runs ``serve.workers`` fronts (:func:`run_front`), each its own
process on the one listening socket; :class:`Server` joins an engine and one front inside one
process (tests, embedding) over the same pipe protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from multiprocessing.connection import Connection
from typing import Any

import attrs
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from omegaconf import DictConfig, OmegaConf
from starlette.exceptions import HTTPException

from dlmsearch.api import prompt_list
from dlmsearch.serve.engine import (
    COUNTERS,
    Engine,
    FrontSettings,
    ServeLimits,
    Submission,
    check_limits,
    error_message,
)
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
from dlmsearch.tasks.text import TextTask

__all__ = ["Front", "ServeLimits", "Server", "check_limits", "create_app", "run_front"]

DISCONNECT_POLL_S = 0.25
ASK_TIMEOUT_S = 10.0
SHUTTING_DOWN = "the server is shutting down and admits no new requests"


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


@attrs.define(eq=False)
class Call:
    """A request in flight at the front: what its answer needs, and its events from the engine."""

    rid: str
    choices: int
    max_tokens: int
    stops: list[str]
    stream: bool
    prompt_tokens: int
    gen_length: int
    preset: str
    events: asyncio.Queue
    front: Front
    sent: dict[int, str] = attrs.field(factory=dict)  # choice index -> text already streamed
    early: list[tuple] = attrs.field(factory=list)  # events that came before ("accepted", rid)

    async def next(self, timeout: float) -> tuple | None:
        """The next event as the routes read it, ``("delta", index, text)``, ``("choice", index,
        result)`` or ``("error", APIError)``; None after ``timeout`` s or for a delta with no new text."""
        message = self.early.pop(0) if self.early else await asyncio.wait_for(self.events.get(), timeout)
        return self.front.read(self, message)


class Front:
    """The HTTP side of the server: requests into submissions, the engine's events into bodies."""

    def __init__(self, settings: FrontSettings, conn: Connection) -> None:
        self.settings, self.conn = settings, conn
        self.model_name, self.max_n, self.max_body = settings.model_name, settings.max_n, settings.max_body
        # One tokenizer: completions encode raw text (``task.chat=false``), chat requests go through
        # ``encode_messages`` (the chat template, as ``task.chat=true`` encodes one user message)
        self.task: TextTask = prompt_list(OmegaConf.create(settings.task), chat=False)
        self.draining = False  # the engine said so (or this process got a signal): new requests get 503
        self.gone = False  # the engine's pipe closed
        self.on_stop: Callable[[], None] = lambda: None  # the engine says to exit (the process's server sets it)
        self.lock = threading.Lock()
        self.waiting: dict[str, Callable[[tuple], None]] = {}  # request or question id -> its queue's put
        self.reader = threading.Thread(target=self._read, name="dlmsearch-engine-in", daemon=True)

    # ------------------------------------------------------------------ the pipe

    def start(self) -> None:
        """Read the engine's messages; tell it this front serves."""
        self.reader.start()
        self.send(("ready",))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()

    def send(self, message: tuple) -> None:
        try:
            with self.lock:
                self.conn.send(message)
        except (OSError, ValueError):
            raise APIError(503, "the engine process is gone", code="server_shutdown") from None

    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if message[0] == "drain":
                    self.draining = True
                elif message[0] == "stop":
                    self.on_stop()
                else:
                    with self.lock:
                        put = self.waiting.get(message[1])
                    if put is not None:
                        put(message)
        except (EOFError, OSError):
            pass
        self.gone = self.draining = True
        error = APIError(503, "the engine process stopped before this request finished", code="server_shutdown")
        with self.lock:
            waiting = list(self.waiting.items())
        for rid, put in waiting:
            put(error_message(rid, error))
        self.on_stop()

    def _listen(self, rid: str) -> asyncio.Queue:
        """The queue that ``rid``'s messages go into (put from the reader thread)."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        with self.lock:
            self.waiting[rid] = lambda message: loop.call_soon_threadsafe(events.put_nowait, message)
        return events

    def forget(self, rid: str) -> None:
        with self.lock:
            self.waiting.pop(rid, None)

    def cancel(self, rid: str) -> None:
        """The client went away: the engine frees the request's slots."""
        self.forget(rid)
        with contextlib.suppress(APIError):
            self.send(("cancel", rid))

    async def ask(self, what: str) -> Any:
        """The engine's answer to ``"health"`` or ``"metrics"``."""
        qid = f"ask-{uuid.uuid4().hex}"
        answers = self._listen(qid)
        try:
            self.send(("ask", qid, what))
            message = await asyncio.wait_for(answers.get(), ASK_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise APIError(
                503, f"the engine did not answer {what!r} in {ASK_TIMEOUT_S:g} s", code="engine_busy"
            ) from None
        finally:
            self.forget(qid)
        if message[0] == "error":
            raise APIError(*message[2:])
        return message[2]

    # ------------------------------------------------------------------ requests into submissions

    def check_open(self) -> None:
        """A draining server admits nothing: a 503 (the engine checks again at submission)."""
        if self.draining:
            raise APIError(503, SHUTTING_DOWN, code="shutting_down")

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

    def submission(self, body: Sampled) -> tuple[Submission, int]:
        """Check a request against what the front knows and tokenise it; also its prompt tokens."""
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
        max_tokens = body.max_tokens or self.settings.default_tokens
        block = self.settings.block_length
        submission = Submission(
            prompts=[p.tolist() for p in prompts],
            n=body.n,
            seed=self.settings.seed if body.seed is None else int(body.seed),
            gen_length=-(-max_tokens // block) * block,
            max_tokens=max_tokens,
            stream=body.stream,
            preset=body.preset,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            options=dict(body.decoder),
            deadline_s=body.deadline_s,
        )
        return submission, sum(len(p) for p in prompts)

    async def submit(self, body: Sampled, chat: bool) -> Call:
        """Hand a request to the engine; its answer (queued, or the error) decides the response."""
        submission, prompt_tokens = self.submission(body)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        call = Call(
            rid=rid,
            choices=len(submission.prompts) * submission.n,
            max_tokens=submission.max_tokens,
            stops=list(body.stop or []),
            stream=body.stream,
            prompt_tokens=prompt_tokens,
            gen_length=submission.gen_length,
            preset=body.preset or self.settings.preset,
            events=self._listen(rid),
            front=self,
        )
        try:
            self.send(("submit", rid, submission))
            first = await call.events.get()
        except BaseException:
            self.cancel(rid)
            raise
        if first[0] == "error":
            self.forget(rid)
            raise APIError(*first[2:])
        if first[0] != "accepted":  # a delta overtook the acceptance: the job is queued
            call.early.append(first)
        return call

    # ------------------------------------------------------------------ the engine's events into bodies

    def _text(self, call: Call, ids: list[int], final: bool) -> tuple[str, str, int]:
        """The choice's text so far, why it ended (final only) and its completion tokens."""
        tokens = torch.tensor(ids, dtype=torch.long)
        generated = self.task.generated_ids(tokens)
        ended = len(generated) < len(tokens)
        if len(generated) > call.max_tokens:
            generated, ended = generated[: call.max_tokens], False
        text, stopped = _cut_at_stops(self.task.decode(torch.tensor(generated, dtype=torch.long)), call.stops, final)
        if not final and text.endswith("\ufffd"):  # a character whose bytes are not all committed yet
            text = text.rstrip("\ufffd")
        return text, "stop" if ended or stopped else "length", len(generated)

    def read(self, call: Call, message: tuple) -> tuple | None:
        """An engine's message for ``call`` as the routes read it (see :meth:`Call.next`)."""
        kind = message[0]
        if kind == "error":
            return ("error", APIError(*message[2:]))
        if kind == "delta":
            index, sent = message[2], call.sent.get(message[2], "")
            text, _, _ = self._text(call, message[3], final=False)
            if len(text) > len(sent) and text.startswith(sent):
                call.sent[index] = text
                return ("delta", index, text[len(sent) :])
            return None
        if kind == "choice":
            result = message[3]
            text, reason, count = self._text(call, result["ids"], final=True)
            counters = {name: result[name] for name in (*COUNTERS, "deadline_hit")}
            return (
                "choice",
                result["index"],
                {
                    "index": result["index"],
                    "text": text,
                    "unsent": text.removeprefix(call.sent.get(result["index"], "")),
                    "finish_reason": reason,
                    "completion_tokens": count,
                    "fallback": result.get("fallback"),
                    **counters,
                },
            )
        return None  # a late ("accepted", rid)

    def totals(self, call: Call, done: list[dict[str, Any]]) -> dict[str, Any]:
        """The response's usage: OpenAI's token counts, then the decode's counters summed over the choices."""
        counters = {name: sum(c[name] for c in done) for name in COUNTERS}
        counters |= {
            "deadline_hit": any(c["deadline_hit"] for c in done),
            "gen_length": call.gen_length,
            "preset": call.preset,
        }
        fallback = next((c["fallback"] for c in done if c.get("fallback")), None)
        if fallback:  # a choice failed alone and was decoded by the server's fallback preset
            counters["fallback"] = fallback
        return usage(call.prompt_tokens, sum(c["completion_tokens"] for c in done), counters)


class Server(Front):
    """An engine and one front in this process, joined by a pipe as the processes of ``python -m
    dlmsearch.serve`` are: the routes over a model in one interpreter (tests, embedding)."""

    def __init__(self, cfg: DictConfig, overrides: list[str], model_name: str) -> None:
        self.engine = Engine(cfg, overrides, model_name)
        mine, theirs = multiprocessing.Pipe()
        self.engine.attach(theirs)
        super().__init__(self.engine.settings, mine)

    def start(self) -> None:
        self.engine.scheduler.start()
        super().start()

    def close(self) -> None:
        self.engine.scheduler.stop()
        super().close()


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The front reads the engine's pipe exactly as long as the app runs."""
    front: Front = app.state.front
    front.start()
    yield
    front.close()


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
    """The routes over one front: the two completion endpoints and the three reports."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def read_body(self, request: Request) -> bytes:
        """The body, refused with a 413 as soon as it is known to be above ``serve.max_body_bytes``."""
        front = self.front
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > front.max_body:
            raise APIError(
                413,
                f"the request body is {declared} bytes, above this server's limit of {front.max_body} (serve.max_body_bytes)",
                code="body_too_large",
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > front.max_body:
                raise APIError(
                    413,
                    f"the request body is above this server's limit of {front.max_body} bytes (serve.max_body_bytes)",
                    code="body_too_large",
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def complete(self, request: Request, kind: type[Sampled], chat: bool) -> Response:
        """Hand the request to the engine, then answer with a stream or, once every choice is done, the whole body."""
        front = self.front
        front.check_open()
        body = parse(await self.read_body(request), kind)
        call = await front.submit(body, chat)
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage", False))
            return StreamingResponse(_sse(front, call, chat, include_usage, request), media_type="text/event-stream")
        done = await self.wait_for_choices(call, request)
        if done is None:
            return Response(status_code=499)
        done.sort(key=lambda c: c["index"])
        return JSONResponse(completion_body(call.rid, front.model_name, chat, done, front.totals(call, done)))

    async def wait_for_choices(self, call: Call, request: Request) -> list[dict[str, Any]] | None:
        """Every choice's result, or None once the client has gone (the engine frees its slots then)."""
        front = self.front
        done: list[dict[str, Any]] = []
        try:
            while len(done) < call.choices:
                try:
                    event = await call.next(DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        front.cancel(call.rid)
                        return None
                    continue
                if event is None:
                    continue
                if event[0] == "error":
                    raise event[1]
                if event[0] == "choice":
                    done.append(event[2])
        except asyncio.CancelledError:
            front.cancel(call.rid)
            raise
        finally:
            front.forget(call.rid)
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
                {"id": self.front.model_name, "object": "model", "created": int(time.time()), "owned_by": "dlmsearch"}
            ],
        }

    async def health(self) -> JSONResponse:
        """``GET /health``: the engine's queue and running counts, 503 while draining so a balancer stops sending."""
        try:
            state = await self.front.ask("health")
        except APIError:
            return JSONResponse({"status": "draining"}, status_code=503)
        draining = bool(state.pop("draining")) or self.front.draining
        return JSONResponse({"status": "draining" if draining else "ok", **state}, status_code=503 if draining else 200)

    async def metrics(self) -> Response:
        """``GET /metrics``: Prometheus' text format, as the engine counts."""
        return Response(await self.front.ask("metrics"), media_type="text/plain; version=0.0.4; charset=utf-8")


def create_app(front: Front) -> FastAPI:
    """The FastAPI application over ``front`` (it reads the engine's pipe while the app runs)."""
    app = FastAPI(title="dlmsearch", docs_url=None, redoc_url=None, openapi_url=None, lifespan=_lifespan)
    app.state.front = front
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    endpoints = _Endpoints(front)
    app.post("/v1/completions")(endpoints.completions)
    app.post("/v1/chat/completions")(endpoints.chat_completions)
    app.get("/v1/models")(endpoints.models)
    app.get("/health")(endpoints.health)
    app.get("/metrics")(endpoints.metrics)
    return app


async def _sse(front: Front, call: Call, chat: bool, include_usage: bool, request: Request) -> AsyncIterator[str]:
    """Each choice's settled text as it comes, its finish chunk, the usage chunk if asked, then ``[DONE]``.
    Between events it asks whether the client is still there (a send to a closed connection
    alone would notice only at the next block), and has the engine free the request's slots when it is not.

    Args:
        front: the front that submitted the call and whose model names the chunks.
        call: the submitted request; its choices say how many finish chunks to wait for.
        chat: chat chunks (a role chunk first, ``delta`` bodies) rather than completion chunks.
        include_usage: send the usage chunk (``stream_options.include_usage``) before ``[DONE]``.
        request: the client's request, polled for a disconnect between events.
    """
    model, rid = front.model_name, call.rid
    line = lambda data: f"data: {json.dumps(data)}\n\n"
    done: list[dict[str, Any]] = []
    try:
        if chat:
            for index in range(call.choices):
                yield line(chunk_body(rid, model, chat, index, "", None, role=True))
        while len(done) < call.choices:
            try:
                event = await call.next(DISCONNECT_POLL_S)
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
                yield line(chunk_body(rid, model, chat, event[1], event[2], None))
            elif event[0] == "choice":
                result = event[2]
                done.append(result)
                if result["unsent"]:
                    yield line(chunk_body(rid, model, chat, result["index"], result["unsent"], None))
                yield line(chunk_body(rid, model, chat, result["index"], None if chat else "", result["finish_reason"]))
        else:
            if include_usage:
                body = chunk_body(
                    rid, model, chat, 0, None, None, front.totals(call, sorted(done, key=lambda c: c["index"]))
                )
                body["choices"] = []
                yield line(body)
        yield "data: [DONE]\n\n"
    finally:
        if len(done) < call.choices:
            front.cancel(call.rid)
        front.forget(call.rid)


def run_front(settings: FrontSettings, conn: Connection, sock: socket.socket, index: int) -> None:
    """A front process (``python -m dlmsearch.serve`` starts ``serve.workers`` of them): uvicorn on
    the shared listening socket, over the engine's pipe, until the engine says stop or goes away.

    A signal to this process only stops its admissions: the engine process decides when the
    front exits (after the requests it still answers for got their answers).
    """
    import uvicorn

    front = Front(settings, conn)

    class FrontServer(uvicorn.Server):
        """uvicorn's server that exits when the engine says so, not on the first signal."""

        signals = 0

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.signals += 1
            if front.gone:  # nobody left to wait for
                self.should_exit = True
            elif self.signals > 1:  # a second signal: exit now
                self.should_exit = self.force_exit = True
            front.draining = True

    config = uvicorn.Config(create_app(front), log_level="warning", timeout_graceful_shutdown=5, lifespan="on")
    server = FrontServer(config)
    front.on_stop = lambda: setattr(server, "should_exit", True)
    server.run(sockets=[sock])
