"""What ``GET /metrics`` exposes, in Prometheus' text format (``prometheus_client``).

Counters for steps, row- and token-forwards and requests (Prometheus' ``rate()`` turns them
into per-second figures over any window); gauges for the queue, the running samples and rows,
and the last ten seconds' steps/s, row-forwards/s and token-forwards/s, for a glance without a
Prometheus server; histograms of request latency, queue wait and per-step wall time. Each
server has its own registry, so several servers in one process (tests) never share counts.
"""

from __future__ import annotations

import collections
import threading
import time

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WINDOW_S = 10.0


@attrs.define(eq=False, slots=False)  # the instruments are set after init
class ServerMetrics:
    """The server's instruments over one private registry."""

    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    recent: collections.deque = attrs.field(
        factory=collections.deque
    )  # (time, steps, row-forwards, token-forwards) per step
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.queue_depth = Gauge("dlmsearch_queue_depth", "Requests waiting for a slot", registry=r)
        self.running_samples = Gauge("dlmsearch_running_samples", "Samples (choices) decoding now", registry=r)
        self.running_rows = Gauge(
            "dlmsearch_running_rows", "Rows decoding now (particles and lookahead branches count)", registry=r
        )
        self.lanes = Gauge("dlmsearch_running_lanes", "Distinct decode settings decoding now", registry=r)
        self.steps = Counter(
            "dlmsearch_steps", "Decode steps (one round of every running sample of a lane)", registry=r
        )
        self.row_forwards = Counter("dlmsearch_row_forwards", "Rows forwarded by the model", registry=r)
        self.token_forwards = Counter("dlmsearch_token_forwards", "Positions the model computed", registry=r)
        self.slot_steps = Counter(
            "dlmsearch_slot_steps",
            "Rows decoding summed over steps (over dlmsearch_steps: the mean running rows per step)",
            registry=r,
        )
        self.tokens = Counter("dlmsearch_completion_tokens", "Completion tokens returned", registry=r)
        self.requests = Counter("dlmsearch_requests", "Requests answered, by outcome", ["outcome"], registry=r)
        for outcome in ("ok", "error"):  # exposed at 0 from the start
            self.requests.labels(outcome=outcome)
        self.steps_per_s = Gauge(
            "dlmsearch_steps_per_second", f"Steps per second over the last {WINDOW_S:.0f} s", registry=r
        )
        self.row_forwards_per_s = Gauge(
            "dlmsearch_row_forwards_per_second", f"Row-forwards per second over the last {WINDOW_S:.0f} s", registry=r
        )
        self.token_forwards_per_s = Gauge(
            "dlmsearch_token_forwards_per_second",
            f"Token-forwards per second over the last {WINDOW_S:.0f} s",
            registry=r,
        )
        self.latency = Histogram(
            "dlmsearch_request_latency_seconds",
            "From arrival to the last choice finished",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "dlmsearch_queue_wait_seconds", "From arrival to admission", buckets=LATENCY_BUCKETS, registry=r
        )
        self.step_seconds = Histogram(
            "dlmsearch_step_seconds", "Wall time of one step of one lane", buckets=LATENCY_BUCKETS, registry=r
        )

    def stepped(self, seconds: float, rows: int, row_forwards: int, token_forwards: int) -> None:
        """One lane's step: its time, the rows it held and what its samples' counters grew by."""
        self.steps.inc()
        self.slot_steps.inc(rows)
        self.row_forwards.inc(row_forwards)
        self.token_forwards.inc(token_forwards)
        self.step_seconds.observe(seconds)
        now = time.monotonic()
        with self.lock:
            self.recent.append((now, row_forwards, token_forwards))
            while self.recent and self.recent[0][0] < now - WINDOW_S:
                self.recent.popleft()

    def render(self) -> bytes:
        """The text exposition, the windowed rates brought up to date first."""
        now = time.monotonic()
        with self.lock:
            while self.recent and self.recent[0][0] < now - WINDOW_S:
                self.recent.popleft()
            steps, rows, tokens = len(self.recent), sum(r for _, r, _ in self.recent), sum(t for _, _, t in self.recent)
        self.steps_per_s.set(steps / WINDOW_S)
        self.row_forwards_per_s.set(rows / WINDOW_S)
        self.token_forwards_per_s.set(tokens / WINDOW_S)
        return generate_latest(self.registry)
