"""A tensor-parallel group decides as one: every decision that reads process-local state.

Every rank of a group (:mod:`~dlmsearch.models.tensor_parallel`) runs the whole decode loop, and its
model's all-reduces pair only while every rank runs the same forwards of the same shapes. Four
decisions read what one process sees alone: the deadline (its clock), the out-of-memory back-off
(its GPU), ``row_budget=auto`` (its free memory) and the stop signal (its handler). Each is agreed
here, nano-vllm's principle at this scale: the ranks all-reduce one small tensor (MAX of flags and
counts, MIN of budgets) at a point every rank reaches with the same collectives behind it, and
apply the agreed values. One process (no group) agrees with itself: no collective, no cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import torch


class GroupDiverged(Exception):
    """A rank failed where the group's collectives were half done: the ranks can no longer agree (not a
    RuntimeError, so the out-of-memory back-off never retries it)."""


@attrs.frozen(eq=False)
class GroupDecisions:
    """The agreement of one tensor-parallel group (``group`` None: one process, nothing to agree)."""

    group: Any = None
    rank: int = 0

    @staticmethod
    def of(module: torch.nn.Module) -> GroupDecisions:
        """The decisions of the group ``module`` is sharded over (its ``tensor_parallel``), if any."""
        tp = getattr(module, "tensor_parallel", None)
        if tp is None or tp.size == 1:
            return GroupDecisions()
        return GroupDecisions(tp.group, tp.rank)

    def agree(
        self, highest: torch.Tensor, lowest: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``highest`` as the group's elementwise maximum and ``lowest`` as its minimum (integers or
        booleans, on the host), in one all-reduce: the minimum rides negated beside the maximum."""
        if self.group is None:
            return highest, lowest
        import torch.distributed as dist

        parts = [highest.long().flatten()] + ([] if lowest is None else [-lowest.long().flatten()])
        packed = torch.cat(parts).to(self._device())
        dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=self.group)
        packed = packed.cpu()
        agreed = packed[: highest.numel()].view(highest.shape).to(highest.dtype)
        if lowest is None:
            return agreed, None
        return agreed, (-packed[highest.numel() :]).view(lowest.shape).to(lowest.dtype)

    def any(self, flags: torch.Tensor) -> torch.Tensor:
        """``flags`` set where any rank set them (a deadline one rank's clock crossed is every rank's)."""
        return self.agree(flags)[0]

    def highest(self, value: int) -> int:
        """The largest of the ranks' ``value`` (an out-of-memory seen by one rank, a stop signal's number)."""
        if self.group is None:  # one process: no tensor, no cost per forward
            return int(value)
        return int(self.agree(torch.tensor([value]))[0][0])

    def least(self, value: int) -> int:
        """The smallest of the ranks' ``value`` (the rows per forward that fit every rank's device)."""
        if self.group is None:
            return int(value)
        return int(self.agree(torch.zeros(0, dtype=torch.long), torch.tensor([value]))[1][0])

    @contextmanager
    def paired(self, local: Callable[[BaseException], bool]) -> Iterator[None]:
        """Around the model's own collectives: a rank that fails there alone (``local``: an out-of-memory
        error) has left the others waiting in an all-reduce it never joins, so no agreement can follow
        and the back-off cannot retry; in a group that failure becomes :class:`GroupDiverged` (one
        line), which ends the run. One process, or an error every rank raises alike: as raised."""
        try:
            yield
        except Exception as error:
            if self.group is None or not local(error):
                raise
            raise GroupDiverged(
                f"tensor-parallel rank {self.rank} failed inside the sharded model's forward, between its all-reduces "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); the group cannot retry "
                "together, lower engine.row_budget"
            ) from error

    def _device(self) -> torch.device:
        """Where the group's collectives run: the current GPU under nccl, else the host."""
        import torch.distributed as dist

        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
