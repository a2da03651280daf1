"""Tree selectors: which root action a tree search commits once its simulations are spent.

They are :class:`~dlmsearch.search.components.selectors.Selector` s (as a lookahead's, ETE's
:class:`~dlmsearch.search.components.selectors.BestScoreSelector`) with what a tree search asks beside it:
``child(tree, policy)``, the root action to commit, and whether to commit a verified completion
instead (:class:`VerifiedLeaf`). Ties: the highest prior, then the lowest action index.
"""

from __future__ import annotations

import math

import attrs
import torch

from dlmsearch.search.components.selectors import BestScoreSelector
from dlmsearch.search.components.tree_policies import TreePolicy, best_action
from dlmsearch.search.records.tree import Tree


def _root(tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
    roots = torch.arange(tree.trees)
    return roots, torch.zeros_like(roots)


def _expanded_children(tree: Tree) -> torch.Tensor:
    """``[S, A]`` root actions whose child exists."""
    return tree.children[:, 0] >= 0


@attrs.define
class MostVisited(BestScoreSelector):
    """The root action visited most (AlphaZero's play): robust to a lucky value."""

    def child(self, tree: Tree, policy: TreePolicy) -> tuple[torch.Tensor, torch.Tensor]:
        """``[S]`` the root action to commit, and ``[S]`` whether a verified completion replaces it (never here)."""
        roots, root = _root(tree)
        visits = tree.child_stat(tree.visits.float(), roots, root)
        action = best_action(visits, tree.prior[:, 0], _expanded_children(tree))
        return action, torch.zeros(tree.trees, dtype=torch.bool)


@attrs.define
class HighestMean(BestScoreSelector):
    """The root action with the highest mean value."""

    def child(self, tree: Tree, policy: TreePolicy) -> tuple[torch.Tensor, torch.Tensor]:
        roots, root = _root(tree)
        mean = tree.child_stat(tree.mean_value(), roots, root)
        action = best_action(mean, tree.prior[:, 0], _expanded_children(tree))
        return action, torch.zeros(tree.trees, dtype=torch.bool)


@attrs.define
class PolicyChoice(BestScoreSelector):
    """The policy's own ranking of the root actions (Gumbel halving's winner: ``g + logit + sigma(q)``),
    among the actions still in the running where the policy keeps some (halving: a dropped action's
    one lucky visit must not outrank the survivors, as in mctx's choice among the most visited)."""

    def child(self, tree: Tree, policy: TreePolicy) -> tuple[torch.Tensor, torch.Tensor]:
        expanded = _expanded_children(tree)
        running = expanded & tree.considered
        allowed = torch.where(running.any(dim=1, keepdim=True), running, expanded)
        action = best_action(policy.root_score(tree), tree.prior[:, 0], allowed)
        return action, torch.zeros(tree.trees, dtype=torch.bool)


@attrs.define
class VerifiedLeaf(BestScoreSelector):
    """Where some leaf's completion passed the task's verifier, commit that completion itself (the
    search has found an answer); elsewhere the most visited root action."""

    def child(self, tree: Tree, policy: TreePolicy) -> tuple[torch.Tensor, torch.Tensor]:
        action, _ = MostVisited().child(tree, policy)
        return action, tree.accepted.any(dim=1)

    @staticmethod
    def verified_node(tree: Tree) -> torch.Tensor:
        """``[S]`` the accepted node with the highest value (the first on ties; 0 where none)."""
        return torch.where(tree.accepted, tree.value, -math.inf).argmax(dim=1)
