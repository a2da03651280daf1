"""Tree policies: the expansion policies of a Monte-Carlo tree search, which decide where each
simulation goes (selection) rather than whether a fixed lookahead rolls one level deeper.

They extend :class:`~dlmsearch.search.components.expansion.ExpansionPolicy` (a tree search's
depth is its simulations', so ``max_depth`` bounds nothing and ``should_continue`` is never
asked) with what the tree search asks of them (:class:`TreePolicy`): the root's set-up, each
wave's schedule of simulations, the choice of an action at an inner node, and what a wave's
results change at the root.

* :class:`PUCT` — AlphaZero's rule, ``Q(a) + c * P(a) * sqrt(sum_b N(b)) / (1 + N(a))``: every
  simulation of a wave selects from the root, kept apart by virtual loss.
* :class:`GumbelHalving` — mctx's ``gumbel_muzero_policy`` at the root (Danihelka et al., ICLR 2022):
  sample ``m`` root actions without replacement by Gumbel-top-k on the prior's logits, then
  sequential halving, each phase visiting every survivor equally and keeping the better half by
  ``g(a) + logit(a) + sigma(q(a))``, ``sigma(q) = (c_visit + max_b N(b)) * c_scale * q``; PUCT
  below the root. Policy improvement with few simulations: the regime a forward budget allows.

Ties (a shipped model's confidences are sharp, a tiny model's tie): the highest prior, then the
lowest action index (the generator's order: the most confident first).
"""

from __future__ import annotations

import math
from typing import ClassVar, Protocol

import attrs
import torch

from dlmsearch.search.components.expansion import DecidesFromScores, ExpansionPolicy
from dlmsearch.search.records.tree import Tree
from dlmsearch.validation import check_choice, number

FREE = -2  # a simulation whose root action the policy selects
NONE = -1  # no simulation in this place of the wave


def best_action(score: torch.Tensor, prior: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[R]`` the valid action with the highest score; ties to the highest prior, then the lowest index."""
    score = torch.where(valid, score, -math.inf)
    top = score.max(dim=1, keepdim=True).values
    tied = valid & (score == top)
    return torch.where(tied, prior, -math.inf).argmax(dim=1)


def puct_scores(
    tree: Tree, at: torch.Tensor, node: torch.Tensor, virtual: torch.Tensor, c: float, unvisited: str
) -> torch.Tensor:
    """``[R, A]`` PUCT scores of the actions of nodes ``node`` of trees ``at``, counting ``virtual``
    visits of value 0 (simulations of the same wave already on their way).

    Args:
        tree: the trees.
        at: ``[R]`` the tree of each node.
        node: ``[R]`` the nodes whose actions are scored.
        virtual: ``[S, N]`` the wave's pending visits per node.
        c: the exploration constant.
        unvisited: an unvisited child's value: ``parent`` (its parent's mean) or ``zero``.
    """
    visits = tree.child_stat((tree.visits + virtual).float(), at, node)
    value_sum = tree.child_stat(tree.value_sum, at, node)
    parent_q = tree.mean_value()[at, node] if unvisited == "parent" else torch.zeros(len(node))
    q = torch.where(visits > 0, value_sum / visits.clamp(min=1), parent_q[:, None])
    explore = tree.prior[at, node] * visits.sum(dim=1, keepdim=True).sqrt() / (1 + visits)
    return q + c * explore


class TreePolicy(ExpansionPolicy, Protocol):
    """An expansion policy that a tree search asks where simulations go."""

    draws: bool  # its start reads seeded draws per root action (None drawn for a policy that reads none)

    def start(self, tree: Tree, uniform: torch.Tensor) -> Tree:
        """The tree once its root is expanded; ``uniform`` ``[S, A]`` seeded draws per root action."""

    def schedule(self, tree: Tree, wave: int, allowance: torch.Tensor, simulations: int) -> torch.Tensor:
        """``[S, W]`` the root action each simulation of wave ``wave`` goes down (:data:`FREE`: the policy
        selects; :data:`NONE`: none), at most ``allowance`` ``[S]`` per tree and ``simulations`` per search."""

    def select(self, tree: Tree, at: torch.Tensor, node: torch.Tensor, virtual: torch.Tensor) -> torch.Tensor:
        """``[R]`` the action taken at nodes ``node`` of trees ``at`` (``virtual``: ``[S, N]`` the wave's pending visits)."""

    def after_wave(self, tree: Tree, wave: int) -> Tree:
        """The tree after a wave's backup (halving drops the weaker root actions)."""

    def root_score(self, tree: Tree) -> torch.Tensor:
        """``[S, A]`` the policy's own ranking of the root actions (the halving winner's score)."""


class _TreeDepth(DecidesFromScores):
    """What a tree policy answers as an :class:`ExpansionPolicy`: no fixed depth (its simulations'), no accumulation."""

    max_depth: ClassVar[int] = 1
    accumulate: ClassVar[bool] = False

    def should_continue(self, scores: torch.Tensor, live: torch.Tensor, depth: int) -> torch.Tensor:
        return torch.zeros(scores.shape[0], dtype=torch.bool)


@attrs.define
class PUCT(_TreeDepth):
    """AlphaZero's selection (module doc). ``c`` the exploration constant (McDiffuSE: larger
    constants matter more than more simulations); ``parallel`` simulations per tree per wave (one
    batched forward), kept apart by virtual loss; ``unvisited``: an unvisited child's value, its
    parent's mean (``parent``, the first-play value of Leela-style searches) or ``zero``."""

    c: float = number(float, 0.0, default=1.25)
    parallel: int = number(int, 1, default=4)
    unvisited: str = attrs.field(default="parent", validator=check_choice("parent", "zero"))
    draws: ClassVar[bool] = False

    def start(self, tree: Tree, uniform: torch.Tensor) -> Tree:
        return tree

    def schedule(self, tree: Tree, wave: int, allowance: torch.Tensor, simulations: int) -> torch.Tensor:
        width = min(self.parallel, simulations)
        places = torch.arange(width)[None, :]
        return torch.where(places < allowance[:, None], FREE, NONE)

    def select(self, tree: Tree, at: torch.Tensor, node: torch.Tensor, virtual: torch.Tensor) -> torch.Tensor:
        scores = puct_scores(tree, at, node, virtual, self.c, self.unvisited)
        return best_action(scores, tree.prior[at, node], tree.valid[at, node])

    def after_wave(self, tree: Tree, wave: int) -> Tree:
        return tree

    def root_score(self, tree: Tree) -> torch.Tensor:
        roots = torch.arange(tree.trees)
        return tree.child_stat(tree.visits.float(), roots, torch.zeros_like(roots))


@attrs.define
class GumbelHalving(_TreeDepth):
    """Gumbel top-``considered`` and sequential halving at the root, PUCT (``c``) below it (module doc);
    ``c_visit`` and ``c_scale`` are mctx's ``qtransform_completed_by_mix_value`` defaults."""

    considered: int = number(int, 1, default=4)
    c_visit: float = number(float, 0.0, default=50.0)
    c_scale: float = number(float, 0.0, default=0.1)
    c: float = number(float, 0.0, default=1.25)
    draws: ClassVar[bool] = True

    def start(self, tree: Tree, uniform: torch.Tensor) -> Tree:
        """Draw ``g = -log(-log u)`` per root action and consider the top ``considered`` by ``g + logit``."""
        valid = tree.valid[:, 0]
        gumbel = -torch.log(-torch.log(uniform.clamp(1e-12, 1 - 1e-12)))
        ranked = torch.where(valid, gumbel + self._logits(tree), -math.inf)
        order = torch.sort(ranked, dim=1, descending=True, stable=True).indices[:, : self.considered]
        considered = torch.zeros_like(valid).scatter(1, order, True) & valid
        return attrs.evolve(tree, gumbel=torch.where(valid, gumbel, 0.0), considered=considered)

    def phases(self, tree: Tree) -> torch.Tensor:
        """``[S]`` the halving's phases: ``ceil(log2(m))`` for the ``m`` root actions first considered
        (``considered``, or fewer where fewer are valid), at least one."""
        first = tree.valid[:, 0].sum(dim=1).clamp(min=2, max=max(self.considered, 2)).double()
        return torch.ceil(torch.log2(first)).long().clamp(min=1)

    def schedule(self, tree: Tree, wave: int, allowance: torch.Tensor, simulations: int) -> torch.Tensor:
        """Phase ``wave``: each surviving root action visited ``max(1, n // (phases * survivors))`` times."""
        survivors = tree.considered.sum(dim=1)
        phases = self.phases(tree)
        each = (simulations // (phases * survivors.clamp(min=1))).clamp(min=1)
        each = torch.where((survivors > 1) & (wave < phases), each, 0)  # past its phases, or down to one: done
        width = max(1, int((each * survivors).max()))
        action = torch.sort(
            torch.where(tree.considered, torch.arange(tree.actions)[None, :], tree.actions), dim=1
        ).values  # the survivors' indices first
        place = torch.arange(width)[None, :]
        slot = (place // each.clamp(min=1)[:, None]).clamp(max=tree.actions - 1)
        scheduled = action.gather(1, slot)
        keep = (place < (each * survivors)[:, None]) & (place < allowance[:, None])
        return torch.where(keep, scheduled, NONE)

    def select(self, tree: Tree, at: torch.Tensor, node: torch.Tensor, virtual: torch.Tensor) -> torch.Tensor:
        scores = puct_scores(tree, at, node, virtual, self.c, "parent")
        return best_action(scores, tree.prior[at, node], tree.valid[at, node])

    def after_wave(self, tree: Tree, wave: int) -> Tree:
        """Keep the better half (rounded up) of the surviving root actions."""
        survivors = tree.considered.sum(dim=1)
        keep = (survivors + 1) // 2
        ranked = torch.where(tree.considered, self.root_score(tree), -math.inf)
        order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(tree.actions).expand_as(order))
        return attrs.evolve(tree, considered=tree.considered & (rank < keep[:, None]))

    def root_score(self, tree: Tree) -> torch.Tensor:
        """``g + logit + sigma(q)`` per root action (``q`` the child's mean value, 0 unvisited)."""
        roots = torch.arange(tree.trees)
        root = torch.zeros_like(roots)
        visits = tree.child_stat(tree.visits.float(), roots, root)
        q = tree.child_stat(tree.mean_value(), roots, root)
        sigma = (self.c_visit + visits.max(dim=1, keepdim=True).values) * self.c_scale * q
        return tree.gumbel + self._logits(tree) + sigma

    @staticmethod
    def _logits(tree: Tree) -> torch.Tensor:
        return torch.log(tree.prior[:, 0].clamp(min=1e-30))
