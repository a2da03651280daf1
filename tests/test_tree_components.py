"""The tree search's components alone, each on a hand-built case with hand-computed numbers (issue 49):
PUCT scores and their ties, virtual visits, Gumbel top-m and sequential halving, leaf values, the
tree selectors, the tree settings (allowance, budget, priors) and the two new triggers."""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from dlmsearch.search.components.leaf_values import GradedValue, Leaf, LikelihoodValue, MixedValue, VerifiedValue
from dlmsearch.search.components.tree_policies import FREE, NONE, PUCT, GumbelHalving, best_action, puct_scores
from dlmsearch.search.components.tree_selectors import HighestMean, MostVisited, PolicyChoice, VerifiedLeaf
from dlmsearch.search.components.tree_settings import TreeSettings
from dlmsearch.search.components.triggers import FirstCommitsTrigger, LowConfidenceTrigger
from dlmsearch.search.decode.tree_phases import completion_blocks
from dlmsearch.search.records.state import Evaluation, Layout, initial_canvas
from dlmsearch.search.records.tree import UNSET, Tree

SQRT3 = math.sqrt(3.0)


def root_tree(
    priors: list[list[float]],
    visits: list[list[int]] | None = None,
    value_sums: list[list[float]] | None = None,
    valid: list[list[bool]] | None = None,
) -> Tree:
    """Trees whose root has one action per prior; the action ``a`` with ``visits[a] > 0`` has a child
    (node ``1 + a``) with those visits and that value sum, and the root the sums of its children's."""
    trees, actions = len(priors), len(priors[0])
    prior = torch.tensor(priors)
    ok = torch.tensor(valid) if valid is not None else prior > 0
    tree = Tree.empty(
        trees,
        1 + actions,
        actions,
        Evaluation(token=torch.zeros(trees, 4, dtype=torch.long), confidence=torch.zeros(trees, 4)),
    )
    visit = torch.tensor(visits) if visits is not None else torch.zeros(trees, actions, dtype=torch.long)
    value = torch.tensor(value_sums) if value_sums is not None else torch.zeros(trees, actions)
    has = visit > 0
    node = torch.arange(1, actions + 1).expand(trees, -1)
    children = tree.children.clone()
    children[:, 0] = torch.where(has, node, UNSET)
    parent, action = tree.parent.clone(), tree.action.clone()
    parent[:, 1:] = torch.where(has, 0, UNSET)
    action[:, 1:] = torch.where(has, torch.arange(actions), UNSET)
    per_action = tree.prior.clone()
    per_action[:, 0] = prior
    valid_all = tree.valid.clone()
    valid_all[:, 0] = ok
    return attrs.evolve(
        tree,
        prior=per_action,
        valid=valid_all,
        children=children,
        parent=parent,
        action=action,
        depth=torch.where(parent >= 0, 1, 0),
        visits=torch.cat([visit.sum(dim=1, keepdim=True), visit], dim=1),
        value_sum=torch.cat([value.sum(dim=1, keepdim=True), value], dim=1),
        expanded=torch.cat([torch.ones(trees, 1, dtype=torch.bool), has], dim=1),
        count=1 + has.sum(dim=1),
    )


ROOT = torch.tensor([0]), torch.tensor([0])


# ------------------------------------------------------------------ PUCT


def hand_node() -> Tree:
    """priors .5/.3/.2; a0's child visited twice (values summing to 1.0), a1's once (0.9), a2 never:
    the root has 3 visits and a value sum of 1.9 (its mean, the first-play value, 1.9 / 3)."""
    return root_tree([[0.5, 0.3, 0.2]], [[2, 1, 0]], [[1.0, 0.9, 0.0]])


def test_puct_scores_are_q_plus_c_prior_sqrt_n_over_one_plus_n() -> None:
    tree = hand_node()
    none = torch.zeros_like(tree.visits)
    scores = puct_scores(tree, *ROOT, none, c=1.25, unvisited="parent")
    # Q + c * P * sqrt(sum_b N(b)) / (1 + N(a)), sum_b N(b) = 3
    expected = [
        0.5 + 1.25 * 0.5 * SQRT3 / 3,  # 0.860844
        0.9 + 1.25 * 0.3 * SQRT3 / 2,  # 1.224760
        1.9 / 3 + 1.25 * 0.2 * SQRT3 / 1,  # 1.066346: the unvisited child takes its parent's mean
    ]
    assert scores[0].tolist() == pytest.approx([0.860844, 1.224760, 1.066346], abs=1e-6)
    assert scores[0].tolist() == pytest.approx(expected)
    zero = puct_scores(tree, *ROOT, none, c=1.25, unvisited="zero")
    assert zero[0, 2].item() == pytest.approx(0.433013, abs=1e-6)  # 0 + 1.25 * .2 * sqrt(3)
    assert PUCT(c=1.25).select(tree, *ROOT, none).tolist() == [1]
    # c = 0: the mean values alone
    assert puct_scores(tree, *ROOT, none, c=0.0, unvisited="parent")[0].tolist() == pytest.approx([0.5, 0.9, 1.9 / 3])


def test_a_virtual_visit_steers_the_next_simulation_of_a_wave_away() -> None:
    tree = hand_node()
    virtual = torch.zeros_like(tree.visits)
    first = PUCT(c=1.25).select(tree, *ROOT, virtual)
    assert first.tolist() == [1]
    virtual[0, 0] += 1  # the first simulation's path: the root and a1's child (node 2)
    virtual[0, 2] += 1
    scores = puct_scores(tree, *ROOT, virtual, c=1.25, unvisited="parent")
    # a1 now counts 2 visits of value sum 0.9 (a pending visit is worth 0); sum_b N(b) = 4
    expected = [0.5 + 1.25 * 0.5 * 2 / 3, 0.45 + 1.25 * 0.3 * 2 / 3, 1.9 / 3 + 1.25 * 0.2 * 2 / 1]
    assert scores[0].tolist() == pytest.approx(expected)  # [0.916667, 0.7, 1.133333]
    assert PUCT(c=1.25).select(tree, *ROOT, virtual).tolist() == [2]


def test_ties_go_to_the_highest_prior_then_the_lowest_index() -> None:
    valid = torch.ones(4, 3, dtype=torch.bool)
    score = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [2.0, 1.0, 2.0], [5.0, 1.0, 1.0]])
    prior = torch.tensor([[0.2, 0.5, 0.3], [0.4, 0.4, 0.2], [0.1, 0.8, 0.1], [0.9, 0.05, 0.05]])
    valid[3, 0] = False  # an invalid action never wins, whatever its score
    assert best_action(score, prior, valid).tolist() == [1, 0, 0, 1]
    # a fresh node (no visits, c > 0): every score is the first-play value, so the highest prior leads
    fresh = root_tree([[0.2, 0.5, 0.3]])
    assert PUCT(c=1.25).select(fresh, *ROOT, torch.zeros_like(fresh.visits)).tolist() == [1]


def test_puct_schedules_its_parallel_simulations_within_the_allowance() -> None:
    tree = root_tree([[0.5, 0.5]] * 3)
    schedule = PUCT(parallel=4).schedule(tree, 0, torch.tensor([5, 2, 0]), simulations=3)
    assert schedule.tolist() == [[FREE, FREE, FREE], [FREE, FREE, NONE], [NONE, NONE, NONE]]
    assert PUCT(parallel=2).schedule(tree, 0, torch.tensor([5, 2, 1]), simulations=8).tolist() == [
        [FREE, FREE],
        [FREE, FREE],
        [FREE, NONE],
    ]
    assert PUCT().root_score(hand_node()).tolist() == [[2.0, 1.0, 0.0]]  # its ranking: the visits


# ------------------------------------------------------------------ Gumbel sequential halving


def gumbel(u: float) -> float:
    return -math.log(-math.log(u))


def test_gumbel_start_considers_the_top_m_by_g_plus_logit() -> None:
    priors = [0.4, 0.3, 0.15, 0.1, 0.05, 0.0]
    tree = root_tree([priors], valid=[[True] * 5 + [False]])
    uniform = torch.tensor([[0.1, 0.5, 0.99, 0.5, 0.9, 0.999]])
    started = GumbelHalving(considered=3).start(tree, uniform)
    # g + log p: a0 -0.834032 - 0.916291 = -1.750323, a1 0.366513 - 1.203973 = -0.837460,
    # a2 4.600149 - 1.897120 = 2.703030, a3 0.366513 - 2.302585 = -1.936072, a4 2.250367 - 2.995732 = -0.745365
    ranked = [gumbel(u) + math.log(p) for u, p in zip(uniform[0, :5].tolist(), priors[:5])]
    assert ranked == pytest.approx([-1.750323, -0.837460, 2.703030, -1.936072, -0.745365], abs=1e-5)
    assert started.considered.tolist() == [[False, True, True, False, True, False]]  # a2, a4, a1
    assert started.gumbel[0, :5].tolist() == pytest.approx([gumbel(u) for u in uniform[0, :5].tolist()], rel=1e-5)
    assert started.gumbel[0, 5].item() == 0.0  # an invalid action draws nothing
    # m larger than the valid actions: all valid ones
    assert GumbelHalving(considered=8).start(tree, uniform).considered.tolist() == [[True] * 5 + [False]]


def test_the_halving_schedule_for_m_4_and_n_8() -> None:
    policy = GumbelHalving(considered=4)

    def phases(valid: int, m: int) -> int:
        tree = root_tree([[0.1] * 8], valid=[[True] * valid + [False] * (8 - valid)])
        return int(GumbelHalving(considered=m).phases(tree)[0])

    assert [phases(8, m) for m in (1, 2, 3, 4, 8)] == [1, 1, 2, 2, 3]
    assert [phases(valid, 8) for valid in (1, 2, 3, 5)] == [1, 1, 2, 3]  # fewer valid moves than m: those count (mctx)
    tree = root_tree([[0.2] * 5 + [0.0]] * 2)
    considered = torch.tensor([[True, True, False, True, True, False], [True, True, True, False, False, False]])
    tree = attrs.evolve(tree, considered=considered)
    allowance = torch.tensor([8, 8])
    # phase 0: 2 phases, so each of 4 survivors is visited 8 // (2 * 4) = 1 time, of 3 survivors 8 // (2 * 3) = 1
    assert policy.schedule(tree, 0, allowance, 8).tolist() == [[0, 1, 3, 4], [0, 1, 2, NONE]]
    # phase 1, two survivors each: 8 // (2 * 2) = 2 visits each
    halved = attrs.evolve(
        tree,
        considered=torch.tensor([[False, True, False, False, True, False], [True, False, True, False, False, False]]),
    )
    assert policy.schedule(halved, 1, allowance, 8).tolist() == [[1, 1, 4, 4], [0, 0, 2, 2]]
    # the allowance (simulations or budget left) cuts a phase short
    assert policy.schedule(halved, 1, torch.tensor([3, 0]), 8).tolist() == [[1, 1, 4, NONE], [NONE] * 4]
    # past the last phase, or one survivor left: nothing
    assert policy.schedule(halved, 2, allowance, 8).tolist() == [[NONE], [NONE]]
    single = attrs.evolve(tree, considered=torch.tensor([[False, True] + [False] * 4] * 2))
    assert (policy.schedule(single, 1, allowance, 8) == NONE).all()


def halving_tree() -> Tree:
    """Root actions with priors .3/.25/.2/.1/.15, Gumbel noise .3/-.5/.1/0/2, children visited 2/1/1/1/4
    times with mean values .2/.9/.5/.4/1; a0..a3 still considered, a4 dropped earlier."""
    tree = root_tree([[0.3, 0.25, 0.2, 0.1, 0.15]], [[2, 1, 1, 1, 4]], [[0.4, 0.9, 0.5, 0.4, 4.0]])
    return attrs.evolve(
        tree,
        gumbel=torch.tensor([[0.3, -0.5, 0.1, 0.0, 2.0]]),
        considered=torch.tensor([[True, True, True, True, False]]),
    )


def test_halving_keeps_the_better_half_by_g_plus_logit_plus_sigma_q() -> None:
    policy = GumbelHalving(considered=4, c_visit=50.0, c_scale=0.1)
    tree = halving_tree()
    # sigma(q) = (c_visit + max_b N(b)) * c_scale * q = (50 + 4) * 0.1 * q = 5.4 q
    # a0: .3 + log .3 + 5.4 * .2 = 0.176027     a1: -.5 + log .25 + 5.4 * .9 = 2.973706
    # a2: .1 + log .2 + 5.4 * .5 = 1.190562     a3: 0 + log .1 + 5.4 * .4 = -0.142585
    # a4: 2 + log .15 + 5.4 * 1 = 5.502880 (dropped earlier: it stays out)
    assert policy.root_score(tree)[0].tolist() == pytest.approx(
        [0.176027, 2.973706, 1.190562, -0.142585, 5.502880], abs=1e-5
    )
    assert policy.after_wave(tree, 0).considered.tolist() == [[False, True, True, False, False]]
    # without sigma (q = 0) the ranking would have been a0, a2: the values decided
    flat = attrs.evolve(tree, value_sum=torch.zeros_like(tree.value_sum))
    assert policy.after_wave(flat, 0).considered.tolist() == [[True, False, True, False, False]]
    # an odd number of survivors keeps the larger half: 3 -> 2 (a1, a2 of a0, a1, a2)
    three = attrs.evolve(tree, considered=torch.tensor([[True, True, True, False, False]]))
    assert policy.after_wave(three, 0).considered.tolist() == [[False, True, True, False, False]]
    # then 2 -> 1
    assert policy.after_wave(policy.after_wave(tree, 0), 1).considered.tolist() == [[False, True, False, False, False]]


# ------------------------------------------------------------------ leaf values

LAYOUT = Layout(gen_start=2, gen_length=4, block_length=4)
MASK = 9


def leaf(accepted: list[bool] | None = None) -> Leaf:
    """Two leaves of prompt ``[1, 2]`` and generation ``[_, _, 7, _]`` (7 a given cell): row 0 has the
    first generation position committed at probability .8, row 1 the first and the last (.8 and .4)."""
    canvas = initial_canvas([torch.tensor([1, 2])] * 2, [torch.tensor([MASK, MASK, 7, MASK])] * 2, LAYOUT, MASK, 0)
    chosen = torch.zeros(2, 6, dtype=torch.bool)
    chosen[:, 2] = True
    chosen[1, 5] = True
    proposal = torch.full((2, 6), 3)
    confidence = torch.tensor([[0.0, 0.0, 0.8, 0.0, 0.0, 0.0], [0.0, 0.0, 0.8, 0.0, 0.0, 0.4]])
    canvas = canvas.commit(chosen, proposal, confidence, torch.tensor([1, 1]), 1, 0, LAYOUT)
    # the leaf's own evaluation: the completion's probabilities (prompt and given cells must not count)
    evaluation = Evaluation(
        token=torch.full((2, 6), 5), confidence=torch.tensor([[0.01, 0.01, 0.9, 0.5, 0.02, 0.25]] * 2)
    )
    completed = torch.where(canvas.masked, evaluation.token, canvas.tokens)
    return Leaf(canvas, evaluation, LAYOUT, completed, None if accepted is None else torch.tensor(accepted))


def test_the_likelihood_is_the_geometric_mean_over_committed_and_filled_positions() -> None:
    # row 0: committed .8 (its commit's probability, not the evaluation's .9), filled .5 and .25: (.8 * .5 * .25) ** (1 / 3)
    # row 1: committed .8 and .4, filled .5: (.8 * .4 * .5) ** (1 / 3); the given 7 and the prompt never count
    expected = [(0.8 * 0.5 * 0.25) ** (1 / 3), (0.8 * 0.4 * 0.5) ** (1 / 3)]
    assert LikelihoodValue().value(leaf()).tolist() == pytest.approx(expected)  # [0.464159, 0.542884]
    assert expected == pytest.approx([0.464159, 0.542884], abs=1e-6)
    # a lookahead's score of the same leaf: the one-shot completion's likelihood
    view = leaf()
    score = LikelihoodValue().score(view.canvas, view.evaluation, LAYOUT, torch.zeros(2))
    assert score.tolist() == pytest.approx(expected)


def test_verified_and_mixed_values() -> None:
    verdicts = leaf([True, False])
    assert VerifiedValue().value(verdicts).tolist() == [1.0, 0.0]
    likelihood = [(0.8 * 0.5 * 0.25) ** (1 / 3), (0.8 * 0.4 * 0.5) ** (1 / 3)]
    mixed = MixedValue(weight=0.25).value(verdicts)
    assert mixed.tolist() == pytest.approx([0.25 + 0.75 * likelihood[0], 0.75 * likelihood[1]])
    assert MixedValue(weight=1.0).value(verdicts).tolist() == [1.0, 0.0]
    assert MixedValue(weight=0.0).value(verdicts).tolist() == pytest.approx(likelihood)
    assert not LikelihoodValue.needs_verifier and VerifiedValue.needs_verifier and MixedValue.needs_verifier
    with pytest.raises(ValueError):
        MixedValue(weight=1.5)


# ------------------------------------------------------------------ selectors


def selector_tree() -> Tree:
    """Root actions with priors .4/.2/.3/.1: children visited 1/5/5/- times with value sums .9/2.5/3/-."""
    return root_tree([[0.4, 0.2, 0.3, 0.1]], [[1, 5, 5, 0]], [[0.9, 2.5, 3.0, 0.0]])


def test_graded_value_is_exp_of_minus_violations_over_scale() -> None:
    graded = attrs.evolve(leaf([True, False]), violations=torch.tensor([0.0, 3.0]))
    assert GradedValue(scale=2.0).value(graded).tolist() == pytest.approx([1.0, math.exp(-1.5)])


def test_sudoku_violations_count_repeats_changed_clues_and_blanks() -> None:
    """A solved grid breaks nothing; each extra copy of a digit in a row, column or box counts once per
    unit, a changed clue once, a blank once."""
    from dlmsearch.tasks.sudoku import SUDOKU_MASK_ID, SudokuVerifier

    base = [[(r * 3 + r // 3 + c) % 9 for c in range(9)] for r in range(9)]  # a valid grid, digits 0..8
    solved = torch.tensor(base).flatten()[None]
    clues = solved.clone()
    clues[0, 1:] = SUDOKU_MASK_ID  # one clue: cell 0
    verifier = SudokuVerifier(clues=clues)
    sample = torch.tensor([0])
    assert verifier.violations(sample, solved).tolist() == [0.0]
    one = solved.clone()
    one[0, 1] = one[0, 0]  # cell 1 copies cell 0: its row and its box repeat that digit; its column loses none
    column_repeat = int((one[0, 1::9] == one[0, 0]).sum() > 1)
    assert verifier.violations(sample, one).tolist() == [2.0 + column_repeat]
    changed = solved.clone()
    changed[0, 0] = (changed[0, 0] + 1) % 9  # the clue changed, and its digit now repeats in row, column and box
    assert verifier.violations(sample, changed).tolist() == [1.0 + 3.0]
    blank = solved.clone()
    blank[0, 40] = SUDOKU_MASK_ID
    assert verifier.violations(sample, blank).tolist() == [1.0]
    assert bool(verifier.accepts(sample, solved)) and not bool(verifier.accepts(sample, one))


def test_most_visited_and_highest_mean() -> None:
    tree = selector_tree()
    action, verified = MostVisited().child(tree, PUCT())
    assert action.tolist() == [2] and verified.tolist() == [False]  # a1, a2 tie at 5 visits: a2's prior is higher
    action, _ = HighestMean().child(tree, PUCT())
    assert action.tolist() == [0]  # means .9, .5, .6; a3 has no child and is never chosen
    # the selectors are also lookahead selectors: every branch live, the best score wins
    live = torch.ones(1, 3, dtype=torch.bool)
    kept, restart = MostVisited().prune(live, live, torch.zeros(1, 3))
    assert torch.equal(kept, live) and restart.tolist() == [False]


def test_policy_choice_is_the_policy_s_ranking_among_the_halving_s_survivors() -> None:
    # PUCT's own ranking is the visits (a1, a2 tie at 5: a2's prior .3 beats a1's .2)
    assert PolicyChoice().child(selector_tree(), PUCT())[0].tolist() == [2]
    # m = 4, n = 8 after both phases: a0 and a3 were dropped after one visit each, a1 and a2 got two more,
    # and the last halving kept a1. a0's one lucky visit (value 1) now outscores a1 (mean .3) by
    # g + logit + sigma(q), sigma = (50 + 3) * .1 * q = 5.3 q:
    # a0: -1 + log .05 + 5.3 = 1.304268   a1: .5 + log .4 + 5.3 * .3 = 1.173709
    # a2: .2 + log .4 + 5.3 * .25 = 0.608709   a3: 0 + log .15 + 5.3 * .1 = -1.367120
    # The halving's winner is a1 (mctx commits among the most visited actions), not the dropped a0.
    tree = root_tree([[0.05, 0.4, 0.4, 0.15]], [[1, 3, 3, 1]], [[1.0, 0.9, 0.75, 0.1]])
    tree = attrs.evolve(
        tree, gumbel=torch.tensor([[-1.0, 0.5, 0.2, 0.0]]), considered=torch.tensor([[False, True, False, False]])
    )
    policy = GumbelHalving(considered=4)
    assert policy.root_score(tree)[0].tolist() == pytest.approx([1.304268, 1.173709, 0.608709, -1.367120], abs=1e-5)
    assert PolicyChoice().child(tree, policy)[0].tolist() == [1]


def test_verified_leaf_commits_the_accepted_node_with_the_highest_value() -> None:
    tree = selector_tree()
    tree = attrs.evolve(
        tree,
        accepted=torch.tensor([[False, True, False, True, False]]),
        value=torch.tensor([[0.0, 0.3, 0.9, 0.8, 1.0]]),
    )
    action, verified = VerifiedLeaf().child(tree, PUCT())
    assert action.tolist() == [2] and verified.tolist() == [True]  # the most visited, replaced by the verified leaf
    assert VerifiedLeaf.verified_node(tree).tolist() == [3]  # accepted: nodes 1 (.3) and 3 (.8)
    tied = attrs.evolve(tree, value=torch.tensor([[0.0, 0.8, 0.9, 0.8, 1.0]]))
    assert VerifiedLeaf.verified_node(tied).tolist() == [1]  # the first on ties
    none = attrs.evolve(tree, accepted=torch.zeros_like(tree.accepted))
    assert VerifiedLeaf().child(none, PUCT())[1].tolist() == [False]


# ------------------------------------------------------------------ settings


def test_allowance_is_the_simulations_left_within_the_budget() -> None:
    spent, simulated = torch.tensor([0, 5, 9, 12]), torch.tensor([0, 2, 0, 0])
    assert TreeSettings(simulations=8).allowance(spent, simulated).tolist() == [8, 6, 8, 8]
    assert TreeSettings(simulations=8).searches(spent).tolist() == [True] * 4
    budgeted = TreeSettings(simulations=8, budget=10)
    # min(8 - simulated, 10 - spent), never below 0
    assert budgeted.allowance(spent, simulated).tolist() == [8, 5, 1, 0]
    assert budgeted.searches(spent).tolist() == [True, True, True, False]
    assert TreeSettings(simulations=3).allowance(torch.tensor([0]), torch.tensor([5])).tolist() == [0]


def test_a_simulation_reserves_a_forward_for_each_later_block_its_completion_evaluates() -> None:
    spent, simulated, blocks = torch.tensor([0, 0, 6]), torch.tensor([0, 0, 0]), torch.tensor([0, 2, 2])
    budgeted = TreeSettings(simulations=8, budget=12, completion_steps=1)
    # floor((12 - spent) / (1 + 1 + blocks)): 12 / 2, 12 / 4, 6 / 4
    assert budgeted.allowance(spent, simulated, blocks).tolist() == [6, 3, 1]
    assert budgeted.searches(torch.tensor([9, 9]), torch.tensor([0, 2])).tolist() == [True, False]


def test_every_step_while_the_unspent_budget_covers_whole_searches() -> None:
    spent = torch.tensor([0, 24, 25, 40])
    # 4 simulations at (1 + 1) row-forwards each: a whole search is 8; two of them, 16, of the 40, 16, 15, 0 left
    rich = TreeSettings(simulations=4, budget=40, completion_steps=1, every_step_above=2.0)
    assert rich.every_step(spent).tolist() == [True, True, False, False]
    assert rich.every_step(spent, torch.tensor([0, 0, 0, 0])).tolist() == [True, True, False, False]
    assert rich.every_step(torch.tensor([0]), torch.tensor([2])).tolist() == [True]  # 2 * 4 * 4 = 32 <= 40
    assert rich.every_step(torch.tensor([9]), torch.tensor([2])).tolist() == [False]
    assert TreeSettings(budget=40).every_step(spent).tolist() == [False] * 4  # unset: only where the trigger fires
    assert TreeSettings(every_step_above=3.0).every_step(spent).tolist() == [True] * 4  # no budget: never poor


def test_completion_blocks_count_the_blocks_whose_open_positions_no_forward_summarised() -> None:
    """Blocks of two after a one-token prompt: row 0's forward read block 0 only (the block cache), row 1's
    the whole canvas, row 2's block 0 with block 1 already decided."""
    layout = Layout(gen_start=1, gen_length=6, block_length=2)
    canvas = initial_canvas([torch.tensor([1])] * 3, [torch.full((6,), MASK)] * 3, layout, MASK, 0)
    decided = torch.tensor([False, False, False, True, True, False, False])
    canvas = attrs.evolve(canvas, masked=torch.stack([canvas.masked[0], canvas.masked[1], canvas.masked[2] & ~decided]))
    token = torch.full((3, 7), MASK)
    token[:, 1:3] = 5  # every row's block 0 summarised
    token[1] = 5  # row 1: every column
    evaluation = Evaluation(token=token, confidence=torch.ones(3, 7))
    assert completion_blocks(canvas, evaluation, layout, MASK).tolist() == [2, 0, 1]


def test_priors_normalise_over_the_valid_actions() -> None:
    probability = torch.tensor([[0.6, 0.2, 0.2, 0.5], [0.1, 0.3, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    valid = torch.tensor([[True, True, False, False], [True, True, True, False], [False] * 4])
    confidence = TreeSettings().priors(probability, valid)
    assert confidence.flatten().tolist() == pytest.approx([0.75, 0.25, 0.0, 0.0, 0.25, 0.75, 0.0, 0.0] + [0.0] * 4)
    uniform = TreeSettings(prior="uniform").priors(probability, valid)
    assert uniform.flatten().tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0, 1 / 3, 1 / 3, 1 / 3, 0.0] + [0.0] * 4)
    with pytest.raises(ValueError):
        TreeSettings(prior="softmax")
    with pytest.raises(ValueError):
        TreeSettings(simulations=0)
    with pytest.raises(ValueError):
        TreeSettings(budget=0)


# ------------------------------------------------------------------ triggers


def test_low_confidence_and_first_commits_triggers() -> None:
    layout = Layout(gen_start=1, gen_length=4, block_length=2)
    canvas = initial_canvas([torch.tensor([1])] * 3, [torch.full((4,), MASK)] * 3, layout, MASK, 0)
    confidence = torch.tensor([[0.0, 0.95, 0.3, 0.99, 0.99], [0.0, 0.5, 0.6, 0.99, 0.99], [0.0, 0.5, 0.6, 0.99, 0.99]])
    evaluation = Evaluation(token=torch.zeros(3, 5, dtype=torch.long), confidence=confidence)
    # eligible: masked in unlocked blocks (block 0: columns 1, 2); the later block's .99 does not count
    assert LowConfidenceTrigger(threshold=0.9).fires(canvas, evaluation, layout).tolist() == [False, True, True]
    assert LowConfidenceTrigger(threshold=0.5).fires(canvas, evaluation, layout).tolist() == [False, False, False]
    chosen = torch.zeros(3, 5, dtype=torch.bool)
    chosen[1, 1] = True
    chosen[2, 1:3] = True
    committed = canvas.commit(chosen, torch.full((3, 5), 4), confidence, torch.ones(3, dtype=torch.long), 0, 0, layout)
    assert FirstCommitsTrigger(commits=2).fires(committed, evaluation, layout).tolist() == [True, True, False]
    assert FirstCommitsTrigger(commits=1).fires(committed, evaluation, layout).tolist() == [True, False, False]
