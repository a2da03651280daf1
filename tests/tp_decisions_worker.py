"""A torchrun worker for the group's decisions (``tests/test_tp_decisions.py``); a helper, not a test module.

``python -m torch.distributed.run --nproc-per-node 2 tests/tp_decisions_worker.py DIRECTORY OUT`` decodes the
tiny sharp LLaDA checkpoint in ``DIRECTORY`` sharded over the two ranks, where only the last rank sees
what one process would see alone: its clock crosses the deadline, its summaries run out of memory
once, its stop signal arrives. Every rank writes what it decoded to ``OUT.rank<r>``; the test decodes
the same cases in one process (``crossing=True``, :func:`decode_cases`) and compares.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from tp_worker import load, requests  # the script's own folder (tests/) is on the path

GEN, BLOCK = 16, 8


def _decoder(preset: str):
    from dlmsearch.config import build, compose

    return build(compose([f"+decoder={preset}", "decoding=text", f"task.gen_length={GEN}"]), "decoder")


def _summary(results: list) -> dict[str, Any]:
    return {
        "tokens": [r.tokens.tolist() for r in results],
        "counters": [(r.steps, r.row_forwards, r.token_forwards) for r in results],
        "deadline_hit": [r.deadline_hit for r in results],
    }


def deadline(adapter, crossing: bool) -> dict[str, Any]:
    """A lookahead decoder under a 35 s deadline that only the crossing rank's clock (10 s a reading) passes."""
    from dlmsearch.search import driver
    from dlmsearch.search.decode import intake
    from dlmsearch.search.engine.rollout import RolloutEngine

    readings = itertools.count(0, 10) if crossing else itertools.repeat(0)
    clock = SimpleNamespace(
        monotonic=lambda: float(next(readings))
    )  # one clock: the samples' start and the loop's checks
    with mock.patch.object(driver, "time", clock), mock.patch.object(intake, "time", clock):
        results = _decoder("ete").decode(RolloutEngine(adapter=adapter), requests(adapter, GEN), BLOCK, deadline_s=35)
    return _summary(results)


def out_of_memory(adapter, crossing: bool) -> dict[str, Any]:
    """The crossing rank's third summaries (a forward of all three rows, after the model's all-reduces) run out of memory once."""
    from dlmsearch.search.engine import rollout

    calls, real = itertools.count(), rollout.summarise_logits

    def summaries(*args: Any, **kwargs: Any) -> Any:
        if crossing and next(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected on one rank)")
        return real(*args, **kwargs)

    engine = rollout.RolloutEngine(adapter=adapter)
    with mock.patch.object(rollout, "summarise_logits", summaries):
        results = _decoder("llada").decode(engine, requests(adapter, GEN), BLOCK)
    return {**_summary(results), "budget": engine.budget}


class _Prompts:
    """A task of the three requests' canvases; its output of the first finished sample raises the crossing rank's stop flag."""

    name, gen_length, block_length = "tp", GEN, BLOCK

    def __init__(self, stop: dict[str, int | None], crossing: bool) -> None:
        self.stop, self.crossing = stop, crossing

    def verifier(self, questions: list) -> None:
        return None

    def output(self, item: Any, tokens: torch.Tensor) -> str:
        if self.crossing:
            self.stop["signal"] = 15  # SIGTERM, as graceful_signals' handler notes it
        return " ".join(map(str, tokens.tolist()))

    def details(self, item: Any, tokens: torch.Tensor) -> dict:
        return {}

    def judge(self, item: Any, tokens: torch.Tensor) -> None:
        return None


def stop_signal(adapter, crossing: bool, out: Path) -> dict[str, Any]:
    """The production loop (batch 1, three items) with a stop signal on the crossing rank after the first sample."""
    from omegaconf import OmegaConf

    from dlmsearch import run
    from dlmsearch.distributed import Ranks
    from dlmsearch.search.engine.rollout import RolloutEngine
    from dlmsearch.tasks.base import TaskItem

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    stop: dict[str, int | None] = {"signal": None}

    @contextmanager
    def signals() -> Iterator[dict[str, int | None]]:
        yield stop

    items = [TaskItem(str(i), r.prompt, r.generation) for i, r in enumerate(requests(adapter, GEN))]
    decoding = run.Decoding(_decoder("llada"), RolloutEngine(adapter=adapter), _Prompts(stop, crossing))
    cfg = OmegaConf.create({"batch_size": 1, "trace": False})
    out.mkdir(parents=True, exist_ok=True)
    with mock.patch.object(run, "graceful_signals", signals):
        try:
            run._decode_pending(
                cfg, out, Ranks(rank, world, size=world, local_rank=rank), decoding, list(enumerate(items)), {}, 3
            )
        except run.Interrupted as interrupted:
            return {"stopped": str(interrupted)}
    return {"stopped": None}


def decode_cases(adapter, crossing: bool, out: Path) -> dict[str, Any]:
    return {
        "deadline": deadline(adapter, crossing),
        "out_of_memory": out_of_memory(adapter, crossing),
        "stop": stop_signal(adapter, crossing, out),
    }


def diverged(adapter) -> str:
    """The one line a rank gives where it ran out of memory among the model's all-reduces (no collective runs)."""
    from dlmsearch.models.group_decisions import GroupDecisions, GroupDiverged

    try:
        with GroupDecisions.of(adapter.module).paired(lambda error: True):
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
    except GroupDiverged as error:
        return str(error)
    return ""


def main(directory: str, out: str) -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    adapter = load("llada", directory, world)
    found = decode_cases(adapter, rank == world - 1, Path(out).parent / f"run{rank}")
    found["diverged"] = diverged(adapter)
    torch.save(found, f"{out}.rank{rank}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
