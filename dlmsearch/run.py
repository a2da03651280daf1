"""Running a decoder over a task: batches, incremental JSONL, resume, summary, traces."""

from __future__ import annotations

import json
from contextlib import nullcontext
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from dlmsearch.config import build, to_plain
from dlmsearch.search.driver import DecodeRequest, DecodeResult, SearchDecoder
from dlmsearch.search.engine import RolloutEngine
from dlmsearch.tasks.base import Task, TaskItem


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


def read_done(path: Path) -> dict[str, dict[str, Any]]:
    """Records already written (for resuming). A line torn by a crash is dropped and the file
    rewritten without it, so appended records start on a clean line."""
    done: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return done
    text = path.read_text()
    torn = False
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn = True
            continue
        done[record["id"]] = record
    if torn or (text and not text.endswith("\n")):
        path.write_text("".join(json.dumps(r) + "\n" for r in done.values()))
    return done


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate counters; accuracy only over items the task could judge. Wall time is the
    sum of the items' shares of their batches, so it survives resumes."""
    n = len(records)
    judged = [r["correct"] for r in records if r["correct"] is not None]
    mean = lambda key: round(sum(r.get(key, 0) for r in records) / n, 3)  # noqa: E731  (older records lack newer counters)
    return {
        "items": n,
        "accuracy": round(sum(judged) / len(judged), 4) if judged else None,
        "mean_steps": mean("steps"),
        "mean_row_forwards": mean("row_forwards"),
        "mean_token_forwards": mean("token_forwards"),
        "mean_tokens_committed": mean("tokens_committed"),
        "wall_seconds": round(sum(r["wall_seconds"] for r in records), 2),
    }


def decode_items(
    decoder: SearchDecoder, engine: RolloutEngine, task: Task, items: list[TaskItem], uids: list[int]
) -> list[DecodeResult]:
    """Decode one batch of task items."""
    requests = [DecodeRequest(uid=u, prompt=i.prompt, generation=i.generation) for u, i in zip(uids, items)]
    return decoder.decode(engine, requests, task.block_length)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Decode every item of the task, writing results as they come; resume from ``out_dir``."""
    adapter = build(cfg, "model")
    task = build(cfg, "task")
    engine = build(cfg, "engine", adapter=adapter)
    decoder = build(cfg, "decoder")
    if int(cfg.batch_size) < 1:
        raise ValueError(f"batch_size must be at least 1, got {cfg.batch_size}")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = task.items()
    results_path = out / "results.jsonl"
    done = read_done(results_path)
    pending = [(uid, item) for uid, item in enumerate(items) if item.id not in done]
    longest = max(items, key=lambda item: len(item.prompt) + len(item.generation))
    adapter.check_length(len(longest.prompt) + len(longest.generation), f"the canvas of item {longest.id} (prompt {len(longest.prompt)} + generation {len(longest.generation)})")
    cuda = str(adapter.device).startswith("cuda")
    bar = tqdm(total=len(items), initial=len(items) - len(pending), desc=f"{decoder.name} on {task.name}", unit="item", dynamic_ncols=True)
    with bar, results_path.open("a") as results, (out / "trace.jsonl").open("a") if cfg.trace else nullcontext() as traces:
        for start in range(0, len(pending), int(cfg.batch_size)):
            batch = pending[start : start + int(cfg.batch_size)]
            tick = time.perf_counter()
            decoded = decode_items(decoder, engine, task, [i for _, i in batch], [u for u, _ in batch])
            if cuda:
                torch.cuda.synchronize()
            share = (time.perf_counter() - tick) / len(batch)
            for (_, item), result in zip(batch, decoded):
                record = {
                    "id": item.id,
                    "output": task.output(item, result.tokens),
                    **task.details(item, result.tokens),
                    "correct": task.judge(item, result.tokens),
                    "steps": result.steps,
                    "row_forwards": result.row_forwards,
                    "token_forwards": result.token_forwards,
                    "tokens_committed": result.tokens_committed,
                    "wall_seconds": round(share, 4),
                }
                done[item.id] = record
                results.write(json.dumps(record) + "\n")
                if traces is not None:
                    traces.write(json.dumps({"id": item.id, "events": trace_events(result, task)}) + "\n")
            results.flush()
            bar.update(len(batch))
            judged = [r["correct"] for r in done.values() if r["correct"] is not None]
            if judged:
                bar.set_postfix(correct=f"{100 * sum(judged) / len(judged):.1f}%")
    records = [done[item.id] for item in items if item.id in done]
    summary = {"decoder": decoder.name, "task": task.name, **summarise(records), "config": to_plain(cfg)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["examples"] = [task.render(item, done[item.id]["output"]) for item in items[: int(cfg.examples)]]
    return summary


