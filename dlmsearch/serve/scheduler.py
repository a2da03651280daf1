"""The decode loop that owns the model: the one continuous batcher, fed by HTTP requests.

One thread runs it. Between steps it evicts the samples whose clients went away, admits
waiting requests (first come, first served) through the batcher the CLI uses too
(:class:`~dlmsearch.search.batcher.Batcher`): while the running samples and rows stay within
``max_batch`` and ``max_rows`` and a request's canvas would carry little padding (a request
that alone exceeds them is admitted when nothing else runs), then gives every lane's
:class:`~dlmsearch.search.session.DecodeSession` one step and hands each finished sample's
result to its request. A request never waits for a batch to
finish, and because each sample decodes exactly as it would alone (the session's guarantee),
what it returns does not depend on what else is served.

Slots that the last step freed are worth refilling before the next step: a client that got its
answer usually sends its next request within milliseconds, and a step taken without it runs a
row short. So when samples finished and nobody waits, the loop waits up to ``batch_wait_s`` for
as many arrivals as slots were freed (Triton's dynamic-batching queue delay; 0 steps at once).
It bounds the latency this adds to every running request by ``batch_wait_s`` per such step.

A step that fails (out of memory even after the engine's own row splitting, NaN logits, a
sample past the rounds' bound, a bug) fails nobody at once: a session of several samples is
dissolved and its requests start again each in a session of its own, with only their unanswered
choices (decoding is deterministic, so they return what they would have; only time is lost); a
request that fails alone decodes again with the server's ``fallback`` preset where it has one,
and otherwise gets the error; nothing else is touched.

Shutting down has two stages: :meth:`Scheduler.drain` stops admissions (what is queued or
running goes on), and :meth:`Scheduler.expire`, when the grace is over, ends the loop and hands
every request still queued or running one error, so that its client gets an answer, not a cut
connection.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch

from dlmsearch.search.batcher import Admission, Batcher, Failures, SessionKey
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.session import DecodeSession
from dlmsearch.serve.lanes import Lane, LaneKey
from dlmsearch.serve.metrics import ServerMetrics
from dlmsearch.serve.protocol import APIError

IDLE_WAIT_S = 0.05  # how long the loop sleeps when nothing runs (a submission wakes it at once)


@attrs.define(eq=False)
class Choice:
    """One sample of a request: its uid in the sessions, its index among the response's choices."""

    uid: int
    index: int
    request: DecodeRequest
    sent: str = ""  # text already streamed
    answered: bool = False  # its result was posted: a recovery never decodes it again


@attrs.define(eq=False)
class Job:
    """A request in flight. ``post`` (set by the HTTP side) receives its events from the loop's
    thread: ``("delta", index, text)``, ``("choice", index, result)``, ``("error", APIError)``."""

    lane: Lane
    choices: list[Choice]
    post: Callable[[tuple], None]
    max_tokens: int
    stops: list[str]
    stream: bool
    prompt_tokens: int = 0
    arrived: float = attrs.field(factory=time.monotonic)
    admitted: float | None = None
    cancelled: bool = False
    solo: bool = False  # decodes in a session of its own (after its shared session failed)
    finished: int = 0
    request_id: str = ""  # the response's id (cmpl-..., chatcmpl-...), for the log
    fallback: Lane | None = None  # the lane of the server's ``fallback`` preset at this request's settings
    failure: Exception | None = None  # the error that sent it to the fallback lane
    session: SessionKey | None = None  # where the batcher placed it last

    @property
    def lane_key(self) -> LaneKey:
        """The lane whose session it joins (the host's, where only sampling and thresholds differ)."""
        return self.lane.host.key

    @property
    def samples(self) -> int:
        return len(self.pending)

    @property
    def fell_back(self) -> str | None:
        """The fallback preset it decodes with now (None: its own)."""
        return self.lane.key.preset if self.failure is not None else None

    def requests(self) -> list[DecodeRequest]:
        """Its unanswered choices' requests, each sampling and committing as its lane says."""
        own = {"sampling": self.lane.own_sampling, "options": self.lane.own_options}
        return [attrs.evolve(c.request, **own) for c in self.pending]

    def choice(self, uid: int) -> Choice:
        return next(c for c in self.choices if c.uid == uid)

    @property
    def pending(self) -> list[Choice]:
        """The choices not yet answered: what decodes (again, after a failed shared step)."""
        return [c for c in self.choices if not c.answered]

    @property
    def rows(self) -> int:
        return len(self.pending) * self.lane.rows_per_sample


class Scheduler:
    """The queue, the sessions and the thread that steps them."""

    def __init__(
        self,
        metrics: ServerMetrics,
        max_batch: int,
        max_rows: int,
        max_queue: int,
        on_result: Callable[[Job, Choice, DecodeResult], dict[str, Any]],
        on_progress: Callable[[Job, Choice, torch.Tensor, int], None],
        batch_wait_s: float = 0.0,
    ) -> None:
        """A scheduler not yet started (:meth:`start` runs its thread).

        Args:
            metrics: the server's counters, told of every step.
            max_batch: the most samples decoding at once.
            max_rows: the most rows (samples times their rows each) decoding at once.
            max_queue: the most requests waiting; one more is a 429.
            on_result: turns a finished choice's result into the body posted to its request.
            on_progress: sees a streaming choice's output columns ``[n]`` and how many of them
                are settled, after every step.
            batch_wait_s: how long a step may wait for arrivals to refill the slots the last
                step freed (0: none).
        """
        self.metrics = metrics
        self.max_batch, self.max_rows, self.max_queue = max_batch, max_rows, max_queue
        self.batch_wait_s = batch_wait_s
        self.freed = 0  # samples the last steps finished, not yet refilled
        self.on_result, self.on_progress = on_result, on_progress
        self.uids = itertools.count()
        self.cond = threading.Condition()
        failures = Failures(give_up=self._give_up, fallback=self._fall_back, refusal_is_final=True)
        self.batcher: Batcher[Job] = Batcher(
            Admission(batch_size=max_batch, max_rows=max_rows), failures, open=self._open, lock=self.cond
        )
        self.draining = False
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="dlmsearch-decode", daemon=True)

    # ------------------------------------------------------------------ the HTTP side

    def start(self) -> None:
        self.thread.start()

    def check_open(self) -> None:
        """A draining or stopped server admits nothing: a 503 (checked before a request's work and again at submission)."""
        if self.draining or self.stopped:
            raise APIError(503, "the server is shutting down and admits no new requests", code="shutting_down")

    def submit(self, job: Job) -> None:
        """Queue a request; a full queue is a 429, a draining server a 503."""
        with self.cond:
            self.check_open()
            if len(self.waiting) >= self.max_queue:
                raise APIError(
                    429, f"the queue is full ({self.max_queue} requests waiting); retry later", code="queue_full"
                )
            self.waiting.append(job)
            self.metrics.queue_depth.set(len(self.waiting))
            self.cond.notify()

    @property
    def waiting(self) -> collections.deque[Job]:
        """The requests queued, oldest first (the batcher's queue)."""
        return self.batcher.waiting

    @waiting.setter
    def waiting(self, jobs: collections.deque[Job]) -> None:
        self.batcher.waiting = jobs

    @property
    def running(self) -> list[Job]:
        """The requests admitted and not yet answered."""
        return self.batcher.running

    @running.setter
    def running(self, jobs: list[Job]) -> None:
        self.batcher.running = jobs

    @property
    def sessions(self) -> dict[SessionKey, DecodeSession]:
        return self.batcher.sessions

    def new_uid(self) -> int:
        return next(self.uids)

    def cancel(self, job: Job) -> None:
        """The client went away: its samples leave at the next step."""
        with self.cond:
            job.cancelled = True
            self.cond.notify()

    @property
    def idle(self) -> bool:
        with self.cond:
            return not self.waiting and not self.running

    def drain(self) -> None:
        """Stop admitting (new requests get 503); what is queued or running goes on. A batching
        window in progress ends: nobody can arrive to fill it."""
        with self.cond:
            self.draining = True
            self.cond.notify()

    def expire(self, error: APIError) -> list[Job]:
        """The grace is over: end the loop and answer every request still queued or running with
        ``error`` (at once, not after the step in progress). Returns them, oldest first, for the log."""
        with self.cond:
            self.stopped = True
            jobs = [*self.running, *self.waiting]
            self.waiting.clear()
            self.running.clear()
            self.metrics.queue_depth.set(0)
            self.cond.notify()
        for job in jobs:
            self.metrics.requests.labels(outcome="error").inc()
            job.post(("error", error))
        return jobs

    def stop(self, timeout: float = 5.0) -> None:
        """End the loop; requests still waiting or running (none after :meth:`expire`) get a 503."""
        self.expire(APIError(503, "the server stopped before this request finished", code="server_shutdown"))
        if self.thread.is_alive():
            self.thread.join(timeout)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while True:
            with self.cond:
                if self.stopped:
                    return
                self._await_refill()
                admitted = self._admissions()
                if not admitted and not self.sessions:
                    self.cond.wait(IDLE_WAIT_S)
                    continue
            for job in admitted:
                self._admit(job)
            for key in list(self.sessions):
                self._step(key)
            self._gauges()

    def _await_refill(self) -> None:
        """Wait up to ``batch_wait_s`` for as many arrivals as the last step freed slots (called holding the lock)."""
        running = sum(len(j.choices) for j in self.running)
        wanted = min(self.freed, self.max_batch - running) if running else 0
        self.freed = 0
        deadline = time.monotonic() + self.batch_wait_s
        while wanted > 0 and len(self.waiting) < wanted and not self.stopped and not self.draining:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.cond.wait(left)

    def _admissions(self) -> list[Job]:
        """Evict cancelled samples, then take waiting requests while they fit (called holding the lock)."""
        for job in [j for j in self.running if j.cancelled]:
            self.batcher.evict(job)
        self.waiting = collections.deque(j for j in self.waiting if not j.cancelled)
        taken = self.batcher.take()
        for job in taken:
            job.admitted = time.monotonic()
            self.metrics.queue_wait.observe(job.admitted - job.arrived)
        self.metrics.queue_depth.set(len(self.waiting))
        self._gauges()  # also when nothing is left to step (the condition's lock is re-entrant)
        return taken

    def _admit(self, job: Job) -> None:
        """Join a request's unanswered choices to its lane's session (a refusal is its 400)."""
        self.batcher.admit(job)

    def _open(self, job: Job) -> DecodeSession:
        """The session of a request's host lane, where only sampling and the commit threshold differ
        (each sample then carries its own temperature, top-p, top-k and threshold: one forward for all)."""
        host = job.lane.host
        return DecodeSession(host.decoder, host.engine, host.plan, host.verifier, host.deadline_s)

    def _give_up(self, job: Job, error: Exception, refused: bool) -> None:
        """A request refused (a 400: what only the request shows, checked on arrival; this is a last
        guard) or failed alone, by the fallback too where there is one (a 500 naming both)."""
        if refused:
            failed = APIError(400, f"{type(error).__name__}: {error}", code="decode_refused")
        else:
            cause = f"{type(error).__name__}: {error}"
            if job.failure is not None:
                cause = f"{type(job.failure).__name__}: {job.failure}; fallback {job.fell_back}: {cause}"
            failed = APIError(500, f"decoding failed: {cause}", code="decode_failed")
        self.metrics.requests.labels(outcome="error").inc()
        job.post(("error", failed))

    @staticmethod
    def _fall_back(job: Job, error: Exception) -> bool:
        """A request that failed alone decodes its unanswered choices again with the fallback preset, once."""
        if job.fallback is None or job.failure is not None:
            return False
        job.lane, job.failure = job.fallback, error
        return True

    def _step(self, key: SessionKey) -> None:
        session = self.sessions[key]
        if session.state is None:
            self.batcher.step(key)  # drops the empty session
            return
        before, held = session.state.usage, session.rows
        tick = time.perf_counter()
        results = self.batcher.step(key)
        if results is None:  # failed: the batcher's policy requeued or answered its requests
            return
        after = session.state.usage if session.state is not None else None
        rows = (
            sum(r.row_forwards for r in results)
            + (int(after.row_forwards.sum()) if after is not None else 0)
            - int(before.row_forwards.sum())
        )
        tokens = (
            sum(r.token_forwards for r in results)
            + (int(after.token_forwards.sum()) if after is not None else 0)
            - int(before.token_forwards.sum())
        )
        self.metrics.stepped(time.perf_counter() - tick, held, rows, tokens)
        for result in results:
            self._finished(result)
        self._stream(session)

    def _stream(self, session: DecodeSession) -> None:
        """Each streaming choice's settled columns after a step (where a committed block is final)."""
        owner = self.batcher.owner
        jobs = {owner[uid] for uid in session.uids}
        if any(job.stream and job.lane.host.streams_blocks for job in jobs):
            for uid, (tokens, settled) in session.settled().items():
                job = owner[uid]
                if job.stream:
                    self.on_progress(job, job.choice(uid), tokens, settled)

    def _finished(self, result: DecodeResult) -> None:
        job = self.batcher.owner.pop(result.uid)
        choice = job.choice(result.uid)
        choice.answered = True
        self.freed += 1
        job.post(("choice", choice.index, self.on_result(job, choice, result)))
        job.finished += 1
        if job.finished == len(job.choices):
            with self.cond:
                answered = job in self.running  # not if it expired during this step: it got its error
                if answered:
                    self.running.remove(job)
            if answered:
                self.metrics.requests.labels(outcome="ok").inc()
                self.metrics.latency.observe(time.monotonic() - job.arrived)

    def _gauges(self) -> None:
        with self.cond:
            self.metrics.running_samples.set(sum(len(j.pending) for j in self.running))
            self.metrics.running_rows.set(sum(s.rows for s in self.sessions.values()))
            self.metrics.lanes.set(len(self.sessions))

    def snapshot(self) -> dict[str, int]:
        """Queue and running counts (``/health``)."""
        with self.cond:
            return {
                "waiting": len(self.waiting),
                "running": sum(len(j.pending) for j in self.running),
                "sessions": len(self.sessions),
            }
