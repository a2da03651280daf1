"""The search tree as a frozen record (issue 49): its empty shapes, take/put/join on the tree dimension as
the population records do (admit, evict), and the arithmetic of a hand-built three-level tree: the
path and commits from the root to a node, a child's statistics, and the backup of leaf values."""

from __future__ import annotations

import attrs
import pytest
import torch

from dlmsearch.search.records.state import Evaluation
from dlmsearch.search.records.tree import UNSET, Tree

TREES, NODES, ACTIONS, WIDTH = 2, 6, 3, 7


def evaluation(trees: int = TREES, width: int = WIDTH, fill: float = 0.0) -> Evaluation:
    """An evaluation with one optional statistic present (``uniform``), one absent."""
    return Evaluation(
        token=torch.zeros(trees, width, dtype=torch.long),
        confidence=torch.full((trees, width), fill),
        uniform=torch.full((trees, width), fill),
    )


def test_an_empty_tree_has_its_root_and_nothing_else() -> None:
    tree = Tree.empty(TREES, NODES, ACTIONS, evaluation())
    assert (tree.trees, tree.nodes, tree.actions) == (TREES, NODES, ACTIONS)
    for name in ("parent", "action", "depth", "visits", "value_sum", "expanded", "terminal", "value", "accepted"):
        assert getattr(tree, name).shape == (TREES, NODES), name
    for name in ("position", "token", "probability", "prior", "valid", "children"):
        assert getattr(tree, name).shape == (TREES, NODES, ACTIONS), name
    assert tree.considered.shape == tree.gumbel.shape == (TREES, ACTIONS)
    assert tree.evaluation.token.shape == tree.evaluation.uniform.shape == (TREES, NODES, WIDTH)
    assert tree.evaluation.margin is None  # a statistic nobody asked for stays absent
    assert (tree.parent == UNSET).all() and (tree.action == UNSET).all() and (tree.children == UNSET).all()
    assert tree.count.tolist() == [1, 1]  # the root
    assert not tree.expanded.any() and not tree.valid.any() and not tree.considered.any()
    assert (tree.visits == 0).all() and (tree.value_sum == 0).all()
    assert tree.parent.dtype == tree.children.dtype == tree.position.dtype == torch.long
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        tree.count = torch.zeros(2)  # type: ignore[misc]


def built() -> Tree:
    """Two hand-built trees.

    Tree 0 (three levels below the root)::

        0 --a1 (pos 2, tok 11, p .3)--> 1 --a0 (pos 4, tok 13, p .6)--> 2 --a2 (pos 6, tok 18, p .1)--> 3
        0 --a0 (pos 4, tok 10, p .5)--> 4

    Tree 1: ``0 --a2 (pos 5, tok 21, p .25)--> 1``.
    """
    tree = Tree.empty(TREES, NODES, ACTIONS, evaluation())
    position, token, probability = tree.position.clone(), tree.token.clone(), tree.probability.clone()
    parent, action, depth, children = (
        tree.parent.clone(),
        tree.action.clone(),
        tree.depth.clone(),
        tree.children.clone(),
    )
    # tree 0: each node's actions
    position[0, 0], token[0, 0], probability[0, 0] = (
        torch.tensor([4, 2, 5]),
        torch.tensor([10, 11, 12]),
        torch.tensor([0.5, 0.3, 0.2]),
    )
    position[0, 1], token[0, 1], probability[0, 1] = (
        torch.tensor([4, 5, 6]),
        torch.tensor([13, 14, 15]),
        torch.tensor([0.6, 0.3, 0.1]),
    )
    position[0, 2], token[0, 2], probability[0, 2] = (
        torch.tensor([5, 3, 6]),
        torch.tensor([16, 17, 18]),
        torch.tensor([0.7, 0.2, 0.1]),
    )
    for node, (up, by, level) in {1: (0, 1, 1), 2: (1, 0, 2), 3: (2, 2, 3), 4: (0, 0, 1)}.items():
        parent[0, node], action[0, node], depth[0, node] = up, by, level
        children[0, up, by] = node
    # tree 1
    position[1, 0], token[1, 0], probability[1, 0] = (
        torch.tensor([3, 4, 5]),
        torch.tensor([19, 20, 21]),
        torch.tensor([0.5, 0.25, 0.25]),
    )
    parent[1, 1], action[1, 1], depth[1, 1] = 0, 2, 1
    children[1, 0, 2] = 1
    return attrs.evolve(
        tree,
        parent=parent,
        action=action,
        depth=depth,
        children=children,
        position=position,
        token=token,
        probability=probability,
        count=torch.tensor([5, 2]),
    )


def test_path_runs_from_a_node_up_to_the_root() -> None:
    tree = built()
    path = tree.path(torch.tensor([0, 0, 0, 1]), torch.tensor([3, 4, 0, 1]))
    assert path.tolist() == [[3, 2, 1, 0], [4, 0, UNSET, UNSET], [0, UNSET, UNSET, UNSET], [1, 0, UNSET, UNSET]]


def test_edges_are_the_commits_from_the_root_root_first() -> None:
    tree = built()
    position, token, probability = tree.edges(torch.tensor([0, 0, 0, 1]), torch.tensor([3, 4, 0, 1]))
    assert position.tolist() == [[2, 4, 6], [4, UNSET, UNSET], [UNSET, UNSET, UNSET], [5, UNSET, UNSET]]
    assert token[0].tolist() == [11, 13, 18] and token[1, 0] == 10 and token[3, 0] == 21
    assert probability[0].tolist() == pytest.approx([0.3, 0.6, 0.1])
    assert probability[1, 0].item() == pytest.approx(0.5) and probability[3, 0].item() == pytest.approx(0.25)
    # only the root: no commits, one column per step of the deepest path asked for
    position, _, _ = tree.edges(torch.tensor([1]), torch.tensor([0]))
    assert position.shape == (1, 0)


def test_backup_adds_one_visit_and_the_value_to_every_ancestor() -> None:
    tree = built()
    backed = tree.backed_up(torch.tensor([0, 0, 1]), torch.tensor([3, 4, 1]), torch.tensor([0.5, 0.25, 1.0]))
    # tree 0: leaf 3 (path 3, 2, 1, 0) gains 0.5; leaf 4 (path 4, 0) gains 0.25; tree 1: leaf 1 (path 1, 0) gains 1
    assert backed.visits[0].tolist() == [2, 1, 1, 1, 1, 0]
    assert backed.value_sum[0].tolist() == pytest.approx([0.75, 0.5, 0.5, 0.5, 0.25, 0.0])
    assert backed.visits[1].tolist() == [1, 1, 0, 0, 0, 0]
    assert backed.value_sum[1].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert (tree.visits == 0).all(), "a backup returns a new record"
    # two simulations of one wave ending at the same leaf both count; a second backup accumulates
    again = backed.backed_up(torch.tensor([0, 0]), torch.tensor([2, 2]), torch.tensor([1.0, 0.0]))
    assert again.visits[0].tolist() == [4, 3, 3, 1, 1, 0]
    assert again.value_sum[0].tolist() == pytest.approx([1.75, 1.5, 1.5, 0.5, 0.25, 0.0])
    # mean values: sum / visits, 0 where never visited
    assert again.mean_value()[0].tolist() == pytest.approx([1.75 / 4, 0.5, 0.5, 0.5, 0.25, 0.0])


def test_child_stat_reads_each_action_s_child() -> None:
    tree = built().backed_up(torch.tensor([0, 0, 0]), torch.tensor([3, 4, 4]), torch.tensor([0.5, 0.25, 0.75]))
    # the root of tree 0: a0 -> node 4 (2 visits), a1 -> node 1 (1 visit), a2 -> no child (0)
    visits = tree.child_stat(tree.visits.float(), torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]))
    assert visits.tolist() == [[2.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    means = tree.child_stat(tree.mean_value(), torch.tensor([0]), torch.tensor([0]))
    assert means[0].tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_take_put_and_join_act_on_the_tree_dimension() -> None:
    tree = built()
    second = tree.take(torch.tensor([1]))
    assert second.trees == 1 and second.count.tolist() == [2] and second.children[0, 0].tolist() == [UNSET, UNSET, 1]
    assert second.evaluation.uniform.shape == (1, NODES, WIDTH)
    evicted = tree.take(torch.tensor([True, False]))  # a bool mask: the samples kept
    assert evicted.trees == 1 and torch.equal(evicted.position, tree.position[:1])
    # put: tree 0 replaced by tree 1's, tree 1 untouched, the original unchanged
    swapped = tree.put(torch.tensor([0]), second)
    assert swapped.count.tolist() == [2, 2] and torch.equal(swapped.children[0], tree.children[1])
    assert torch.equal(swapped.children[1], tree.children[1]) and tree.count.tolist() == [5, 2]
    # join: samples admitted later get fresh trees after these
    admitted = Tree.empty(3, NODES, ACTIONS, evaluation(trees=3, fill=0.5))
    joined = tree.joined(admitted)
    assert joined.trees == 5 and joined.count.tolist() == [5, 2, 1, 1, 1]
    assert torch.equal(joined.take(torch.arange(2)).children, tree.children)
    assert joined.evaluation.uniform.shape == (5, NODES, WIDTH) and joined.evaluation.margin is None
    assert (joined.evaluation.confidence[2:] == 0).all(), "an empty tree holds no evaluation yet"
    with pytest.raises(ValueError, match="present in one record only"):
        tree.joined(
            Tree.empty(
                1,
                NODES,
                ACTIONS,
                Evaluation(token=torch.zeros(1, WIDTH, dtype=torch.long), confidence=torch.zeros(1, WIDTH)),
            )
        )


def test_node_evaluation_reads_the_stored_evaluation() -> None:
    tree = built()
    stored = tree.evaluation.confidence.clone()
    stored[0, 3] = torch.arange(WIDTH) / 10
    stored[1, 1] = 0.9
    tree = attrs.evolve(tree, evaluation=attrs.evolve(tree.evaluation, confidence=stored))
    read = tree.node_evaluation(torch.tensor([1, 0]), torch.tensor([1, 3]))
    assert read.confidence.shape == (2, WIDTH) and read.uniform is not None and read.margin is None
    assert read.confidence[0].tolist() == pytest.approx([0.9] * WIDTH)
    assert read.confidence[1].tolist() == pytest.approx([i / 10 for i in range(WIDTH)])


def test_rerooting_keeps_the_adopted_child_s_subtree_for_the_next_step() -> None:
    tree = built().backed_up(torch.tensor([0, 0, 1]), torch.tensor([3, 4, 1]), torch.tensor([0.5, 0.25, 1.0]))
    stored = tree.evaluation.confidence.clone()
    stored[0, 2] = 0.7  # node 2's evaluation travels with it
    tree = attrs.evolve(tree, evaluation=attrs.evolve(tree.evaluation, confidence=stored))
    # tree 0 commits node 1 (its subtree 1 -> 2 -> 3 becomes 0 -> 1 -> 2; node 4 is dropped); tree 1 keeps nothing
    kept = tree.rerooted(torch.tensor([1, UNSET]))
    assert kept.count.tolist() == [3, 0]
    assert kept.parent[0, :3].tolist() == [UNSET, 0, 1] and kept.action[0, :3].tolist() == [UNSET, 0, 2]
    assert kept.depth[0, :3].tolist() == [0, 1, 2]
    assert kept.children[0, 0].tolist() == [1, UNSET, UNSET] and kept.children[0, 1].tolist() == [UNSET, UNSET, 2]
    assert kept.position[0, 0].tolist() == [4, 5, 6] and kept.position[0, 1].tolist() == [5, 3, 6]
    assert kept.visits[0, :3].tolist() == [1, 1, 1] and kept.value_sum[0, :3].tolist() == pytest.approx([0.5] * 3)
    assert (kept.visits[0, 3:] == 0).all() and (kept.parent[0, 3:] == UNSET).all()
    assert kept.evaluation.confidence[0, 1].tolist() == pytest.approx([0.7] * WIDTH)
    # the commits from the new root are the old path's, less the adopted one
    position, token, _ = kept.edges(torch.tensor([0]), torch.tensor([2]))
    assert position.tolist() == [[4, 6]] and token.tolist() == [[13, 18]]
    assert not kept.considered.any()  # a new search draws its own root actions
    leaf = tree.rerooted(torch.tensor([4, 1]))  # a leaf: a tree of its root alone
    assert (
        leaf.count.tolist() == [1, 1] and leaf.visits[:, 0].tolist() == [1, 1] and leaf.depth[:, 0].tolist() == [0, 0]
    )


def test_room_width_and_empty_trees_for_a_decode_that_grows() -> None:
    tree = built()
    grown = tree.with_room(9)
    assert grown.nodes == 9 and grown.count.tolist() == [5, 2] and tree.with_room(4) is tree
    assert torch.equal(grown.children[:, :NODES], tree.children) and (grown.children[:, NODES:] == UNSET).all()
    assert (grown.parent[:, NODES:] == UNSET).all() and grown.evaluation.uniform.shape == (TREES, 9, WIDTH)
    wider = tree.widened(2, mask_id=99)  # a longer prompt joined: every canvas shifts right by 2 columns
    assert torch.equal(wider.position, tree.position + 2)
    assert wider.evaluation.token.shape == (TREES, NODES, WIDTH + 2) and (wider.evaluation.token[:, :, :2] == 99).all()
    assert (wider.evaluation.confidence[:, :, :2] == 0).all() and tree.widened(0, mask_id=99) is tree
    none = Tree.none_like(tree, 3)
    assert (none.trees, none.nodes, none.actions) == (3, NODES, ACTIONS) and none.count.tolist() == [0, 0, 0]
    assert none.evaluation.uniform is not None and none.evaluation.margin is None
    assert tree.joined(none).count.tolist() == [5, 2, 0, 0, 0]
