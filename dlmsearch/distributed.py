"""Scale-out under ``torchrun``: which items a rank decodes, where it writes, and the merge.

Each data-parallel group decodes every ``dp_world``-th pending item into its own
``results.rank<d>.jsonl`` (``d``: the group's data-parallel rank); rank 0 then merges all result
files into ``results.jsonl`` in item order. Resuming reads every result file first, so a run can
resume with another number of ranks (or none).

With ``model.tensor_parallel=N`` the ``world`` ranks form ``world / N`` groups of ``N`` consecutive
ranks, each one model sharded over its ranks (:mod:`dlmsearch.models.tensor_parallel`): all ranks
of a group decode the same items and take the same decisions, and only its tensor-parallel rank 0
writes them. Without it every rank is its own group (``N = 1``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import torch

from dlmsearch.models.tensor_parallel import RankLayout, join_process_group, rank_layout_from_environment
from dlmsearch.run_records import read_records, write_records

Item = TypeVar("Item")


@attrs.frozen
class Ranks(RankLayout):
    """This process's place among ``world`` processes (1 without torchrun): its :class:`RankLayout` (rank,
    world, tensor-parallel group ``size``; 1: every rank decodes its own shard) and the GPU it owns."""

    local_rank: int = 0

    @staticmethod
    def from_environment(tensor_parallel: int = 1) -> Ranks:
        """Read torchrun's environment and join its process group (gloo on CPU, nccl on CUDA);
        ``tensor_parallel`` > 1 needs torchrun and a world it divides."""
        layout = rank_layout_from_environment(tensor_parallel)
        if layout.world <= 1:
            return Ranks()
        join_process_group()
        return Ranks(layout.rank, layout.world, layout.size, local_rank=int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def writes(self) -> bool:
        """Whether this rank writes its group's results (its tensor-parallel rank 0)."""
        return self.tp_rank == 0

    @property
    def results_name(self) -> str:
        return "results.jsonl" if self.dp_world == 1 else f"results.rank{self.dp_rank}.jsonl"

    @property
    def trace_name(self) -> str:
        return "trace.jsonl" if self.dp_world == 1 else f"trace.rank{self.dp_rank}.jsonl"

    def model_overrides(self, cfg: Any) -> dict[str, str]:
        """One GPU per rank where the model would run on CUDA."""
        if self.world > 1 and torch.cuda.is_available() and str(cfg.model.get("device", "")) in ("auto", "cuda"):
            return {"device": f"cuda:{self.local_rank}"}
        return {}

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for in one process)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def shard(self, pending: list[Item]) -> list[Item]:
        """This rank's data-parallel shard (the same for every rank of a tensor-parallel group)."""
        return pending[self.dp_rank :: self.dp_world]

    def merge(
        self, out: Path, item_ids: list[str], read: Callable[[Path], dict[str, dict[str, Any]]]
    ) -> dict[str, dict[str, Any]]:
        """Rank 0 folds every rank's results (and traces) into ``results.jsonl`` (``trace.jsonl``),
        in the task's order whatever order the items were decoded in (as they finished, longest
        prompts first, resumed runs, other world sizes), a retried item's last record replacing its
        earlier error; all ranks return the merged records."""
        self.barrier()
        if self.rank == 0:
            done = fold_in_order(out, "results", item_ids, read)
            fold_in_order(out, "trace", item_ids, read_records)
        self.barrier()
        return done if self.rank == 0 else read(out / "results.jsonl")  # rank 0 holds what it wrote


def fold_in_order(
    out: Path, name: str, item_ids: list[str], read: Callable[[Path], dict[str, dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """``out/<name>.jsonl`` and every rank's ``<name>.rank<r>.jsonl`` as one file in the task's order
    (``read`` decides which line of an id wins and what is dropped), replaced at once; the rank
    files are removed. Nothing is written where there is no such file (a run without traces)."""
    ranked = sorted(out.glob(f"{name}.rank*.jsonl"))
    paths = [p for p in [out / f"{name}.jsonl", *ranked] if p.exists()]
    if not paths:
        return {}
    folded: dict[str, dict[str, Any]] = {}
    for path in paths:
        folded.update(read(path))
    known = set(item_ids)
    ordered = [folded[i] for i in item_ids if i in folded] + [r for i, r in folded.items() if i not in known]
    staging = out / f"{name}.jsonl.tmp"
    write_records(staging, ordered)
    staging.replace(out / f"{name}.jsonl")
    for path in ranked:
        path.unlink()
    return folded
