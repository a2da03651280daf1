"""Running a decoder over a task: batches, incremental JSONL, resume, summary, traces."""

from __future__ import annotations

import json
import resource
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from dlmsearch.records import percentile, read_records
from dlmsearch.config import build, compose, to_plain
from dlmsearch.distributed import Ranks
from dlmsearch.search.driver import DecodeRequest, DecodeResult, SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.plan import DecodePlan
from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.tasks.base import Task, TaskItem


@attrs.define
class LookaheadLog:
    """Every level of every lookahead, per sample, for ``trace.jsonl``: the sample's model call,
    the particle, the depth reached, the live branches with their scores, and whether the
    branches roll on (``done``: the level at which a branch is adopted)."""

    engine: RolloutEngine
    size: int  # particles per sample: slot ``s`` belongs to the batch's sample ``s // size``
    uids: list[int] = attrs.field(factory=list)
    levels: dict[int, list[dict[str, Any]]] = attrs.field(factory=dict)

    def start(self, uids: list[int]) -> None:
        self.uids = list(uids)
        for uid in uids:
            self.levels[uid] = []

    def __call__(self, look: Lookahead) -> None:
        calls = look.calls.tolist()
        scores = look.scores.view(len(look.slots), look.width).tolist()
        for s, slot in enumerate(look.slots.tolist()):
            live = look.live[s].tolist()
            self.levels[self.uids[slot // self.size]].append({
                "call": calls[s],
                "particle": slot % self.size,
                "depth": look.depth,
                "live": [k for k, alive in enumerate(live) if alive],
                "scores": [round(v, 5) for v, alive in zip(scores[s], live) if alive],
                "rolling": bool(look.rolling[s]) and not look.done,
                "restarted": bool(look.restarted[s]),
            })

    def take(self, uid: int) -> list[dict[str, Any]]:
        return self.levels.pop(uid, [])


def trace_events(result: DecodeResult, task: Task) -> list[dict[str, Any]]:
    """Per model call that led to commits: positions, tokens (ids and strings), confidences, depth and branch."""
    events = []
    for call in torch.unique(result.commit_call[result.commit_call >= 0]).tolist():
        at = (result.commit_call == call).nonzero().squeeze(1)
        events.append({
            "call": call,
            "positions": at.tolist(),
            "tokens": result.tokens[at].tolist(),
            "strings": task.token_strings(result.tokens[at].tolist()),
            "confidences": [round(c, 5) for c in result.commit_confidence[at].tolist()],
            "depth": result.commit_depth[at].tolist(),
            "branch": result.commit_branch[at].tolist(),
        })
    return events


def read_done(path: Path, keep_errors: bool = False) -> dict[str, dict[str, Any]]:
    """Records already written (for resuming): torn lines are dropped and the file rewritten
    without them; items that ended in error are left out (decoded again) unless ``keep_errors``."""
    return read_records(path, keep_errors=keep_errors, repair=True)


def peak_memory_mb() -> dict[str, float]:
    """Peak resident memory of this process, and CUDA's peak allocation where there is CUDA."""
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peaks = {"peak_rss_mb": round(rss_kb / 1024, 1)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peaks["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return peaks


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate counters; accuracy only over items the task could judge. Wall time is the
    sum of the items' shares of their batches, so it survives resumes."""
    n = len(records)
    decoded = [r for r in records if not r.get("error")]
    judged = [r["correct"] for r in decoded if r["correct"] is not None]
    mean = lambda key: round(sum(r.get(key, 0) for r in decoded) / max(len(decoded), 1), 3)  # noqa: E731  (older records lack newer counters)
    wall = sum(r["wall_seconds"] for r in records)
    latencies = [r["wall_seconds"] for r in decoded]
    return {
        "items": n,
        "accuracy": round(sum(judged) / len(judged), 4) if judged else None,
        "mean_steps": mean("steps"),
        "mean_row_forwards": mean("row_forwards"),
        "mean_token_forwards": mean("token_forwards"),
        "mean_tokens_committed": mean("tokens_committed"),
        "mean_live_particles": mean("live_particles") if any("live_particles" in r for r in decoded) else 1.0,
        "wall_seconds": round(wall, 2),
        "latency_p50_s": round(percentile(latencies, 50), 4),
        "latency_p95_s": round(percentile(latencies, 95), 4),
        "latency_p99_s": round(percentile(latencies, 99), 4),
        "samples_per_s": round(n / wall, 3) if wall else None,
        "tokens_per_s": round(sum(r.get("tokens_committed", 0) for r in decoded) / wall, 2) if wall else None,
        "errors": sum(1 for r in records if r.get("error")),
        "fallbacks": sum(1 for r in records if r.get("fallback")),
        "deadline_hits": sum(1 for r in records if r.get("deadline_hit")),
    }


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived: the current batch was written, the run stops (and resumes later)."""

    def __init__(self, signum: int, written: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name} after {written} items were written; run the same command again to resume")
        self.signum = signum


@contextmanager
def graceful_signals() -> Iterator[dict[str, int | None]]:
    """SIGTERM and SIGINT only set a flag, read between batches (main thread only)."""
    state: dict[str, int | None] = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def note(signum: int, frame: Any) -> None:
        state["signal"] = signum

    previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield state
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@attrs.define
class Decoding:
    """What decodes a batch: the decoder, its engine, the task, an optional fallback decoder and
    a per-sample time budget."""

    decoder: SearchDecoder
    engine: RolloutEngine
    task: Task
    fallback: SearchDecoder | None = None
    deadline_s: float | None = None  # samples of a batch decode together: measured from the batch's start
    lookahead_log: LookaheadLog | None = None  # set: every lookahead level is kept for the trace
    plans: dict[str, DecodePlan] = attrs.field(factory=dict)  # per decoder name: checked once (``prepare``), used by every batch

    def prepare(self, items: list[TaskItem]) -> DecodePlan:
        """Check the decoder (and the fallback) against the engine, the model and the task once,
        before any forward: a refused combination fails here, with its one line, not once per item."""
        if not items:
            raise ValueError(f"task {self.task.name} has no items to decode")
        gen_length = len(items[0].generation)
        verifier = self.task.verifier([items[0].question])
        for decoder in (self.decoder, self.fallback):
            if decoder is not None:
                self.plans[decoder.name] = decoder.plan(self.engine, gen_length, self.task.block_length, verifier)
        return self.plans[self.decoder.name]

    def results(self, decoder: SearchDecoder, items: list[TaskItem], uids: list[int]) -> list[DecodeResult]:
        requests = [DecodeRequest(uid=u, prompt=i.prompt, generation=i.generation) for u, i in zip(uids, items)]
        verifier = self.task.verifier([i.question for i in items])  # built from the questions: never the references
        log = self.lookahead_log
        if log is not None:
            log.size = decoder.population.size
            log.start(uids)
        plan = self.plans.get(decoder.name)
        if plan is not None and plan.gen_length != len(items[0].generation):
            plan = None  # a task with several generation lengths: checked per batch
        return decoder.decode(self.engine, requests, self.task.block_length, deadline_s=self.deadline_s, verifier=verifier, on_lookahead=log, plan=plan)

    def record(self, item: TaskItem, result: DecodeResult, share: float, fallback: str | None = None) -> dict[str, Any]:
        record = {
            "id": item.id,
            "output": self.task.output(item, result.tokens),
            **self.task.details(item, result.tokens),
            "correct": self.task.judge(item, result.tokens),
            "steps": result.steps,
            "row_forwards": result.row_forwards,
            "token_forwards": result.token_forwards,
            "tokens_committed": result.tokens_committed,
            "live_particles": result.population.live_particles,
            "wall_seconds": round(share, 4),
        }
        if result.population.accepted is not None:
            record["verifier_accepted"] = result.population.accepted
        revised = int(result.revisions.sum())
        if revised:
            record["revisions"] = revised  # positions returned to the mask, summed over the decode
        if result.deadline_hit:
            record["deadline_hit"] = True
        if fallback:
            record["fallback"] = fallback
        return record

    def batch(self, batch: list[tuple[int, TaskItem]]) -> list[tuple[dict[str, Any], DecodeResult | None]]:
        """Records of a batch. If the batch fails, its items are retried one by one; an item that
        still fails is decoded by the fallback decoder (marked), else recorded with its error."""
        tick = time.perf_counter()
        try:
            decoded = self.results(self.decoder, [i for _, i in batch], [u for u, _ in batch])
        except Exception as error:  # one bad item must not end the run
            if len(batch) > 1:
                return [pair for one in batch for pair in self.batch([one])]
            return [self._rescue(batch[0], error)]
        share = self._elapsed(tick) / len(batch)
        return [(self.record(item, result, share), result) for (_, item), result in zip(batch, decoded)]

    def _rescue(self, one: tuple[int, TaskItem], error: Exception) -> tuple[dict[str, Any], DecodeResult | None]:
        uid, item = one
        tick = time.perf_counter()
        if self.fallback is not None:
            try:
                [result] = self.results(self.fallback, [item], [uid])
                return self.record(item, result, self._elapsed(tick), fallback=self.fallback.name), result
            except Exception as second:  # the fallback failed too: record both
                error = RuntimeError(f"{type(error).__name__}: {error}; fallback {self.fallback.name}: {type(second).__name__}: {second}")
        message = f"{type(error).__name__}: {error}"
        return {"id": item.id, "error": message, "correct": None, "wall_seconds": round(self._elapsed(tick), 4)}, None

    def _elapsed(self, tick: float) -> float:
        if str(self.engine.device).startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - tick


def build_fallback(cfg: DictConfig) -> SearchDecoder | None:
    """The ``fallback=<preset>`` decoder, composed with the run's own task and decoding settings."""
    if not cfg.get("fallback"):
        return None
    fallback_cfg = compose([f"+decoder={cfg.fallback}"])
    fallback_cfg.task, fallback_cfg.decoding = cfg.task, cfg.decoding
    return build(fallback_cfg, "decoder")


def run(cfg: DictConfig) -> dict[str, Any]:
    """Decode every item of the task, writing results as they come; resume from ``out_dir``.

    Under ``torchrun`` the pending items are sharded over the ranks, each rank writes its own
    ``results.rank<r>.jsonl``, and rank 0 merges them into ``results.jsonl`` and the summary.
    """
    out = Path(cfg.out_dir)
    check_writable(out)  # before loading a model for minutes
    ranks = Ranks.from_environment()
    adapter = build(cfg, "model", **ranks.model_overrides(cfg))
    task = build(cfg, "task")
    engine = build(cfg, "engine", adapter=adapter)
    decoding = Decoding(build(cfg, "decoder"), engine, task, build_fallback(cfg), cfg.get("deadline_s"), LookaheadLog(engine, 1) if cfg.trace else None)
    if int(cfg.batch_size) < 1:
        raise ValueError(f"batch_size must be at least 1, got {cfg.batch_size}")
    items = task.items()
    plan = decoding.prepare(items)
    longest = max(items, key=lambda item: len(item.prompt) + len(item.generation))
    engine.capabilities.check_length(len(longest.prompt) + len(longest.generation), f"the canvas of item {longest.id} (prompt {len(longest.prompt)} + generation {len(longest.generation)})")
    done: dict[str, dict[str, Any]] = {}
    for path in sorted(out.glob("results*.jsonl")):
        done.update(read_done(path))
    pending = ranks.shard([(uid, item) for uid, item in enumerate(items) if item.id not in done])
    # Longest prompts first, so that a batch's rows carry little padding; results do not depend on
    # the batch (tested), and results.jsonl is rewritten in the task's order at the end (merge).
    pending.sort(key=lambda pair: -len(pair[1].prompt))
    results_path = out / ranks.results_name
    decoder_name = decoding.decoder.name
    bar = tqdm(total=len(items), initial=len(items) - len(pending) * ranks.world, desc=f"{decoder_name} on {task.name}", unit="item", dynamic_ncols=True, disable=ranks.rank > 0)
    written = 0
    with bar, graceful_signals() as stop, results_path.open("a") as results, (out / ranks.trace_name).open("a") if cfg.trace else nullcontext() as traces:
        for start in range(0, len(pending), int(cfg.batch_size)):
            batch = pending[start : start + int(cfg.batch_size)]
            for (uid, _), (record, result) in zip(batch, decoding.batch(batch)):
                done[record["id"]] = record
                results.write(json.dumps(record) + "\n")
                if traces is not None and result is not None:
                    lookahead = decoding.lookahead_log.take(uid) if decoding.lookahead_log is not None else []
                    line = {"id": record["id"], "events": trace_events(result, task), "lookahead": lookahead, "revisions": result.revisions.tolist()}
                    traces.write(json.dumps(line) + "\n")
                written += 1
            results.flush()
            bar.update(min(int(cfg.batch_size), len(pending) - start) * ranks.world)
            judged = [r["correct"] for r in done.values() if r.get("correct") is not None]
            if judged:
                bar.set_postfix(correct=f"{100 * sum(judged) / len(judged):.1f}%")
            if stop["signal"] is not None:
                raise Interrupted(stop["signal"], written)
    done = ranks.merge(out, [item.id for item in items], partial(read_done, keep_errors=True))
    records = [done[item.id] for item in items if item.id in done]
    summary = {
        "decoder": decoder_name, "task": task.name, **summarise(records), **peak_memory_mb(), "world_size": ranks.world,
        "sampling": plan.sampling.as_dict(),  # what was used: the engine's, the checkpoint's and the decoder's settings layered
        **engine.layerwise_cost(),
        "config": to_plain(cfg),
    }
    if ranks.rank == 0:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["examples"] = [task.render(item, done[item.id]["output"]) for item in items[: int(cfg.examples)] if "output" in done.get(item.id, {})]
    return summary


def check_writable(out: Path) -> None:
    """Fail before any decoding when the output directory cannot be written.

    Creates ``out`` (and its parents) and writes and removes a probe file in it; any OSError
    (no permission, a read-only or full disk, a file where a directory should be) becomes one
    ValueError line naming the directory.
    """
    import tempfile

    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".dlmsearch-write-check-") as probe:
            probe.write(b"ok")
            probe.flush()
    except OSError as error:
        existing = next((p for p in (out, *out.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            reason = "it is a file" if existing == out else f"{existing} is a file"
        else:
            reason = error.strerror or str(error)
        raise ValueError(f"out_dir={out} cannot be written: {reason}") from error
