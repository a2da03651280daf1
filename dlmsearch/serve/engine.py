"""The engine: the model, its lanes and the decode loop, fed by the HTTP fronts over pipes.

The engine process (``python -m dlmsearch.serve`` itself) owns the model and nothing that
speaks HTTP. Each front process (``serve.workers`` of them, see :mod:`dlmsearch.serve.app`)
holds one end of a :func:`multiprocessing.Pipe`; the engine holds the other, with one thread
that reads it and one that writes it, so that neither a slow front nor pickling ever holds up a
step. What crosses a pipe is small and made of builtins only (no tensors):

front to engine
    ``("submit", rid, Submission)``: a checked, tokenised request (prompt ids, the lane's
    fields, seed, n, lengths, stream); ``("cancel", rid)``: its client went away;
    ``("ask", qid, "health" | "metrics")``; ``("ready",)``: the front listens.
engine to front
    ``("accepted", rid)`` or ``("error", rid, status, message, param, code)`` for a submission;
    then ``("delta", rid, index, ids)`` (a streaming choice's settled tokens so far, whole blocks),
    ``("choice", rid, index, result)`` (the choice's tokens and decode counters) or one
    ``("error", ...)``; ``("answer", qid, value)``; ``("drain",)`` and ``("stop",)`` for a shutdown.

Tokens leave the engine as ids; the front turns them into text (stop strings, ``max_tokens``,
a character whose bytes are not all settled), so detokenising never shares the decode loop's
interpreter. The engine counts what ``/metrics`` shows; a front asks for the rendered page.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import attrs
import torch
from omegaconf import DictConfig, OmegaConf

from dlmsearch.api import prompt_list
from dlmsearch.config import build, decoder_presets
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.serve.lanes import Lane, LaneKey, Lanes
from dlmsearch.serve.metrics import ServerMetrics
from dlmsearch.serve.protocol import APIError
from dlmsearch.serve.scheduler import Choice, Job, Scheduler
from dlmsearch.tasks.text import TextTask
from dlmsearch.validation import number

COUNTERS = ("steps", "decoder_forwards", "row_forwards", "token_forwards", "tokens_committed", "length")


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
    workers: int = number(int, 1, default=1)  # front processes serving the one port


def check_limits(serve: DictConfig) -> ServeLimits:
    """``serve``'s limits, or one line naming the key that is out of range (``serve.KEY must be ...``)."""
    fields = [f for f in attrs.fields(ServeLimits) if f.name in serve or f.default is attrs.NOTHING]
    try:
        return ServeLimits(**{field.name: serve.get(field.name) for field in fields})
    except (TypeError, ValueError) as error:
        raise ValueError(f"serve.{error}") from None


@attrs.frozen(kw_only=True)
class FrontSettings:
    """What a front needs to check, tokenise and answer requests without the model (picklable)."""

    task: dict[str, Any]  # the composed ``task`` (resolved): the front builds the same tokenizer from it
    model_name: str
    preset: str  # the server's own decoder preset (``usage.preset`` when a request names none)
    block_length: int
    default_tokens: int
    seed: int
    max_n: int
    max_body: int
    grace_s: float


@attrs.frozen(kw_only=True)
class Submission:
    """A request as the front hands it over: tokenised, its lane's fields, its choices' seeds."""

    prompts: list[list[int]]
    n: int
    seed: int
    gen_length: int
    max_tokens: int
    stream: bool
    preset: str | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    options: dict[str, Any]
    deadline_s: float | None


def refuse_grid_model(cfg: DictConfig, model_name: str) -> None:
    """The server answers text (OpenAI's API, through the model's tokenizer): a Sudoku denoiser, which
    reads 81 cells and has no tokenizer, is refused before it loads, with the commands that decode it."""
    if str(cfg.model.get("_target_", "")).endswith("load_denoiser"):
        raise ValueError(
            f"model={model_name} is a Sudoku denoiser (81 cells, no tokenizer), and the server answers text through "
            "a model's tokenizer: decode puzzles with python -m dlmsearch model=sudoku task=sudoku +decoder=adalook "
            "task.path=FILE (one 81-character puzzle a line, 0 or . for a blank), or in Python with "
            'Decoder.from_preset("adalook").generate(Model.load("sudoku"), [puzzle]) (dlmsearch/data/sudoku_model/README.md)'
        )


def error_message(rid: str, error: APIError) -> tuple:
    return ("error", rid, error.status, error.message, error.param, error.code)


class Link:
    """The engine's end of one front's pipe: a reader thread and a writer thread (its outbox)."""

    def __init__(self, engine: Engine, conn: Connection, index: int) -> None:
        self.engine, self.conn, self.index = engine, conn, index
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.ready = threading.Event()
        self.closed = threading.Event()
        self.reader = threading.Thread(target=self._read, name=f"dlmsearch-front-{index}-in", daemon=True)
        self.writer = threading.Thread(target=self._write, name=f"dlmsearch-front-{index}-out", daemon=True)

    def start(self) -> None:
        self.reader.start()
        self.writer.start()

    def send(self, message: tuple) -> None:
        """Queue a message for the front (never blocks: the writer thread sends it)."""
        self.outbox.put(message)

    def _write(self) -> None:
        while (message := self.outbox.get()) is not None:
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # the front is gone: what it would have got goes nowhere
                return

    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if message[0] == "ready":
                    self.ready.set()
                else:
                    self.engine.handle(self, message)
        except (EOFError, OSError):
            pass
        finally:
            self.closed.set()
            self.engine.front_gone(self)
            self.outbox.put(None)


@attrs.define(eq=False)
class Pending:
    """A submitted request the engine still answers for: its job, the front it came from, what streamed."""

    job: Job
    link: Link
    streamed: dict[int, int] = attrs.field(factory=dict)  # choice index -> tokens sent as settled
    answered: int = 0


class Engine:
    """The model, the lanes built over it, the decode loop, and the fronts' requests as its jobs."""

    def __init__(self, cfg: DictConfig, overrides: list[str], model_name: str) -> None:
        serve = cfg.serve
        limits = check_limits(serve)
        self.limits = limits
        self.cfg = cfg
        refuse_grid_model(cfg, model_name)
        self.adapter = build(cfg, "model")
        self.task: TextTask = prompt_list(cfg.task, chat=False)  # reads outputs: generated ids for the counters
        self.grace_s = limits.grace_s
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
        self.lane_lock = threading.Lock()  # Hydra's composition is not thread-safe: one lane is built at a time
        default_tokens = int(cfg.task.gen_length)
        own_key = self.lanes.key(None, default_tokens, None, None, None, {}, None)
        own = self.lanes.get(own_key)  # the server's own settings (and its fallback's) are checked before it listens
        self._fallback(own_key)
        self.settings = FrontSettings(
            task=OmegaConf.to_container(cfg.task, resolve=True),  # type: ignore[arg-type]
            model_name=str(serve.model_name or model_name),
            preset=self.lanes.preset,
            block_length=int(cfg.task.block_length),
            default_tokens=default_tokens,
            seed=int(cfg.seed),
            max_n=limits.max_n,
            max_body=limits.max_body_bytes,
            grace_s=limits.grace_s,
        )
        self.metrics = ServerMetrics()
        self.scheduler = Scheduler(
            self.metrics,
            limits.max_batch,
            limits.max_rows or own.engine.max_rows,
            limits.max_queue,
            self._result,
            self._progress,
            limits.batch_wait_ms / 1000,
        )
        self.links: list[Link] = []
        self.pending: dict[str, Pending] = {}
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ the fronts

    def attach(self, conn: Connection) -> Link:
        """Serve one front over ``conn`` (its threads start at once)."""
        link = Link(self, conn, len(self.links))
        self.links.append(link)
        link.start()
        return link

    def broadcast(self, message: tuple) -> None:
        for link in self.links:
            link.send(message)

    def handle(self, link: Link, message: tuple) -> None:
        """One message from a front (on its reader thread)."""
        kind = message[0]
        if kind == "submit":
            self._submit(link, message[1], message[2])
        elif kind == "cancel":
            with self.lock:
                pending = self.pending.pop(message[1], None)
            if pending is not None:
                self.scheduler.cancel(pending.job)
        elif kind == "ask":
            link.send(("answer", message[1], self._answer(message[2])))

    def _answer(self, what: str) -> Any:
        if what == "metrics":
            return self.metrics.render()
        return {**self.scheduler.snapshot(), "draining": self.scheduler.draining or self.scheduler.stopped}

    def front_gone(self, link: Link) -> None:
        """A front's pipe closed: its requests have nobody to answer, so they leave the loop."""
        with self.lock:
            gone = [rid for rid, p in self.pending.items() if p.link is link]
            jobs = [self.pending.pop(rid).job for rid in gone]
        for job in jobs:
            self.scheduler.cancel(job)

    # ------------------------------------------------------------------ submissions into jobs

    def _submit(self, link: Link, rid: str, submission: Submission) -> None:
        try:
            job = self._job(rid, submission, link)
            with self.lock:
                self.pending[rid] = Pending(job, link)
            self.scheduler.submit(job)
        except Exception as error:  # noqa: BLE001  (a request's failure is its answer, never the engine's end)
            with self.lock:
                self.pending.pop(rid, None)
            if not isinstance(error, APIError):
                error = APIError(500, f"{type(error).__name__}: {error}", code="internal_error")
            link.send(error_message(rid, error))
            return
        link.send(("accepted", rid))

    def _job(self, rid: str, s: Submission, link: Link) -> Job:
        """Check a submission against the lanes and build its job (nothing is queued yet)."""
        self.scheduler.check_open()
        key = self.lanes.key(s.preset, s.gen_length, s.temperature, s.top_p, s.top_k, dict(s.options), s.deadline_s)
        with self.lane_lock:
            lane = self.lanes.get(key)
            fallback = self._fallback(key)
        try:
            lane.plan.check_canvas(max(len(p) for p in s.prompts), f"the prompt with max_tokens={s.max_tokens}")
        except ValueError as error:
            raise APIError(400, str(error), param="max_tokens", code="context_length_exceeded") from None
        # the lane's generation: max_tokens in whole blocks, or a length policy's initial length (max_tokens its ceiling)
        mask = torch.full((lane.plan.gen_length,), self.adapter.capabilities.open_id, dtype=torch.long)
        prompts = [torch.tensor(p, dtype=torch.long) for p in s.prompts]
        choices = [
            # Item ``p * n + i`` of an offline task holding each prompt n times, with this seed.
            Choice(
                uid,
                p * s.n + i,
                DecodeRequest(uid=uid, prompt=prompt, generation=mask.clone(), seed=s.seed, key=p * s.n + i),
            )
            for p, prompt in enumerate(prompts)
            for i in range(s.n)
            for uid in [self.scheduler.new_uid()]
        ]
        return Job(
            lane=lane,
            choices=choices,
            post=lambda event: self._post(rid, event),
            max_tokens=s.max_tokens,
            stops=[],
            stream=s.stream,
            prompt_tokens=sum(len(p) for p in prompts),
            request_id=rid,
            fallback=fallback,
        )

    def _fallback(self, key: LaneKey) -> Lane | None:
        """The lane a request of lane ``key`` decodes in after failing alone: the ``fallback`` preset
        at its length, sampling and deadline, as the CLI composes its fallback (without the request's
        decoder options); None without a ``fallback``. Built with the lanes (hold ``lane_lock``)."""
        preset = self.cfg.get("fallback")
        if not preset:
            return None
        try:
            return self.lanes.get(attrs.evolve(key, preset=str(preset), options=()))
        except APIError as error:
            raise ValueError(f"fallback={preset} cannot serve: {error.message}") from None

    # ------------------------------------------------------------------ results out (on the loop's thread)

    def _post(self, rid: str, event: tuple) -> None:
        """A job's event, to the front that submitted it (none left after a cancel)."""
        with self.lock:
            pending = self.pending.get(rid)
            if pending is None:
                return
            if event[0] == "error":
                del self.pending[rid]
            elif event[0] == "choice":
                pending.answered += 1
                if pending.answered == len(pending.job.choices):
                    del self.pending[rid]
        if event[0] == "error":
            pending.link.send(error_message(rid, event[1]))
        else:
            pending.link.send((event[0], rid, *event[1:]))

    def _result(self, job: Job, choice: Choice, result: DecodeResult) -> dict[str, Any]:
        count = min(len(self.task.generated_ids(result.tokens)), job.max_tokens)
        self.metrics.tokens.inc(count)
        counters = {name: getattr(result, name) for name in COUNTERS} | {
            "deadline_hit": result.deadline_hit,
            "fallback": job.fell_back,
        }
        return {"index": choice.index, "ids": result.tokens.reshape(-1).tolist(), **counters}

    def _progress(self, job: Job, choice: Choice, tokens: torch.Tensor, settled: int) -> None:
        block = job.lane.plan.block_length
        if settled < len(tokens):
            settled -= settled % block  # whole blocks only
        with self.lock:
            pending = self.pending.get(job.request_id)
            if pending is None or settled <= pending.streamed.get(choice.index, 0):
                return
            pending.streamed[choice.index] = settled
        job.post(("delta", choice.index, tokens[:settled].reshape(-1).tolist()))

    # ------------------------------------------------------------------ shutting down

    def drain(self) -> None:
        """Admit nothing more (the fronts answer 503 ``shutting_down`` at once); what runs goes on."""
        self.scheduler.drain()
        self.broadcast(("drain",))

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


def _cut_off_line(job: Job, now: float) -> str:
    """The log line for a request the shutdown cut off: which, how long it ran, how far it got."""
    state = "queued" if job.admitted is None else f"running {now - job.admitted:.1f} s"
    answer = (
        "its stream ended with a server_shutdown error event and [DONE]"
        if job.stream
        else "answered 503 server_shutdown"
    )
    return f"dlmsearch.serve: {job.request_id} cut off by the shutdown ({state}, {job.finished} of {len(job.choices)} choices done): {answer}"
