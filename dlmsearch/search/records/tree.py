"""The search tree of a round's Monte-Carlo tree search, one per exploring slot, as a frozen record.

mctx's shape (``google-deepmind/mctx``, ``Tree``): preallocated arrays over ``[trees, nodes]``
and ``[trees, nodes, actions]``, batched over problems, so that selection, expansion and
backup are whole-array operations and every method returns a new record. Node 0 is the root (the
slot's canvas); a node is the canvas of its parent with one more move, held as that move's *commit
record* (the parent's action: a position, a token and the model's probability of it), never as a
copy of the canvas (:meth:`edges` gives a node's path from the root, which rebuilds it). Each
expanded node keeps the model's evaluation of its canvas, so no node is evaluated twice.

A move commits one position, or, for a generator of macro moves (UnMaskFork, arXiv 2602.04344:
a move is a rule's step of several commits), up to ``K``: the per-action commit fields then carry
a last axis ``[S, N, A, K]``, a position UNSET where the move makes fewer than ``K`` commits. For
one commit per move that axis is left out (``[S, N, A]``), so such trees read as before. A node's
``depth`` counts moves, whatever each commits.

Every field leads with the tree dimension, so the row helpers take, put and join trees as they
do canvases (``take`` on the exploring slots, ``joined`` for trees of samples admitted later).
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.search.records.rows import cat_rows, map_rows, put_rows, take_rows
from dlmsearch.search.records.state import Evaluation

UNSET = -1  # a parent, an action or a child that does not exist (yet)


@attrs.frozen(eq=False)
class Tree:
    """``S`` trees of at most ``N`` nodes with ``A`` actions each (see the module doc)."""

    parent: torch.Tensor  # [S, N] long: the parent node (UNSET: the root, or a node not allocated)
    action: torch.Tensor  # [S, N] long: the parent's action that leads here (UNSET: the root)
    depth: torch.Tensor  # [S, N] long: moves from the root (each one commit, or a macro move's several)
    visits: torch.Tensor  # [S, N] long: simulations backed up through the node
    value_sum: torch.Tensor  # [S, N] float: the sum of their leaf values
    expanded: torch.Tensor  # [S, N] bool: evaluated, its actions known
    terminal: torch.Tensor  # [S, N] bool: nothing left to decide, or its partial canvas breaks the task's rules
    value: torch.Tensor  # [S, N] float: the leaf value found when the node was expanded
    accepted: torch.Tensor  # [S, N] bool: the node's completion passes the task's verifier
    completion: torch.Tensor  # [S, N, T] long: the completion the node's value read (a verified leaf commits it)
    position: torch.Tensor  # [S, N, A(, K)] long: each action's position (a macro move's K; UNSET: none made)
    token: torch.Tensor  # [S, N, A(, K)] long: the token it commits there
    probability: torch.Tensor  # [S, N, A(, K)] float: the model's probability of it (recorded as its confidence)
    prior: torch.Tensor  # [S, N, A] float: the selection's prior (sums to 1 over the valid actions)
    valid: torch.Tensor  # [S, N, A] bool: the action exists (fewer eligible positions than actions)
    children: torch.Tensor  # [S, N, A] long: the child node of each action (UNSET: not expanded)
    count: torch.Tensor  # [S] long: nodes allocated
    evaluation: Evaluation  # [S, N, T] the model's evaluation of each expanded node's canvas
    considered: torch.Tensor  # [S, A] bool: root actions still in the running (sequential halving)
    gumbel: torch.Tensor  # [S, A] float: the root actions' Gumbel noise (zero where no policy draws it)

    @classmethod
    def empty(cls, trees: int, nodes: int, actions: int, evaluation: Evaluation, commits: int | None = None) -> Tree:
        """``trees`` trees with room for ``nodes`` nodes each; ``evaluation`` ``[trees, T]`` gives the
        shape (and the statistics) of the per-node evaluations; ``commits``: the most a macro move
        makes (``K``; None: one commit per move, the commit fields ``[S, N, A]``)."""
        unset = torch.full((trees, nodes), UNSET, dtype=torch.long)
        flags = torch.zeros(trees, nodes, dtype=torch.bool)
        per_action = torch.zeros(trees, nodes, actions)
        per_commit = per_action if commits is None else torch.zeros(trees, nodes, actions, commits)
        return cls(
            parent=unset,
            action=unset,
            depth=torch.zeros(trees, nodes, dtype=torch.long),
            visits=torch.zeros(trees, nodes, dtype=torch.long),
            value_sum=torch.zeros(trees, nodes),
            expanded=flags,
            terminal=flags,
            value=torch.zeros(trees, nodes),
            accepted=flags,
            completion=torch.zeros(trees, nodes, evaluation.token.shape[1], dtype=torch.long),
            position=per_commit.long(),
            token=per_commit.long(),
            probability=per_commit,
            prior=per_action,
            valid=per_action.bool(),
            children=torch.full((trees, nodes, actions), UNSET, dtype=torch.long),
            count=torch.ones(trees, dtype=torch.long),  # the root
            evaluation=map_rows(evaluation, lambda t: torch.zeros_like(t)[:, None].expand(-1, nodes, -1).clone()),
            considered=torch.zeros(trees, actions, dtype=torch.bool),
            gumbel=torch.zeros(trees, actions),
        )

    @classmethod
    def none_like(cls, like: Tree, trees: int) -> Tree:
        """``trees`` trees shaped like ``like``'s that hold nothing (``count`` 0: no tree kept)."""
        template = map_rows(like.evaluation, lambda t: t[:1, 0].expand(trees, *t.shape[2:]))
        empty = cls.empty(trees, like.nodes, like.actions, template, like.commits if like.macro else None)
        return attrs.evolve(empty, count=torch.zeros(trees, dtype=torch.long))

    @property
    def trees(self) -> int:
        return self.parent.shape[0]

    @property
    def nodes(self) -> int:
        return self.parent.shape[1]

    @property
    def actions(self) -> int:
        return self.position.shape[2]

    @property
    def macro(self) -> bool:
        """Its moves are macro moves: the commit fields carry a last axis of ``K`` commits."""
        return self.position.dim() == 4

    @property
    def commits(self) -> int:
        """``K``: the most commits one move makes (1 where each move makes one)."""
        return self.position.shape[3] if self.macro else 1

    def take(self, index: torch.Tensor) -> Tree:
        """The trees at ``index`` (a long index or a bool mask)."""
        return attrs.evolve(take_rows(self._bare(), index), evaluation=self.evaluation.take(index))

    def put(self, index: torch.Tensor, other: Tree) -> Tree:
        """A copy with the trees at ``index`` replaced by ``other``."""
        evaluation = self.evaluation.put(index, other.evaluation)
        return attrs.evolve(put_rows(self._bare(), index, other._bare()), evaluation=evaluation)

    def joined(self, other: Tree) -> Tree:
        """``other``'s trees after these (samples admitted to a decode)."""
        evaluation = cat_rows(self.evaluation, other.evaluation)
        return attrs.evolve(cat_rows(self._bare(), other._bare()), evaluation=evaluation)

    def _bare(self) -> Tree:
        """The tree without its evaluations (a record of its own, which the row helpers do not index)."""
        return attrs.evolve(self, evaluation=None)

    def node_evaluation(self, tree: torch.Tensor, node: torch.Tensor) -> Evaluation:
        """``[R]`` the stored evaluations of nodes ``node`` of trees ``tree``."""
        return map_rows(self.evaluation, lambda t: t[tree, node])

    def mean_value(self) -> torch.Tensor:
        """``[S, N]`` each node's mean backed-up value (0 where never visited)."""
        return self.value_sum / self.visits.clamp(min=1)

    def child_stat(self, values: torch.Tensor, tree: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
        """``[R, A]`` a per-node statistic (``[S, N]``) read at each action's child of nodes ``node``
        of trees ``tree`` (0 where the child does not exist)."""
        children = self.children[tree, node]
        read = values[tree[:, None], children.clamp(min=0)]
        return torch.where(children >= 0, read, torch.zeros_like(read))

    def edges(self, tree: torch.Tensor, node: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The path from the root to each of nodes ``node`` of trees ``tree``, root first: per move
        ``[R, D]`` the position, token and probability committed (``[R, D, K]`` for macro moves;
        position UNSET past a path's end, and where a move makes fewer than ``K`` commits; ``D`` the
        deepest path's length): each move's node is read off :meth:`path`, the move off its parent."""
        depth = self.depth[tree, node]
        step = torch.arange(int(depth.max()) if len(node) else 0)[None, :]
        on = step < depth[:, None]
        reached = self.path(tree, node).gather(1, (depth[:, None] - 1 - step).clamp(min=0))  # step k's node
        at = tree[:, None]
        parent, action = self.parent[at, reached].clamp(min=0), self.action[at, reached].clamp(min=0)
        on = on[..., None] if self.macro else on
        return (
            torch.where(on, self.position[at, parent, action], UNSET),
            torch.where(on, self.token[at, parent, action], 0),
            torch.where(on, self.probability[at, parent, action], 0.0),
        )

    def path(self, tree: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
        """``[R, D + 1]`` the nodes from each of nodes ``node`` up to the root (UNSET past the root)."""
        deepest = int(self.depth[tree, node].max()) if len(node) else 0
        path = torch.full((len(node), deepest + 1), UNSET, dtype=torch.long)
        current = node.clone()
        for step in range(deepest + 1):
            path[:, step] = current
            current = torch.where(current > 0, self.parent[tree, current.clamp(min=0)], UNSET)
        return path

    def backed_up(self, tree: torch.Tensor, leaf: torch.Tensor, value: torch.Tensor) -> Tree:
        """Each simulation's leaf value added along its path (every node from the leaf to the root
        gains one visit and the value): ``tree``, ``leaf`` and ``value`` ``[R]``, one per simulation."""
        path = self.path(tree, leaf)
        on = path >= 0
        flat = (tree[:, None] * self.nodes + path.clamp(min=0))[on]
        gained = value[:, None].expand_as(path)[on]
        visits = self.visits.flatten().index_add(0, flat, torch.ones_like(flat)).view_as(self.visits)
        value_sum = self.value_sum.flatten().index_add(0, flat, gained.to(self.value_sum.dtype)).view_as(self.value_sum)
        return attrs.evolve(self, visits=visits, value_sum=value_sum)

    def rerooted(self, child: torch.Tensor) -> Tree:
        """Each tree's subtree under node ``child`` ``[S]`` as a tree of its own, ``child`` its root
        (node 0): what the next search starts from once the search committed that child. Nodes keep
        their order (a parent before its children), their statistics and their evaluations; the rest
        are dropped. A tree whose ``child`` is UNSET (or 0 nodes) keeps nothing (``count`` 0)."""
        trees, nodes = self.parent.shape
        inside = torch.zeros(trees, nodes, dtype=torch.bool)
        has = child >= 0
        inside[has.nonzero().squeeze(1), child[has]] = True
        for node in range(1, nodes):  # parents come first: one pass in node order
            parent = self.parent[:, node]
            inside[:, node] |= (parent >= 0) & inside[torch.arange(trees), parent.clamp(min=0)]
        inside &= torch.arange(nodes)[None, :] < self.count[:, None]
        renumber = torch.where(inside, inside.long().cumsum(dim=1) - 1, UNSET)  # old node -> new node
        order = torch.sort(torch.where(inside, torch.arange(nodes)[None, :], nodes), dim=1, stable=True).indices
        kept = inside.gather(1, order)  # [S, N] new node n holds old node order[n]

        def moved(values: torch.Tensor, empty: float | bool) -> torch.Tensor:
            index = order.view(trees, nodes, *([1] * (values.dim() - 2))).expand(trees, nodes, *values.shape[2:])
            gathered = values.gather(1, index)
            shape = (trees, nodes, *([1] * (values.dim() - 2)))
            return torch.where(kept.view(shape), gathered, torch.as_tensor(empty, dtype=values.dtype))

        def renumbered(values: torch.Tensor) -> torch.Tensor:
            flat = renumber.gather(1, values.clamp(min=0).flatten(1)).view_as(values)
            return torch.where(values >= 0, flat, UNSET)

        parent = renumbered(moved(self.parent, UNSET))
        root = torch.zeros(trees, nodes, dtype=torch.bool)
        root[:, 0] = True
        depth = moved(self.depth, 0) - torch.where(has, self.depth[torch.arange(trees), child.clamp(min=0)], 0)[:, None]
        return attrs.evolve(
            self,
            parent=torch.where(root, UNSET, parent),
            action=torch.where(root, UNSET, moved(self.action, UNSET)),
            depth=depth.clamp(min=0),
            visits=moved(self.visits, 0),
            value_sum=moved(self.value_sum, 0.0),
            expanded=moved(self.expanded, False),
            terminal=moved(self.terminal, False),
            value=moved(self.value, 0.0),
            accepted=moved(self.accepted, False),
            completion=moved(self.completion, 0),
            position=moved(self.position, 0),
            token=moved(self.token, 0),
            probability=moved(self.probability, 0.0),
            prior=moved(self.prior, 0.0),
            valid=moved(self.valid, False),
            children=renumbered(moved(self.children, UNSET)),
            count=inside.sum(dim=1),
            evaluation=map_rows(self.evaluation, lambda t: moved(t, 0)),
            considered=torch.zeros_like(self.considered),
            gumbel=torch.zeros_like(self.gumbel),
        )

    def with_room(self, nodes: int) -> Tree:
        """The trees with room for at least ``nodes`` nodes each (new nodes unallocated)."""
        extra = nodes - self.nodes
        if extra <= 0:
            return self

        def grown(values: torch.Tensor, fill: float | bool) -> torch.Tensor:
            pad = torch.full((self.trees, extra, *values.shape[2:]), fill, dtype=values.dtype)
            return torch.cat([values, pad], dim=1)

        fills = {"parent": UNSET, "action": UNSET, "children": UNSET}
        values = {
            f.name: grown(getattr(self, f.name), fills.get(f.name, 0))
            for f in attrs.fields(Tree)
            if f.name not in ("count", "evaluation", "considered", "gumbel")
        }
        return attrs.evolve(self, **values, evaluation=map_rows(self.evaluation, lambda t: grown(t, 0)))

    def widened(self, columns: int, mask_id: int, right: int = 0) -> Tree:
        """The trees of canvases padded by ``columns`` on the left (a wider prompt joined the decode:
        positions shift) and ``right`` on the right (a length policy grew the canvas): evaluations gain
        the columns (the mask's id as their token, zeros elsewhere)."""
        if columns == 0 and right == 0:
            return self

        def padded(name: str, values: torch.Tensor) -> torch.Tensor:
            fill = mask_id if name in ("token", "completion") else 0
            left_pad = torch.full((*values.shape[:2], columns), fill, dtype=values.dtype)
            right_pad = torch.full((*values.shape[:2], right), fill, dtype=values.dtype)
            return torch.cat([left_pad, values, right_pad], dim=2)

        evaluation = type(self.evaluation)(
            **{
                f.name: None
                if getattr(self.evaluation, f.name) is None
                else padded(f.name, getattr(self.evaluation, f.name))
                for f in attrs.fields(type(self.evaluation))
            }
        )
        position = torch.where(self.position >= 0, self.position + columns, self.position)  # UNSET: no commit
        return attrs.evolve(
            self, position=position, evaluation=evaluation, completion=padded("completion", self.completion)
        )


def move_probability(position: torch.Tensor, probability: torch.Tensor) -> torch.Tensor:
    """``[R, A]`` the model's probability of each move: its commit's (``[R, A]``), or for macro moves
    (``[R, A, K]``) the geometric mean over the commits it makes, so that moves of different sizes
    compare per commit (the likelihood value's measure); 0 for a move that makes none."""
    if probability.dim() == 2:
        return probability
    made = position >= 0
    logs = torch.where(made, torch.log(probability.clamp(min=1e-30)), 0.0).sum(dim=2)
    count = made.sum(dim=2)
    return torch.where(count > 0, torch.exp(logs / count.clamp(min=1)), 0.0)


@attrs.frozen(eq=False)
class SearchedTrees:
    """One round's finished searches, as the loop's ``on_lookahead`` sees them (traces, tests)."""

    slots: torch.Tensor  # [S] the searching slots
    calls: torch.Tensor  # [S] the model calls each slot's sample had made when its search ended
    tree: Tree  # [S] the trees, before the chosen child's subtree is kept
    chosen: torch.Tensor  # [S] the node committed (0: the root was kept; the verified leaf where one was)

    def node_table(self, s: int) -> dict[str, list]:
        """Tree ``s`` as lists over its nodes (what a trace stores and a figure draws)."""
        tree, count = self.tree, int(self.tree.count[s])
        parent, action = tree.parent[s, :count], tree.action[s, :count]
        through = action.clamp(min=0)
        parents = parent.clamp(min=0)
        position, token = tree.position[s, parents, through], tree.token[s, parents, through]
        if tree.macro:  # a macro move: its commits, as lists
            made = position >= 0
            position, token = (
                [v[m].tolist() if p >= 0 else -1 for v, m, p in zip(values, made, parent.tolist())]
                for values in (position, token)
            )
        else:
            position, token = (torch.where(parent >= 0, v, -1).tolist() for v in (position, token))
        return {
            "parent": parent.tolist(),
            "position": position,
            "token": token,
            "prior": [round(v, 5) for v in torch.where(parent >= 0, tree.prior[s, parents, through], 1.0).tolist()],
            "visits": tree.visits[s, :count].tolist(),
            "value": [round(v, 5) for v in tree.mean_value()[s, :count].tolist()],
            "accepted": tree.accepted[s, :count].tolist(),
            "terminal": tree.terminal[s, :count].tolist(),
        }
