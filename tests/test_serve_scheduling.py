"""The decode loop's batching window, its shutdown and the server's limits, without a model or a socket.

The window (``serve.batch_wait_ms``) waits, after a step that freed slots, for as many new
requests as slots were freed, and never longer than the window; with nothing running it never
waits (a lone client pays nothing), nor while the server drains (nobody can arrive). When the
grace is over, every request still queued or running gets the one error, once. The limits fail
before a model loads, one line naming the key.
"""

from __future__ import annotations

import collections
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("prometheus_client")

from omegaconf import OmegaConf

from dlmsearch.serve.app import check_limits
from dlmsearch.serve.metrics import ServerMetrics
from dlmsearch.serve.protocol import APIError
from dlmsearch.serve.scheduler import Scheduler

LIMITS = {
    "max_batch": 4,
    "max_rows": None,
    "max_queue": 8,
    "max_n": 2,
    "max_body_bytes": 1024,
    "max_lanes": 2,
    "batch_wait_ms": 0,
    "grace_s": 1,
}
FOREVER_S = 3600.0  # a window no test may sit out: returning at all shows the wait was skipped or cut short


def scheduler(window_s: float, running: int, freed: int) -> Scheduler:
    s = Scheduler(
        ServerMetrics(),
        max_batch=4,
        max_rows=64,
        max_queue=8,
        on_result=lambda *a: {},
        on_progress=lambda *a: None,
        batch_wait_s=window_s,
    )
    s.running = [SimpleNamespace(choices=[object()]) for _ in range(running)]
    s.freed = freed
    return s


def refill(s: Scheduler) -> None:
    with s.cond:
        s._await_refill()


def test_nothing_running_never_waits() -> None:
    s = scheduler(FOREVER_S, running=0, freed=3)
    refill(s)
    assert s.freed == 0


def test_no_freed_slot_never_waits() -> None:
    refill(scheduler(FOREVER_S, running=2, freed=0))


def test_the_wait_ends_when_the_freed_slots_are_claimed() -> None:
    s = scheduler(FOREVER_S, running=2, freed=2)

    def arrive() -> None:
        for _ in range(2):
            with s.cond:
                s.waiting.append(object())
                s.cond.notify()

    threading.Timer(0.05, arrive).start()
    refill(s)
    assert len(s.waiting) == 2


def test_the_wait_is_bounded_by_the_window() -> None:
    s = scheduler(0.02, running=1, freed=1)
    tick = time.monotonic()
    refill(s)
    assert time.monotonic() - tick >= 0.02 and not s.waiting


def test_a_stop_ends_the_wait() -> None:
    s = scheduler(FOREVER_S, running=1, freed=1)

    def stop() -> None:  # what Scheduler.stop does to the loop (its thread is not started here)
        with s.cond:
            s.stopped = True
            s.cond.notify()

    threading.Timer(0.05, stop).start()
    refill(s)
    assert s.stopped


def test_a_drain_ends_the_wait() -> None:
    """Nobody can arrive while the server drains: waiting for them would only spend the grace."""
    s = scheduler(FOREVER_S, running=1, freed=1)
    threading.Timer(0.05, s.drain).start()
    waiter = threading.Thread(target=refill, args=(s,), daemon=True)
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive() and s.draining


def test_expiry_answers_every_unfinished_request_once() -> None:
    s = scheduler(0.0, running=0, freed=0)
    posted: list[tuple[int, tuple]] = []
    jobs = [SimpleNamespace(choices=[object()], post=lambda event, i=i: posted.append((i, event))) for i in range(3)]
    s.running, s.waiting = jobs[:2], collections.deque(jobs[2:])
    error = APIError(503, "the grace is over", code="server_shutdown")
    assert s.expire(error) == jobs
    assert posted == [(i, ("error", error)) for i in range(3)]
    assert s.stopped and not s.running and not s.waiting
    assert s.expire(error) == [] and len(posted) == 3
    with pytest.raises(APIError, match="shutting down"):
        s.check_open()


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("max_batch", 0, r"within \[1, inf\], got 0"),
        ("max_queue", -1, r"within \[1, inf\], got -1"),
        ("batch_wait_ms", -5, r"within \[0, inf\], got -5"),
        ("max_n", "two", r"an integer, got 'two'"),
        ("grace_s", True, r"a number, got True"),
    ],
)
def test_a_limit_out_of_range_names_its_key(key: str, value: object, expected: str) -> None:
    with pytest.raises(ValueError, match=rf"^serve\.{key} must be {expected}"):
        check_limits(OmegaConf.create({**LIMITS, key: value}))


def test_max_rows_is_an_integer_or_null() -> None:
    check_limits(OmegaConf.create(LIMITS))
    with pytest.raises(ValueError, match=r"^serve\.max_rows must be within \[1, inf\], got 0"):
        check_limits(OmegaConf.create({**LIMITS, "max_rows": 0}))
