"""A round's Monte-Carlo tree search over the exploring slots: mctx's ``search`` (simulate, expand,
back up) over a :class:`~dlmsearch.search.records.tree.Tree` per slot, batched over problems.

Each wave, the tree policy schedules up to ``W`` simulations per tree (PUCT: its ``parallel``,
kept apart by virtual loss; Gumbel halving: a phase's visits); each descends from the root to a
node it allocates (one commit below an expanded node) or to a node it cannot pass (a terminal,
or one a simulation of the same wave allocated first). The new nodes of all trees go through
the engine as **one** batched call (a node with nothing left to decide takes none); the
candidate generator proposes each node's actions, the leaf value rates its completion, and every
simulation backs its leaf's value up its path. When the simulations (or the sample's budget in
row-forwards) are spent, the selector picks the root action to commit: the adopted canvas is
that child, with the evaluation the search already has, and the round commits nothing else (a
search's move is its step). A sample whose budget is spent, or whose root has one action or none
(nothing to choose), keeps its root and the base rule steps it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from dlmsearch.search.components.commit import StepAt, top_k_mask
from dlmsearch.search.components.leaf_values import Leaf
from dlmsearch.search.components.tree_policies import NONE
from dlmsearch.search.decode.calls import evaluate
from dlmsearch.search.decode.state import DecodeState
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.randomness import Stream
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.search.records.tree import UNSET, SearchedTrees, Tree, move_probability
from dlmsearch.search.records.usage import Usage
from dlmsearch.search.records.verifier import Verifier


def tree_search(
    engine: RolloutEngine,
    state: DecodeState,
    root: Canvas,
    evaluation: Evaluation,
    exploring: torch.Tensor,
    blocks: torch.Tensor,
    on_lookahead: Callable[[Any], None] | None,
    verifier: Verifier | None = None,
) -> tuple[Canvas, Evaluation, torch.Tensor, Usage, torch.Tensor, Tree]:
    """Search from each exploring slot's root (continuing the subtree its last search kept, where
    ``state.tree`` holds one); the adopted canvases, their evaluations, ``[S]`` whether the move
    replaced the base rule's step, the usage after the search, ``[S]`` the adopted node - 1 (the key
    its evaluation was taken under, less one; -1 where the root was kept), and the trees to keep
    (each rerooted at its adopted child; none kept where the root was).

    Args:
        engine: the model's only caller.
        state: the decode (its usage so far is charged; ``state.tree``: the slots' kept trees).
        root: ``[S]`` the exploring slots' canvases.
        evaluation: ``[S]`` their evaluations.
        exploring: ``[S]`` the exploring slots.
        blocks: ``[S]`` the later blocks a leaf's completion evaluates below each root (:func:`completion_blocks`).
        on_lookahead: sees the finished trees (:class:`SearchedTrees`: traces, tests).
        verifier: the task's check, for leaf values that read it.
    """
    plan = state.plan
    settings, policy = plan.tree, plan.expansion
    assert settings is not None
    owner = state.slots.owner[exploring]
    usage = state.usage
    trees = len(exploring)
    tree = _start(state, root, evaluation, exploring)
    tree = policy.start(tree, _root_uniforms(state, tree, exploring, usage) if policy.draws else tree.gumbel)
    searchable = tree.valid[:, 0].sum(dim=1) > 1  # one move (or none) is no choice: the base rule steps
    simulated = torch.zeros(trees, dtype=torch.long)
    wave = 0
    while True:
        allowance = torch.where(searchable, settings.allowance(usage.row_forwards[owner], simulated, blocks), 0)
        schedule = policy.schedule(tree, wave, allowance, settings.simulations)
        if not bool((schedule != NONE).any()):
            break
        tree, at, leaf, new = _descend(tree, policy, schedule)
        tree, usage = _expand(engine, state, usage, tree, root, exploring, at[new], leaf[new], verifier)
        tree = tree.backed_up(at, leaf, tree.value[at, leaf])
        simulated = simulated + torch.bincount(at, minlength=trees)
        tree = policy.after_wave(tree, wave)
        wave += 1
    adopted, adopted_eval, moved, usage, best, kept = _adopt(state, tree, root, evaluation, usage, usage.steps[owner])
    if on_lookahead is not None:
        on_lookahead(SearchedTrees(exploring, usage.steps[owner], tree, best + 1))
    return adopted, adopted_eval, moved, usage, best, kept


def kept_trees(current: Tree | None, slots: torch.Tensor, kept: Tree, total: int) -> Tree:
    """The decode's ``[total]`` kept trees with those of ``slots`` replaced by ``kept`` (grown to one size)."""
    current = Tree.none_like(kept, total) if current is None else current
    room = max(current.nodes, kept.nodes)
    return current.with_room(room).put(slots, kept.with_room(room))


def stale_trees(current: Tree | None, slots: torch.Tensor) -> Tree | None:
    """The kept trees with none kept at ``slots`` (their canvases moved on without a search)."""
    if current is None or not slots.numel():
        return current
    count = current.count.clone()
    count[slots] = 0
    return attrs.evolve(current, count=count)


def _start(state: DecodeState, root: Canvas, evaluation: Evaluation, exploring: torch.Tensor) -> Tree:
    """The trees a search starts from: the subtree a slot's last search kept (its root is this
    canvas, already expanded), else a new tree whose root's actions come from ``evaluation``; room
    for this search's simulations in every tree."""
    plan = state.plan
    assert plan.tree is not None and plan.candidates is not None
    simulations, trees = plan.tree.simulations, len(exploring)
    kept = None if state.tree is None else state.tree.take(exploring)
    room = 1 + simulations + (0 if kept is None else int(kept.count.max()))
    room = room if kept is None else max(room, kept.nodes)  # other slots' trees may have grown the kept ones' room
    tree = Tree.empty(trees, room, plan.candidates.k, evaluation, plan.candidates.commits)
    fresh = torch.arange(trees) if kept is None else (kept.count == 0).nonzero().squeeze(1)
    if kept is not None and len(fresh) < trees:
        reused = (kept.count > 0).nonzero().squeeze(1)
        tree = tree.put(reused, kept.take(reused).with_room(room))
    tree = _record_actions(tree, state, fresh, torch.zeros_like(fresh), root.take(fresh), evaluation.take(fresh))
    return attrs.evolve(tree, expanded=_set(tree.expanded, fresh, torch.zeros_like(fresh), True))


def _set(values: torch.Tensor, at: torch.Tensor, node: torch.Tensor, value: Any) -> torch.Tensor:
    """A copy of ``values`` (``[S, N, ...]``) with entries ``[at, node]`` set."""
    out = values.clone()
    out[at, node] = torch.as_tensor(value, dtype=values.dtype) if not torch.is_tensor(value) else value.to(values.dtype)
    return out


def _root_uniforms(state: DecodeState, tree: Tree, exploring: torch.Tensor, usage: Usage) -> torch.Tensor:
    """``[S, A]`` seeded uniforms per root action, keyed by its position (batch-invariant); a macro
    move, which commits several, by its index among the generator's moves."""
    call = usage.steps[state.slots.owner[exploring]]
    if tree.macro:  # keys 0..A-1: the moves' indices in place of generation positions
        moves = Layout(gen_start=0, gen_length=tree.actions, block_length=tree.actions)
        return state.slots.draw(exploring, call, moves, Stream.TREE_GUMBEL)
    columns = state.slots.draw(exploring, call, state.layout, Stream.TREE_GUMBEL)
    return columns.gather(1, tree.position[:, 0].clamp(min=0))


def _record_actions(
    tree: Tree, state: DecodeState, at: torch.Tensor, node: torch.Tensor, canvas: Canvas, evaluation: Evaluation
) -> Tree:
    """Nodes ``node`` of trees ``at`` with their evaluation and their actions (the candidate generator's
    moves, each a position, a token and the model's probability of it, or several of them for macro
    moves) and priors. A move that would write the mask id is not one.

    Args:
        tree: the trees.
        state: the decode (its plan's generator and tree settings, its layout).
        at: ``[R]`` the tree of each node.
        node: ``[R]`` the nodes.
        canvas: ``[R]`` their canvases.
        evaluation: ``[R]`` their evaluations.
    """
    plan = state.plan
    assert plan.candidates is not None and plan.tree is not None
    position, token, probability, valid = plan.candidates.moves(canvas, evaluation, state.layout)
    width = tree.actions
    if position.shape[1] < width:  # a canvas narrower than the generator's k

        def pad(values: torch.Tensor) -> torch.Tensor:
            return torch.cat([values, values.new_zeros(len(node), width - values.shape[1], *values.shape[2:])], dim=1)

        position, token, probability, valid = (pad(v) for v in (position, token, probability, valid))
    writes_mask = token == plan.mask_id
    writes_mask = (writes_mask & (position >= 0)).any(dim=2) if tree.macro else writes_mask
    valid = valid & ~tree.terminal[at, node][:, None] & ~writes_mask
    stored = attrs.evolve(
        tree.evaluation,
        **{
            f.name: _set(getattr(tree.evaluation, f.name), at, node, getattr(evaluation, f.name))
            for f in attrs.fields(Evaluation)
            if getattr(tree.evaluation, f.name) is not None
        },
    )
    return attrs.evolve(
        tree,
        position=_set(tree.position, at, node, position),
        token=_set(tree.token, at, node, token),
        probability=_set(tree.probability, at, node, probability),
        prior=_set(tree.prior, at, node, plan.tree.priors(move_probability(position, probability), valid)),
        valid=_set(tree.valid, at, node, valid),
        evaluation=stored,
    )


def _descend(tree: Tree, policy: Any, schedule: torch.Tensor) -> tuple[Tree, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every scheduled simulation walks down from its root: the tree with the nodes they allocated,
    and per simulation its tree, its leaf and whether it allocated that leaf (it is to be expanded)."""
    virtual = torch.zeros_like(tree.visits)
    found: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for place in range(schedule.shape[1]):
        at = (schedule[:, place] != NONE).nonzero().squeeze(1)
        if not at.numel():
            continue
        forced = schedule[at, place]
        node = torch.zeros_like(at)
        leaf, new = torch.full_like(at, UNSET), torch.zeros(len(at), dtype=torch.bool)
        for depth in range(tree.nodes):
            going = (leaf == UNSET).nonzero().squeeze(1)
            if not going.numel():
                break
            t, n = at[going], node[going]
            stop = tree.terminal[t, n] | ~tree.expanded[t, n]
            leaf[going[stop]] = n[stop]
            going, t, n = going[~stop], t[~stop], n[~stop]
            if not going.numel():
                break
            chosen = policy.select(tree, t, n, virtual)
            if depth == 0:
                chosen = torch.where(forced[going] >= 0, forced[going], chosen)
            child = tree.children[t, n, chosen]
            missing = child < 0
            tree, child = _allocate(tree, t[missing], n[missing], chosen[missing], child, missing)
            leaf[going[missing]] = child[missing]
            new[going[missing]] = True
            node[going] = child
        path = tree.path(at, leaf)
        on = path >= 0
        virtual = virtual.index_put(
            (at[:, None].expand_as(path)[on], path[on]), torch.ones(int(on.sum()), dtype=torch.long), accumulate=True
        )
        found.append((at, leaf, new))
    at, leaf, new = (torch.cat(parts) for parts in zip(*found))
    return tree, at, leaf, new


def _allocate(
    tree: Tree, t: torch.Tensor, parent: torch.Tensor, action: torch.Tensor, child: torch.Tensor, missing: torch.Tensor
) -> tuple[Tree, torch.Tensor]:
    """New nodes under ``parent`` by ``action`` in trees ``t`` (at most one per tree per call): the
    tree, and ``child`` with the new nodes' indices where ``missing``.

    Args:
        tree: the trees.
        t: ``[M]`` the tree of each new node.
        parent: ``[M]`` its parent.
        action: ``[M]`` the parent's action that leads to it.
        child: ``[R]`` the child each descending simulation reached (UNSET where it is new).
        missing: ``[R]`` the simulations whose child is new (``M`` of them, in order).
    """
    index = tree.count[t]
    tree = attrs.evolve(
        tree,
        children=_set(tree.children, t, parent, tree.children[t, parent].scatter(1, action[:, None], index[:, None])),
        parent=_set(tree.parent, t, index, parent),
        action=_set(tree.action, t, index, action),
        depth=_set(tree.depth, t, index, tree.depth[t, parent] + 1),
        count=tree.count.index_add(0, t, torch.ones_like(t)),
    )
    child = child.clone()
    child[missing] = index
    return tree, child


def rebuild(
    state: DecodeState, tree: Tree, root: Canvas, at: torch.Tensor, node: torch.Tensor, call: torch.Tensor
) -> Canvas:
    """The canvases of nodes ``node`` of trees ``at``: each root with its path's moves applied in
    order, each through the base rule's own commit of its positions (one, or a macro move's several,
    together: one step), so blocks advance as a step's would.

    Args:
        state: the decode (its plan's commit rule, its layout).
        tree: the trees.
        root: ``[S]`` each tree's root canvas.
        at: ``[R]`` the tree of each node.
        node: ``[R]`` the nodes.
        call: ``[R]`` the model calls recorded with the commits.
    """
    plan, layout = state.plan, state.layout
    canvas = root.take(at)
    position, token, probability = tree.edges(at, node)
    if not tree.macro:  # one commit per move: a move of K = 1
        position, token, probability = position[..., None], token[..., None], probability[..., None]
    width = canvas.tokens.shape[1]
    for step in range(position.shape[1]):
        rows = (position[:, step] >= 0).any(dim=1).nonzero().squeeze(1)
        if not rows.numel():
            continue
        made = position[rows, step] >= 0
        column = torch.where(made, position[rows, step], width)  # a commit not made writes a spare column
        chosen = torch.zeros(len(rows), width + 1, dtype=torch.bool).scatter(1, column, made)[:, :width]
        move = Evaluation(
            token=torch.zeros(len(rows), width + 1, dtype=token.dtype).scatter(1, column, token[rows, step])[:, :width],
            confidence=torch.zeros(len(rows), width + 1, dtype=probability.dtype).scatter(
                1, column, probability[rows, step]
            )[:, :width],
        )
        at_step = StepAt(layout, call[rows], plan.mask_id, depth=step + 1, branch=tree.action[at[rows], node[rows]])
        canvas = canvas.put(rows, plan.commit.open_branch(canvas.take(rows), move, at_step, chosen))
    return canvas


def _expand(
    engine: RolloutEngine,
    state: DecodeState,
    usage: Usage,
    tree: Tree,
    root: Canvas,
    exploring: torch.Tensor,
    at: torch.Tensor,
    node: torch.Tensor,
    verifier: Verifier | None,
) -> tuple[Tree, Usage]:
    """Evaluate the new nodes of every tree in one engine call (none for a node with nothing left to
    decide), rate their completions, and record their actions; the trees and the usage after it.

    Args:
        engine: the model's only caller.
        state: the decode.
        usage: the counters so far (the call is charged to them).
        tree: the trees.
        root: ``[S]`` each tree's root canvas.
        exploring: ``[S]`` each tree's slot.
        at: ``[R]`` the tree of each new node.
        node: ``[R]`` the new nodes.
        verifier: the task's check, for leaf values that read it.
    """
    if not at.numel():
        return tree, usage
    plan, layout = state.plan, state.layout
    assert plan.scorer is not None
    slot = exploring[at]
    owner = state.slots.owner[slot]
    canvas = rebuild(state, tree, root, at, node, usage.steps[owner])
    complete = ~canvas.masked.any(dim=1)
    evaluation = Evaluation.empty(len(at), canvas.tokens.shape[1], plan.statistics)
    need = (~complete).nonzero().squeeze(1)
    if need.numel():
        fresh, usage = evaluate(engine, state, usage, canvas.take(need), slot[need], node[need])
        evaluation = evaluation.put(need, fresh)
    region = slice(layout.gen_start, layout.width)
    rules = None  # the task's partial check, where the value reads the verifier and the task has one
    if plan.scorer.needs_verifier and verifier is not None and verifier.checks_partial:
        rules = lambda tokens, masked: verifier.consistent(owner, tokens[:, region], masked[:, region])
    consistent = torch.ones(len(at), dtype=torch.bool) if rules is None else rules(canvas.tokens, canvas.masked)
    completed, confidence, usage = _completed(engine, state, usage, canvas, evaluation, slot, node, rules)
    accepted, violations = None, None
    if plan.scorer.needs_verifier:
        assert verifier is not None
        accepted = verifier.accepts(owner, completed[:, region])
        violations = verifier.violations(owner, completed[:, region])
    leaf = Leaf(canvas, attrs.evolve(evaluation, confidence=confidence), layout, completed, accepted, violations)
    value = torch.where(consistent, plan.scorer.value(leaf), 0.0)
    tree = attrs.evolve(
        tree,
        expanded=_set(tree.expanded, at, node, True),
        terminal=_set(tree.terminal, at, node, complete | ~consistent),
        value=_set(tree.value, at, node, value),
        accepted=_set(tree.accepted, at, node, consistent if accepted is None else accepted & consistent)
        if accepted is not None
        else tree.accepted,
        completion=_set(tree.completion, at, node, completed),
    )
    tree = _record_actions(tree, state, at, node, canvas, evaluation)
    stuck = ~tree.valid[at, node].any(dim=1)  # nothing the generator may commit: nothing to search below
    return attrs.evolve(tree, terminal=_set(tree.terminal, at, node, tree.terminal[at, node] | stuck)), usage


def completion_blocks(canvas: Canvas, evaluation: Evaluation, layout: Layout, open_id: int) -> torch.Tensor:
    """``[R]`` the blocks holding open positions that ``evaluation`` did not summarise: on a block-diffusion
    model a forward reads only its window (the exact block cache), so a leaf's completion takes one
    more row-forward per such block (none on a model whose forward covers the whole canvas)."""
    unseen = canvas.masked & (evaluation.token == open_id)  # a summarised column's token is never the open id
    blocks = canvas.blocks(layout).clamp(min=0).expand_as(unseen)
    held = torch.zeros(len(unseen), layout.num_blocks + 1, dtype=torch.long)  # a shifted row has one more block
    return (held.scatter_add_(1, torch.where(unseen, blocks, 0), unseen.long()) > 0).sum(dim=1)


def _completed(
    engine: RolloutEngine,
    state: DecodeState,
    usage: Usage,
    canvas: Canvas,
    evaluation: Evaluation,
    slot: torch.Tensor,
    node: torch.Tensor,
    rules: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Usage]:
    """``[R, T]`` each leaf's completion and the model's probability of each token it filled in (at the
    evaluation it was filled from; the leaf's own elsewhere), and the usage after it:
    ``decoder.tree.completion_steps`` steps that each commit an equal share of the open positions the
    evaluation summarised, the most confident first (ties: the lowest column), and evaluate again (one
    row-forward per leaf still open, charged like any call); then every summarised open position takes
    its evaluation's token, block by block: where a forward summarised only its block (a block-diffusion
    model's), the leaf moves to its next block and is evaluated again (one row-forward per block, charged
    alike), so the completion is a whole answer. No steps on a whole-canvas model: the one-shot completion,
    free. A leaf whose canvas breaks the task's rules takes no step, and a completion stops at the step
    that breaks them (it cannot be accepted).

    Args:
        engine: the model's only caller.
        state: the decode (its plan's tree settings).
        usage: the counters so far (each step's call is charged to them).
        canvas: ``[R]`` the leaves' canvases.
        evaluation: ``[R]`` their evaluations (empty for a leaf with nothing left to decide).
        slot: ``[R]`` each leaf's slot.
        node: ``[R]`` each leaf's node (the key of its calls' randomness).
        rules: the task's partial check of ``(tokens, masked)`` (None: no such check).
    """
    assert state.plan.tree is not None
    steps, open_id = state.plan.tree.completion_steps, state.plan.mask_id
    tokens, masked, confidence = canvas.tokens, canvas.masked, evaluation.confidence
    broken = torch.zeros(len(tokens), dtype=torch.bool) if rules is None or not steps else ~rules(tokens, masked)
    # the steps, then the fill: a block a pass (a shifted row's grid holds one block more)
    passes = steps + state.layout.num_blocks + 1
    for step in range(passes):
        seen = masked & (evaluation.token != open_id)
        share = -(-seen.sum(dim=1) // (steps + 1 - step)) if step < steps else None  # the last share: the fill's
        commit = seen if share is None else top_k_mask(evaluation.confidence, seen, share)
        tokens, masked = torch.where(commit, evaluation.token, tokens), masked & ~commit
        confidence = torch.where(commit, evaluation.confidence, confidence)
        broken = broken if rules is None else broken | ~rules(tokens, masked)
        rows = (masked.any(dim=1) & ~broken).nonzero().squeeze(1)
        if not rows.numel():
            break
        current = attrs.evolve(canvas, tokens=tokens, masked=masked).advance_blocks(state.layout).take(rows)
        fresh, usage = evaluate(engine, state, usage, current, slot[rows], node[rows])
        evaluation = evaluation.put(rows, fresh)
    return torch.where(masked, evaluation.token, tokens), torch.where(masked, evaluation.confidence, confidence), usage


def _adopt(
    state: DecodeState, tree: Tree, root: Canvas, evaluation: Evaluation, usage: Usage, call: torch.Tensor
) -> tuple[Canvas, Evaluation, torch.Tensor, Usage, torch.Tensor, Tree]:
    """The selector's root action as each slot's adopted canvas (a verified completion, where the
    selector commits one), with the evaluation the search already has, and the trees rerooted at
    the adopted children.

    Args:
        state: the decode (its plan's selector, policy and commit rule).
        tree: the finished trees.
        root: ``[S]`` their roots' canvases.
        evaluation: ``[S]`` the roots' evaluations (kept where the root is).
        usage: the counters after the search (handed back).
        call: ``[S]`` the samples' model calls (recorded with the commits).
    """
    plan = state.plan
    assert plan.selector is not None
    trees = torch.arange(tree.trees)
    action, verified = plan.selector.child(tree, plan.expansion)
    node = tree.children[trees, 0, action]
    verified = verified & tree.accepted.any(dim=1)
    if bool(verified.any()):
        node = torch.where(verified, plan.selector.verified_node(tree), node)
    moved = (node > 0).nonzero().squeeze(1)
    adopted = rebuild(state, tree, root, moved, node[moved], call[moved])
    adopted_eval = tree.node_evaluation(moved, node[moved])
    done = verified[moved].nonzero().squeeze(1)
    if done.numel():  # the verified completion: every open position at the completion the verifier accepted
        finish, proposals = adopted.take(done), adopted_eval.take(done)
        completion = tree.completion[moved[done], node[moved[done]]]
        finished = finish.commit(
            finish.masked, completion, proposals.confidence, call[moved[done]], 1, -1, state.layout, plan.commit
        )
        adopted = adopted.put(done, finished)
    took = node > 0
    kept = tree.rerooted(torch.where(took & ~verified, node, UNSET))
    best = torch.where(took, node - 1, -1)
    return root.put(moved, adopted), evaluation.put(moved, adopted_eval), took, usage, best, kept
