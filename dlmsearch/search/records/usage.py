"""What each sample has spent: sequential model calls and the compute behind them.

``steps`` counts the model calls a sample took part in (every row of one call counts once per
sample: the latency a user waits for), ``row_forwards`` the rows forwarded for it (a lookahead's
branches, a population's particles, a guided row's unconditional copy), ``token_forwards`` the
canvas positions the model computed for it (what a cache saves). A decode keeps one record per
sample and charges each engine call's cost to it; nothing is written in place.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.records.rows import cat_rows, take_rows


@attrs.frozen(eq=False)
class CallCost:
    """What one engine call computed, per row it was given (0 for a row that shared another's forward)."""

    rows: torch.Tensor  # [R] long
    tokens: torch.Tensor  # [R] long
    # [R] long: sequential model calls the row took (None: one; the block cache's separate write: two)
    calls: torch.Tensor | None = None

    def after(self, at: torch.Tensor, first: CallCost) -> CallCost:
        """This call's cost where rows ``at`` first took a forward of their own (``first``, the
        block cache's separate write): its rows and tokens added, one more sequential call each."""
        calls = torch.ones_like(self.rows) if self.calls is None else self.calls
        return CallCost(
            rows=self.rows.index_add(0, at, first.rows),
            tokens=self.tokens.index_add(0, at, first.tokens),
            calls=calls.index_add(0, at, torch.ones_like(at)),
        )


@attrs.frozen(eq=False)
class Usage:
    """Per sample ``[samples]``: model calls, row-forwards and token-forwards so far, and of the
    calls those that only wrote a cache (``writes``: the block cache's separate write, a uniform-noise
    model's encoder call), so that ``steps - writes`` counts the denoising (decoder) forwards."""

    steps: torch.Tensor
    row_forwards: torch.Tensor
    token_forwards: torch.Tensor
    writes: torch.Tensor

    @classmethod
    def zeros(cls, samples: int) -> Usage:
        return cls(*(torch.zeros(samples, dtype=torch.long) for _ in range(4)))

    def charge(self, owner: torch.Tensor, cost: CallCost) -> Usage:
        """After one engine call of rows owned by samples ``owner [R]``: one more step for each of them
        (more where a row took several sequential model calls: the most of its rows), and the rows' cost."""
        calls = torch.ones_like(owner) if cost.calls is None else cost.calls
        steps = self.steps.scatter_reduce(0, owner, self.steps.index_select(0, owner) + calls, "amax")
        writes = self.writes.scatter_reduce(0, owner, self.writes.index_select(0, owner) + calls - 1, "amax")
        return Usage(
            steps,
            self.row_forwards.index_add(0, owner, cost.rows),
            self.token_forwards.index_add(0, owner, cost.tokens),
            writes,
        )

    def take(self, index: torch.Tensor) -> Usage:
        return take_rows(self, index)

    def joined(self, other: Usage) -> Usage:
        return cat_rows(self, other)
