"""Out-of-memory back-off: a forward that runs out of device memory is split and retried, and
the row budget it lowered grows back (see :meth:`OutOfMemoryBackOff._forward`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.group_decisions import GroupDecisions
from dlmsearch.search.engine.call_records import Forward

_OUT_OF_MEMORY = tuple({torch.OutOfMemoryError, getattr(torch.cuda, "OutOfMemoryError", torch.OutOfMemoryError)})


def out_of_memory(error: BaseException) -> bool:
    """CUDA's (and torch's) out-of-memory error, or a RuntimeError that says it ran out of memory."""
    return isinstance(error, _OUT_OF_MEMORY) or (isinstance(error, RuntimeError) and "out of memory" in str(error))


def check_budget(value: object) -> None:
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"row_budget must be a positive integer or auto, got {value!r}")


class OutOfMemoryBackOff:
    """The engine's row budget as it backs off and grows again (its state: the engine's fields
    ``row_budget``, ``budget``, ``auto_budget``, ``regrow_after``, ``successes``, ``decisions``; its model, ``adapter``)."""

    row_budget: int | str
    budget: int | None
    auto_budget: int | None
    regrow_after: int
    successes: int
    decisions: GroupDecisions
    adapter: ModelAdapter

    @property
    def max_rows(self) -> int:
        """The configured rows per forward (``auto``: the estimate for the current canvas, 64 before the first call)."""
        if self.row_budget == "auto":
            return self.auto_budget or 64
        return int(self.row_budget)

    @property
    def current_budget(self) -> int:
        """Rows per forward now: ``row_budget``, or less after an out-of-memory error."""
        return self.max_rows if self.budget is None else min(self.budget, self.max_rows)

    def _forward(
        self,
        forward: Forward,
        run: Callable[[Forward], tuple],
        sample_uid: torch.Tensor,
        planned_rows: int | None = None,
    ) -> Iterator[tuple[Forward, tuple]]:
        """Run one planned forward, yielding each piece that ran and its result.

        Out-of-memory back-off. When a forward of ``n`` rows runs out of memory (torch's or
        CUDA's OutOfMemoryError, or a RuntimeError saying "out of memory"), the CUDA cache is
        emptied and the forward is split into two of ``ceil(n / 2)`` and ``floor(n / 2)`` rows
        (same first column and window; each keeps its own rows' cache refreshes and windows),
        each retried the same way down to one row; a row that fails alone re-raises, naming its
        sample uid and the rows tried. Each failure lowers ``current_budget`` to ``ceil(n / 2)``
        for all later forwards (those already planned in this step are cut to it before they
        run); after ``regrow_after`` (20) successful forwards in a row the budget doubles, up to
        the configured ``row_budget`` (a budget that is still too large fails once more and halves
        again). Results do not change: a row's logits do not depend on its batch, and the
        counters count the logical step and its rows once, not the retries.

        A tensor-parallel group backs off as one: after every attempt the ranks agree whether any
        ran out of memory (:class:`~dlmsearch.models.group_decisions.GroupDecisions`), and all
        halve and retry together, so their next forwards (and all-reduces) pair.
        """
        rows, budget = len(forward.rows), self.current_budget
        if (forward.distinct or rows) > budget:  # the budget dropped earlier in this step: no need to fail again first
            for start in range(0, rows, budget):
                yield from self._forward(forward.piece(slice(start, start + budget)), run, sample_uid)
            return
        cause, decisions = None, self.decisions
        try:
            result = run(forward)
        except RuntimeError as error:
            if not out_of_memory(error):
                raise
            if rows == 1 and decisions.group is None:
                raise self._row_out_of_memory(forward, sample_uid, planned_rows, str(error)) from error
            cause = str(error)
        if not decisions.highest(cause is not None):  # one process: its own outcome; a group: any rank's
            self._succeeded()
            yield forward, result
            return
        if rows == 1:
            cause = cause or "another rank of its tensor-parallel group ran out of memory"
            raise self._row_out_of_memory(forward, sample_uid, planned_rows, cause)
        # Retried outside the except clause, so that the failed attempt's tensors (held by its traceback) are freed.
        half = (rows + 1) // 2
        self.budget, self.successes = min(self.current_budget, half), 0
        if str(self.adapter.device).startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()
        for part in (slice(0, half), slice(half, rows)):
            yield from self._forward(forward.piece(part), run, sample_uid, planned_rows or rows)

    def _row_out_of_memory(
        self, forward: Forward, sample_uid: torch.Tensor, planned_rows: int | None, cause: str
    ) -> torch.OutOfMemoryError:
        """The error of a single row that ran out of memory: its sample, the rows tried, the budget and the cause."""
        uid = sorted(set(sample_uid[forward.rows].tolist()))
        auto = f" = {self.max_rows}" if self.row_budget == "auto" else ""
        return torch.OutOfMemoryError(
            f"out of memory forwarding a single row of sample uid(s) {uid} (split from a forward of "
            f"{planned_rows or len(forward.rows)} row(s); row_budget={self.row_budget}{auto}): {cause}"
        )

    def _succeeded(self) -> None:
        """Count a successful forward; a lowered budget doubles after ``regrow_after`` of them in a row."""
        if self.budget is None:
            return
        self.successes += 1
        if self.successes >= self.regrow_after:
            self.budget, self.successes = 2 * self.budget, 0
            if self.budget >= self.max_rows:
                self.budget = None
