"""Forward planning: one engine call's rows cut into the forwards that run (chunks of at most the
row budget, each full or against the cache as the policy decides), the columns each summarises,
and which rows repeat another of their group (forwarded once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs
import torch

from dlmsearch.search.engine.cache_policy import CachePolicy, NoCache, RowWindows
from dlmsearch.search.engine.call_records import CallRows, CallSettings, Forward
from dlmsearch.search.records.randomness import is_root


def merged(tokens: torch.Tensor, group: torch.Tensor) -> torch.Tensor | None:
    """For every row, the first row of its group with the same tokens (None when no row repeats another)."""
    rows = len(tokens)
    if rows < 2:
        return None
    _, inverse = torch.unique(torch.cat([group[:, None], tokens], dim=1), dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), rows, dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(rows), "amin"
    )
    copy_of = first[inverse]
    return None if bool((copy_of == torch.arange(rows)).all()) else copy_of


def within(index: torch.Tensor, copy_of: torch.Tensor | None) -> torch.Tensor:
    """For a forward's rows ``index`` (ascending): the position of the row each one copies, or
    its own where its original is not among them (a piece split off after running out of memory)."""
    own = torch.arange(len(index))
    if copy_of is None:
        return own
    original = copy_of[index]
    position = torch.searchsorted(index, original).clamp(max=len(index) - 1)
    return torch.where(index[position] == original, position, own)


def span(forward: Forward, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The canvas columns a forward summarises per row ``[rows, columns]`` (a cached row's own
    window, left-aligned and clamped to the canvas; else the forward's columns), and which of
    them are real tokens of that row's window (only those are written)."""
    width = attention.shape[1]
    if forward.cached:
        low, high = forward.query[:, 0] if forward.logits_from is None else forward.logits_from, forward.query[:, 1]
        column = low[:, None] + torch.arange(int((high - low).max()))[None, :]
        inside = column.clamp(max=width - 1)
        return inside, attention.gather(1, inside) & (column < high[:, None])
    low, high = forward.columns
    return torch.arange(low, high).expand(len(forward.rows), -1), attention[:, low:high].bool()


def chunks(index: torch.Tensor, copy_of: torch.Tensor | None, budget: int) -> Iterator[torch.Tensor]:
    """Rows ``index`` in chunks of at most ``budget`` distinct rows; rows that repeat another
    (``copy_of``) ride in their original's chunk, so merging never depends on chunking."""
    if copy_of is None:
        for i in range(0, len(index), budget):
            yield index[i : i + budget]
        return
    original = copy_of[index]
    distinct = torch.unique(original)
    for i in range(0, len(distinct), budget):
        yield index[torch.isin(original, distinct[i : i + budget])]


@attrs.frozen
class ForwardPlanner:
    """What planning reads of the engine: its cache policy, whether the model honours a padding
    mask, the row budget now, and how to allocate an exact store (the model's empty keys and values)."""

    policy: CachePolicy
    honours_padding: bool
    budget: int
    empty_kv: Callable[[int, int], list]

    def forwards(self, rows: CallRows, settings: CallSettings, copy_of: torch.Tensor | None = None) -> list[Forward]:
        """The forwards of one call: row chunks of at most ``budget`` rows.

        Columns that are padding in every row of a chunk are dropped, so a row costs the same
        alone or batched. A model that ignores the padding mask gets only rows of one prompt
        length per chunk, hence no padding at all: its results cannot depend on the batch.
        The cache policy names the rows that run against their slot's stores (forwarded
        together, each row its own columns) and, among the others (a full forward), those whose
        keys and values refresh their slot's storage. Rows that repeat another row (``copy_of``)
        travel with it.
        """
        window, from_column, storage = rows.window, settings.from_column, settings.memory.kv
        count, width = rows.attention.shape
        first = rows.attention.long().argmax(dim=1)  # first real column of each row
        if (
            self.policy.layerwise and window is not None
        ):  # one forward of every row, each layer recomputing what the policy selects
            query = torch.stack(window, dim=1)
            no_refresh = torch.zeros(count, dtype=torch.bool)
            return [
                Forward(part, 0, (from_column, width), True, no_refresh[part], query[part], layerwise=True)
                for part in chunks(torch.arange(count), None, self.budget)
            ]
        policy = self.policy if window is not None else NoCache()
        if policy.exact and not storage.layers:  # filled in place by cached forwards alone
            storage.allocate(self.empty_kv(len(storage.window_of), width))
        query = (
            policy.columns(RowWindows(*window, width, first, storage, rows.slot))
            if window is not None
            else torch.zeros(count, 2, dtype=torch.long)
        )
        hit = policy.hits(storage, rows.slot, query)
        refreshes = policy.refreshes(hit, is_root(rows.row_key))
        groups: list[tuple[torch.Tensor, bool]] = []
        full = (~hit).nonzero().squeeze(1)
        if self.honours_padding:
            groups.append((full, False))
        else:
            groups += [(full[first[full] == f], False) for f in torch.unique(first[full]).tolist()]
        if bool(hit.any()):  # one forward for every cached row, whatever its window
            groups.append((hit.nonzero().squeeze(1), True))
        return [
            forward
            for index, cached in groups
            for forward in self._pieces(
                index, cached, policy, copy_of, first, query, refreshes, window, from_column, width
            )
        ]

    def _pieces(
        self,
        index: torch.Tensor,
        cached: bool,
        policy: CachePolicy,
        copy_of: torch.Tensor | None,
        first: torch.Tensor,
        query: torch.Tensor,
        refreshes: torch.Tensor,
        window: tuple[torch.Tensor, torch.Tensor] | None,
        from_column: int,
        width: int,
    ) -> Iterator[Forward]:
        """One group's forwards (full, or every cached row), chunked to the budget.

        Args:
            index: the group's rows.
            cached: whether they run against their slots' stores.
            policy: the cache policy (none where the rows have no windows).
            copy_of: ``[rows]`` the row each one repeats (None: none repeats another).
            first: ``[rows]`` each row's first real column.
            query: ``[rows, 2]`` the columns a cached row computes.
            refreshes: ``[rows]`` the rows that refresh their slot's storage.
            window: the rows' windows (first and end column), or None.
            from_column: the generation region's first column.
            width: the canvas's width.
        """
        for part in chunks(index, None if cached else copy_of, self.budget):
            refresh = refreshes[part]
            distinct = None if cached or copy_of is None else len(torch.unique(copy_of[part]))
            start = 0 if cached else int(first[part].min())  # a cached row reads its whole canvas from the cache
            settled = policy.settled(window[0][part], query[part]) if cached and bool(refresh.any()) else None
            # an exact store: the columns before the window are forwarded only to be written (no logits)
            logits_from = (
                torch.minimum(torch.maximum(query[part, 0], window[0][part]), query[part, 1])
                if cached and policy.exact
                else None
            )
            yield Forward(
                part, start, (from_column, width), cached, refresh, query[part], distinct, settled, logits_from
            )
