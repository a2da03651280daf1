"""One lookahead of a round as a frozen record of its branches, advanced one level per call.

In the style of mctx's search over a frozen tree: :class:`Lookahead` holds every exploring
slot's ``K`` branches (canvases, their evaluations, scores, which branches are live and which
slots still roll, the depth reached), and the driver's ``advance`` returns the next record
instead of writing into this one. A finished record says which branch each slot adopts; the
driver hands every record to ``on_lookahead`` (traces, tests) as it goes.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.components.expansion import ExpansionPolicy
from dlmsearch.search.records.state import Canvas, Evaluation


@attrs.frozen
class Lookahead:
    """The branches of all exploring slots: row ``s * width + k`` is slot ``slots[s]``'s branch ``k``."""

    slots: torch.Tensor  # [S] the exploring slots
    width: int  # K, branches per slot
    branches: Canvas  # [S*K] each branch's canvas (depth commits applied)
    evaluation: Evaluation  # [S*K] each branch's latest evaluation (rows never evaluated are empty)
    scores: torch.Tensor  # [S*K] the scorer's value (summed over depths where the policy accumulates)
    step_log_conf: torch.Tensor  # [S*K] mean log-confidence of the tokens each branch committed last
    live: torch.Tensor  # [S, K] branches still in the running (the selector may prune)
    rolling: torch.Tensor  # [S] slots whose branches are rolled deeper
    restarted: torch.Tensor  # [S] slots whose selector asked for a fresh lookahead from the adopted state
    depth: int  # commits applied to the branches so far
    expansion: ExpansionPolicy  # bound to these slots (``for_roots``)
    calls: torch.Tensor  # [S] the model calls each slot's sample has made so far (traces)
    done: bool = False  # no slot rolls deeper: adopt

    @property
    def slot_row(self) -> torch.Tensor:
        """``[S*K]`` the slot of each branch row."""
        return self.slots.repeat_interleave(self.width)

    @property
    def branch_id(self) -> torch.Tensor:
        """``[S*K]`` the branch index of each row."""
        return torch.arange(self.width).repeat(len(self.slots))

    def rows(self) -> torch.Tensor:
        """Branch rows still rolling: live branches of rolling slots."""
        return (self.live & self.rolling[:, None]).flatten().nonzero().squeeze(1)

    def adopted(self, best: torch.Tensor) -> tuple[Canvas, Evaluation]:
        """The canvas and evaluation of branch ``best[s]`` of each slot."""
        chosen = torch.arange(len(self.slots)) * self.width + best
        return self.branches.take(chosen), self.evaluation.take(chosen)
