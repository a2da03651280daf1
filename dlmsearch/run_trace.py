"""What ``trace.jsonl`` holds per sample: the model calls that led to commits, and every level of
every lookahead, or every tree search's tree (a run's ``trace=true``)."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from dlmsearch.search.components.lookahead import Lookahead
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.records.slots import Slots
from dlmsearch.search.records.tree import SearchedTrees
from dlmsearch.tasks.base import Task


@attrs.define
class LookaheadLog:
    """Every level of every lookahead, per sample (by uid), for ``trace.jsonl``: the sample's model
    call, the particle, the depth reached, the live branches with their scores, and whether the
    branches roll on (``done``: the level at which a branch is adopted). A particle whose branches
    stopped rolling is not logged again at the deeper levels others in the decode roll on to, so
    a sample's log does not depend on what decodes beside it."""

    levels: dict[int, list[dict[str, Any]]] = attrs.field(factory=dict)
    lookahead: torch.Tensor | None = (
        None  # the exploring slots of the lookahead being logged: one tensor per lookahead, kept through its levels
    )
    stopped: set[tuple[int, int]] = attrs.field(factory=set)  # (uid, particle) whose branches stopped rolling in it

    def begin(self, uid: int) -> None:
        """A sample starts (again): its levels so far are dropped."""
        self.levels[uid] = []

    def __call__(self, look: Lookahead | SearchedTrees, slots: Slots) -> None:
        if isinstance(look, SearchedTrees):
            self._log_trees(look, slots)
            return
        if look.slots is not self.lookahead:
            self.lookahead, self.stopped = look.slots, set()
        calls = look.calls.tolist()
        scores = look.scores.view(len(look.slots), look.width).tolist()
        for s, slot in enumerate(look.slots.tolist()):
            key = (int(slots.uid[slot]), int(slots.particle[slot]))
            if key in self.stopped:
                continue
            live = look.live[s].tolist()
            rolling = bool(look.rolling[s]) and not look.done
            self.levels.setdefault(key[0], []).append(
                {
                    "call": calls[s],
                    "particle": key[1],
                    "depth": look.depth
                    if rolling or look.done
                    else look.depth - 1,  # the level it stopped at, not the one others roll on to
                    "live": [k for k, alive in enumerate(live) if alive],
                    "scores": [round(v, 5) for v, alive in zip(scores[s], live) if alive],
                    "rolling": rolling,
                    "restarted": bool(look.restarted[s]),
                }
            )
            if not rolling:
                self.stopped.add(key)

    def _log_trees(self, searched: SearchedTrees, slots: Slots) -> None:
        """A tree search: per sample, its call, its tree's nodes (parent, move, prior, visits, mean
        value, verdicts) and the node it committed."""
        for s, slot in enumerate(searched.slots.tolist()):
            self.levels.setdefault(int(slots.uid[slot]), []).append(
                {
                    "call": int(searched.calls[s]),
                    "particle": int(slots.particle[slot]),
                    "tree": searched.node_table(s),
                    "chosen": int(searched.chosen[s]),
                }
            )

    def take(self, uid: int) -> list[dict[str, Any]]:
        return self.levels.pop(uid, [])


def trace_events(result: DecodeResult, task: Task) -> list[dict[str, Any]]:
    """Per model call that led to commits: positions, tokens (ids and strings), confidences, depth and branch."""
    events = []
    for call in torch.unique(result.commit_call[result.commit_call >= 0]).tolist():
        at = (result.commit_call == call).nonzero().squeeze(1)
        events.append(
            {
                "call": call,
                "positions": at.tolist(),
                "tokens": result.tokens[at].tolist(),
                "strings": task.token_strings(result.tokens[at].tolist()),
                "confidences": [round(c, 5) for c in result.commit_confidence[at].tolist()],
                "depth": result.commit_depth[at].tolist(),
                "branch": result.commit_branch[at].tolist(),
            }
        )
    return events
