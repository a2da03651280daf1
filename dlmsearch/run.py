"""Running a decoder over a task: continuous batching, a record per finished sample, resume, summary, traces.

Pending items are decoded by the one continuous batcher the server uses too
(:class:`~dlmsearch.search.batcher.Batcher`, per generation length): up to ``batch_size`` samples
decode together, each finished sample's record is written at once, and the places it frees are
given to the next pending items between steps. A sample's tokens and counters do not depend on what decodes beside it, so the
records are those of any batch size and any admission order.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from dlmsearch.config import build, check_keys, compose_checked, to_plain
from dlmsearch.distributed import Ranks
from dlmsearch.hydra_job import hydra_overrides, sweep_label
from dlmsearch.models.group_decisions import GroupDecisions, GroupDiverged
from dlmsearch.run_dir import claim, removed_on_failure
from dlmsearch.run_records import RunIdentity, read_records, summarise, write_status
from dlmsearch.run_trace import LookaheadLog, trace_events
from dlmsearch.search.batcher import Admission, Batcher, Failures, SessionKey
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult, length_record
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.plan import DecodePlan
from dlmsearch.search.records.verifier import Verifier
from dlmsearch.search.session import DecodeSession
from dlmsearch.search.width.population_hook import SinglePath
from dlmsearch.tasks.base import Task, TaskItem


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


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived: the finished samples' records are written, the run stops (and resumes later)."""

    def __init__(self, signum: int, written: int) -> None:
        super().__init__(
            f"interrupted by {signal.Signals(signum).name} after {written} items were written; run the same command again to resume"
        )
        self.signum = signum


@contextmanager
def graceful_signals() -> Iterator[dict[str, int | None]]:
    """SIGTERM and SIGINT only set a flag, read between decode steps (main thread only)."""
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


@attrs.define(eq=False)
class Sample:
    """A run's item as the batcher decodes it (a :class:`~dlmsearch.search.batcher.Unit`): its
    decoder (the fallback once it failed alone), when it was first admitted (``perf_counter``),
    and its share of the wall time of the steps it has decoded in so far."""

    uid: int
    item: TaskItem
    decoder: SearchDecoder
    since: float | None = None
    share: float = 0.0
    solo: bool = False
    session: SessionKey | None = None
    failure: Exception | None = None  # the error that sent it to the fallback decoder

    @property
    def lane_key(self) -> int:
        return id(self.decoder)

    @property
    def samples(self) -> int:
        return 1

    @property
    def rows(self) -> int:
        return 1

    def requests(self) -> list[DecodeRequest]:
        return [request(self.uid, self.item)]


@attrs.frozen
class Finished:
    """A sample's end: its record and, where it decoded, its result (for the trace)."""

    uid: int
    record: dict[str, Any]
    result: DecodeResult | None


def request(uid: int, item: TaskItem, key: int | None = None) -> DecodeRequest:
    return DecodeRequest(uid=uid, prompt=item.prompt, generation=item.generation, key=key)


def by_generation_length(pending: list[tuple[int, TaskItem]]) -> list[list[tuple[int, TaskItem]]]:
    """The pending items per generation length (a decode shares one), in order of first appearance."""
    groups: dict[int, list[tuple[int, TaskItem]]] = {}
    for uid, item in pending:
        groups.setdefault(len(item.generation), []).append((uid, item))
    return list(groups.values())


@attrs.define
class Decoding:
    """What decodes a task's items: the decoder, its engine, the task, an optional fallback
    decoder, a per-sample time budget (from its admission) and the task's verifier."""

    decoder: SearchDecoder
    engine: RolloutEngine
    task: Task
    fallback: SearchDecoder | None = None
    deadline_s: float | None = None  # per sample, from its admission into the decode
    lookahead_log: LookaheadLog | None = None  # set: every lookahead level is kept for the trace
    verifier: Verifier | None = (
        None  # the task's check of every item (``prepare``), keyed by uid: item ``i`` is uid ``i``
    )
    plans: dict[tuple[int, int], DecodePlan] = attrs.field(
        factory=dict
    )  # per (decoder, generation length): checked once, used by every decode

    def prepare(self, items: list[TaskItem]) -> DecodePlan:
        """Build the verifier over every item's question (never the references) and check the
        decoder (and the fallback) against the engine, the model and the task once, before any
        forward: a refused combination fails here, with its one line, not once per item."""
        if not items:
            raise ValueError(f"task {self.task.name} has no items to decode")
        self.verifier = self.task.verifier([i.question for i in items])
        gen_length = len(items[0].generation)
        if self.fallback is not None:
            self.plan(self.fallback, gen_length)
        plan = self.plan(self.decoder, gen_length)
        longest = max(items, key=lambda item: len(item.prompt))
        plan.check_canvas(
            len(longest.prompt), f"the canvas of item {longest.id}", "task.gen_length (gen_length= in the Python API)"
        )
        return plan

    def plan(self, decoder: SearchDecoder, gen_length: int) -> DecodePlan:
        """The decoder's plan for this generation length (made once)."""
        key = (id(decoder), gen_length)
        if key not in self.plans:
            self.plans[key] = decoder.plan(self.engine, gen_length, self.task.block_length, self.verifier)
        return self.plans[key]

    def session(self, decoder: SearchDecoder, gen_length: int) -> DecodeSession:
        return DecodeSession(
            decoder,
            self.engine,
            self.plan(decoder, gen_length),
            self.verifier,
            self.deadline_s,
            on_lookahead=self.lookahead_log,
        )

    def results(self, decoder: SearchDecoder, items: list[TaskItem], uids: list[int]) -> list[DecodeResult]:
        """These items decoded together, in their order (the Python API's and scripts' call); item
        ``j`` keys its randomness with ``uids[j]``, as the ``uids[j]``-th item of a run does. Errors propagate."""
        if not items:
            return []
        batch = attrs.evolve(
            self, verifier=self.task.verifier([i.question for i in items]), lookahead_log=None
        )  # keyed by place in ``items``
        session = batch.session(decoder, len(items[0].generation))
        session.admit([request(j, item, key=uid) for j, (uid, item) in enumerate(zip(uids, items))])
        by_place = {result.uid: result for result in session.run()}
        return [attrs.evolve(by_place[j], uid=uid) for j, uid in enumerate(uids)]

    def stream(
        self, pending: list[tuple[int, TaskItem]], batch_size: int, stopping: Callable[[], bool]
    ) -> Iterator[Finished]:
        """Decode ``(uid, item)`` pairs, at most ``batch_size`` samples at a time, yielding each
        sample as it finishes: between steps the places of finished samples go to the next pending
        items (continuous batching, :class:`~dlmsearch.search.batcher.Batcher`), one generation
        length at a time. Returns between steps once ``stopping()``; samples then unfinished have
        no record (a resumed run decodes them)."""
        for group in by_generation_length(pending):
            finished: list[Finished] = []
            batcher = self.batcher(batch_size, len(group[0][1].generation), finished)
            batcher.waiting.extend(Sample(uid, item, self.decoder) for uid, item in group)
            while batcher.busy:
                if stopping():
                    return
                yield from self._round(batcher, finished)

    def batcher(self, batch_size: int, gen_length: int, finished: list[Finished]) -> Batcher[Sample]:
        """The run's batcher: at most ``batch_size`` samples; a sample whose decode failed is
        decoded again alone, then by the fallback decoder (marked), else recorded with its error
        (appended to ``finished``)."""
        failures = Failures(
            give_up=lambda sample, error, refused: finished.append(self._give_up(sample, error)),
            fallback=self._fall_back,
            fatal=(GroupDiverged,),  # a tensor-parallel group's collectives no longer pair: nothing can decode on
        )
        return Batcher(
            Admission(batch_size=batch_size),
            failures,
            open=lambda sample: self.session(sample.decoder, gen_length),
            on_admitted=self._admitted,
        )

    def _round(self, batcher: Batcher[Sample], finished: list[Finished]) -> list[Finished]:
        """Admit what fits, step once; the samples that finished (or were given up) in it."""
        tick = time.perf_counter()
        for sample in batcher.take():
            batcher.admit(sample)
        running = list(batcher.running)
        results = batcher.step_all()
        share = self._elapsed(tick) / max(len(running), 1)
        for sample in running:
            sample.share += share
        for sample, result in results:
            batcher.retire(sample)
            finished.append(self._finished(sample, result))
        done = list(finished)
        finished.clear()
        return done

    def _admitted(self, sample: Sample) -> None:
        if sample.since is None:
            sample.since = time.perf_counter()
        if self.lookahead_log is not None:
            self.lookahead_log.begin(sample.uid)

    def _fall_back(self, sample: Sample, error: Exception) -> bool:
        """A sample that failed alone moves to the fallback decoder, once."""
        if self.fallback is None or sample.decoder is self.fallback:
            return False
        sample.decoder, sample.failure = self.fallback, error
        return True

    def _give_up(self, sample: Sample, error: Exception) -> Finished:
        """A sample that failed alone (and by the fallback): recorded with its error (both)."""
        if sample.failure is not None:
            error = RuntimeError(
                f"{type(sample.failure).__name__}: {sample.failure}; fallback {sample.decoder.name}: {type(error).__name__}: {error}"
            )
        record = {"id": sample.item.id, "error": f"{type(error).__name__}: {error}", "correct": None}
        return Finished(sample.uid, {**record, **self._timing(sample)}, None)

    def _finished(self, sample: Sample, result: DecodeResult) -> Finished:
        fallback = sample.decoder.name if sample.decoder is not self.decoder else None
        return Finished(sample.uid, self.record(sample.item, result, self._timing(sample), fallback), result)

    @staticmethod
    def _timing(sample: Sample) -> dict[str, float]:
        """The sample's share of the decode's wall time, and its latency from admission to now."""
        now = time.perf_counter()
        return {
            "wall_seconds": round(sample.share, 4),
            "latency_seconds": round(now - (sample.since if sample.since is not None else now), 4),
        }

    def record(
        self, item: TaskItem, result: DecodeResult, timing: dict[str, float], fallback: str | None = None
    ) -> dict[str, Any]:
        record = {
            "id": item.id,
            "output": self.task.output(item, result.tokens),
            **self.task.details(item, result.tokens),
            "correct": self.task.judge(item, result.tokens),
            "steps": result.steps,
            "row_forwards": result.row_forwards,
            "token_forwards": result.token_forwards,
            "tokens_committed": result.tokens_committed,
            **length_record(result.tokens, self.engine.capabilities.stop_ids),
            "live_particles": result.population.live_particles,
            **timing,
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

    def _elapsed(self, tick: float) -> float:
        if str(self.engine.adapter.device).startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - tick


def build_fallback(cfg: DictConfig) -> SearchDecoder | None:
    """The ``fallback=<preset>`` decoder, composed with the run's own task and decoding settings."""
    if not cfg.get("fallback"):
        return None
    fallback_cfg = compose_checked([f"+decoder={cfg.fallback}"])  # a misspelled preset: one line with the closest names
    fallback_cfg.task, fallback_cfg.decoding = cfg.task, cfg.decoding
    return build(fallback_cfg, "decoder")


def population_name(decoder: SearchDecoder) -> str | dict[str, Any]:
    """The decoder's population as a summary names it: ``none`` for one path, else its size and components."""
    population = decoder.population
    if isinstance(population, SinglePath):
        return "none"
    parts = {
        name: type(getattr(population, name)).__name__
        for name in ("diversity", "resampling", "choice", "score")
        if hasattr(population, name)
    }
    return {"size": population.size, **parts}


def read_all_done(out: Path) -> dict[str, dict[str, Any]]:
    """The records already in ``out`` (every rank's file), errors left out (decoded again)."""
    done: dict[str, dict[str, Any]] = {}
    for path in sorted(out.glob("results*.jsonl")):
        done.update(read_done(path))
    return done


@attrs.define
class Prepared:
    """A run ready to decode: its config and directory, the identity ``run.json`` will keep, this
    process's ranks, the built decoding, the task's items and the decoder's checked plan."""

    cfg: DictConfig
    out: Path
    overrides: list[str]
    identity: RunIdentity
    ranks: Ranks
    decoding: Decoding
    items: list[TaskItem]
    plan: DecodePlan


def run(cfg: DictConfig, overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """Decode every item of the task, writing each sample's record as it finishes; resume from
    ``out_dir`` only a run of the same config (``run.json``; :data:`~dlmsearch.run_records.RESULT_NEUTRAL_KEYS`
    may change). ``overrides``: what the config was composed with, for the summary (None: the
    running Hydra job's, if any).

    Under ``torchrun`` the pending items are sharded over the ranks, each rank writes its own
    ``results.rank<r>.jsonl``, and rank 0 merges them into ``results.jsonl`` and the summary.
    """
    return decode_run(prepare_run(cfg, overrides))


def prepare_run(cfg: DictConfig, overrides: Sequence[str] | None = None) -> Prepared:
    """Everything a run does before it decodes, the cheap checks first: the directory can be
    written and holds no other config's records, every key is taken and every value valid (the
    decoder, fallback and task are built before the model loads), then the model and the plan.
    A failure leaves nothing behind (no ``run.json``; the directories made for it removed)."""
    out = Path(cfg.out_dir)
    with removed_on_failure(out):  # before loading a model for minutes
        overrides = list(overrides) if overrides is not None else hydra_overrides()
        if int(cfg.batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1, got {cfg.batch_size}")
        check_keys(cfg)
        if OmegaConf.is_missing(cfg.model, "path"):  # before the task, which would need its tokenizer
            raise ValueError(
                "model.path is required: the local directory of the checkpoint (the Hub is never contacted)"
            )
        identity = claim(out, RunIdentity.of(to_plain(cfg), overrides))
        ranks = Ranks.from_environment(_tensor_parallel(cfg))
        decoding, items = _decoding(cfg, ranks)
        plan = decoding.prepare(items)
    return Prepared(cfg, out, overrides, identity, ranks, decoding, items, plan)


def decode_run(prepared: Prepared) -> dict[str, Any]:
    """Decode the prepared run's pending items and write its summary; ``run.json`` says the run
    started decoding, and then how it ended (finished, interrupted, or failed with its error)."""
    cfg, out, ranks, decoding, items = prepared.cfg, prepared.out, prepared.ranks, prepared.decoding, prepared.items
    done = read_all_done(out)
    # Every rank shards the same pending list: none may write a record before all have read what is
    # done (a fast rank's first records read by a slow one gave it other shards, and an item was skipped).
    ranks.barrier()
    already = sum(1 for item in items if item.id in done)
    if already and ranks.rank == 0:
        print(f"resuming: {already} of {len(items)} items already done in {out}", file=sys.stderr)
    pending = ranks.shard([(uid, item) for uid, item in enumerate(items) if item.id not in done])
    # Longest prompts first, so that a decode's rows carry little padding; results do not depend on
    # the batch (tested), and results.jsonl is rewritten in the task's order at the end (merge).
    pending.sort(key=lambda pair: -len(pair[1].prompt))
    prepared.identity.write(out)  # every rank writes the same file, at once
    try:
        _decode_pending(cfg, out, ranks, decoding, pending, done, len(items))
        done = ranks.merge(out, [item.id for item in items], partial(read_done, keep_errors=True))
        summary = _summary(prepared, done)
    except Interrupted:
        write_status(out, "interrupted")  # the same command resumes
        raise
    except BaseException as error:
        write_status(out, "failed", error)
        raise
    if ranks.rank == 0:
        write_status(out, "finished")
    return summary


def _summary(prepared: Prepared, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The run's summary (written to ``summary.json`` by rank 0), and the examples it prints."""
    cfg, decoding, plan, items = prepared.cfg, prepared.decoding, prepared.plan, prepared.items
    records = [done[item.id] for item in items if item.id in done]
    label = sweep_label()
    summary = {
        "decoder": decoding.decoder.name,
        **({"label": label} if label else {}),  # a sweep's arm: the overrides its sweep varies
        "commit": type(plan.commit).__name__,  # the rule that ran: on a model without a mask token, its own step
        "task": decoding.task.name,
        "cache": decoding.engine.cache.name,
        "population": population_name(decoding.decoder),
        "overrides": prepared.overrides,
        "fingerprint": prepared.identity.fingerprint,
        **summarise(records),
        **peak_memory_mb(),
        "world_size": prepared.ranks.world,
        # what was used: the engine's, the checkpoint's and the decoder's settings layered; the temperature its one owner's
        "sampling": {**plan.sampling.as_dict(), "temperature": plan.temperature.value},
        "temperature": plan.temperature.as_dict(),  # the temperature used and where it came from (the plan's owner)
        **decoding.engine.layerwise_cost(),
        "config": to_plain(cfg),
    }
    if prepared.ranks.rank == 0:
        (prepared.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["examples"] = [
        decoding.task.render(item, done[item.id]["output"])
        for item in items[: int(cfg.examples)]
        if "output" in done.get(item.id, {})
    ]
    return summary


def _tensor_parallel(cfg: DictConfig) -> int:
    """``model.tensor_parallel`` (1 where the model has no such key); what cannot run sharded is the plan's to refuse."""
    return cfg.model.get("tensor_parallel", 1)


def _decoding(cfg: DictConfig, ranks: Ranks) -> tuple[Decoding, list[TaskItem]]:
    """The run's decoder, fallback, task and its items, model and engine, built from the config
    (this rank's device) in that order: every value and the task's files are checked before the
    weights load."""
    decoder, fallback, task = build(cfg, "decoder"), build_fallback(cfg), build(cfg, "task")
    items = task.items()
    adapter = build(cfg, "model", **ranks.model_overrides(cfg))
    engine = build(cfg, "engine", adapter=adapter)
    decoding = Decoding(decoder, engine, task, fallback, cfg.get("deadline_s"), LookaheadLog() if cfg.trace else None)
    return decoding, items


def _decode_pending(
    cfg: DictConfig,
    out: Path,
    ranks: Ranks,
    decoding: Decoding,
    pending: list[tuple[int, TaskItem]],
    done: dict[str, dict[str, Any]],
    total: int,
) -> None:
    """Decode ``pending`` with continuous batching, writing each sample's record the moment it
    finishes, with a progress bar over samples; a signal stops admission, and what finished is kept.

    Args:
        cfg: the run's config (batch_size, trace).
        out: the run's directory (this rank's results and trace files).
        ranks: this process's place among torchrun's ranks (its files, the bar's step).
        decoding: the built decoder, engine and task, prepared for the items.
        pending: ``(uid, item)`` pairs still to decode, in admission order.
        done: records already in ``out`` (their solve rate starts the bar's).
        total: the task's items, done or not (the bar's length).
    """
    bar = tqdm(
        total=total,
        initial=total - len(pending) * ranks.dp_world,
        desc=f"{decoding.decoder.name} on {decoding.task.name}",
        unit="item",
        dynamic_ncols=True,
        disable=ranks.rank > 0,
    )
    written = 0
    judged = [r["correct"] for r in done.values() if r.get("correct") is not None]
    solved = sum(judged)
    with (
        bar,
        graceful_signals() as stop,
        # the other ranks of a tensor-parallel group decode the same items: only its rank 0 writes them
        (out / ranks.results_name if ranks.writes else Path(os.devnull)).open("a") as results,
        (out / ranks.trace_name if ranks.writes else Path(os.devnull)).open("a")
        if cfg.trace
        else nullcontext() as traces,
    ):
        decisions = decoding.engine.decisions  # a signal on one rank of a tensor-parallel group stops them all alike
        for finished in decoding.stream(pending, int(cfg.batch_size), lambda: agreed_signal(decisions, stop) > 0):
            write_finished(finished, results, traces, decoding, decoding.task)
            written += 1
            bar.update(ranks.dp_world)
            if finished.record.get("correct") is not None:
                judged.append(finished.record["correct"])
                solved += finished.record["correct"]
                bar.set_postfix(correct=f"{100 * solved / len(judged):.1f}%")
        signum = agreed_signal(decisions, stop)  # also a signal that came during the last step on one rank only
        if signum:
            raise Interrupted(signum, written)


def agreed_signal(decisions: GroupDecisions, stop: dict[str, int | None]) -> int:
    """The signal that stops the run (0: none): this process's, or in a tensor-parallel group the
    highest any rank received, so that every rank stops at the same step (their forwards stay paired)."""
    return decisions.highest(stop["signal"] or 0)


def write_finished(finished: Finished, results: Any, traces: Any, decoding: Decoding, task: Task) -> None:
    """Append a finished sample's record (and trace line) and flush, so that a kill loses no finished sample."""
    results.write(json.dumps(finished.record) + "\n")
    results.flush()
    if traces is not None and finished.result is not None:
        lookahead = decoding.lookahead_log.take(finished.uid) if decoding.lookahead_log is not None else []
        line = {
            "id": finished.record["id"],
            "events": trace_events(finished.result, task),
            "lookahead": lookahead,
            "revisions": finished.result.revisions.tolist(),
        }
        traces.write(json.dumps(line) + "\n")
        traces.flush()
