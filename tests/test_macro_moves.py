"""Macro moves (UnMaskFork, arXiv 2602.04344; issue 49): the tree record with several commits per move,
the generator alone on a hand-built evaluation (which positions and tokens each move picks, repeats
dropped, sampled tokens seeded and batch-invariant), and ``mcts_macro`` end to end on the shipped
Sudoku and Countdown models and on the text families (batch-invariant, seeded, admit and evict)."""

from __future__ import annotations

import types

import attrs
import pytest
import torch
from conftest import NoRepeatVerifier, admit_step_evict, make_requests, record, renumbered, text_decoder
from family_models import BLOCK, adapter_for, requests_for
from test_tree_search import COUNTDOWN, SUDOKU, decode, decoding, first_trees, searched

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.components.commit import ThresholdRule
from dlmsearch.search.components.macro_moves import MacroMove, MacroMoves
from dlmsearch.search.decode.tree_phases import rebuild
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.state import Evaluation, Layout, initial_canvas
from dlmsearch.search.records.tree import UNSET, SearchedTrees, Tree, move_probability
from dlmsearch.search.session import DecodeSession

MASK, WIDTH, K = 99, 8, 3
LAYOUT = Layout(gen_start=2, gen_length=6, block_length=6)


def canvas(rows: int = 1):
    """Rows of two prompt tokens and six masked generation cells (columns 2..7)."""
    return initial_canvas(
        [torch.tensor([5, 6])] * rows, [torch.full((6,), MASK)] * rows, LAYOUT, mask_id=MASK, pad_id=0
    )


# ------------------------------------------------------------------ the tree record with K commits per move


def macro_tree() -> Tree:
    """One tree of two moves below the root::

        0 --a0 (pos 2, 5: tok 10, 11; p .9, .4)--> 1 --a1 (pos 7: tok 12; p .5)--> 2

    (node 1's move a1 makes one commit of K = 3; the root's a1 makes three, never expanded)."""
    evaluation = Evaluation(token=torch.zeros(1, WIDTH, dtype=torch.long), confidence=torch.zeros(1, WIDTH))
    tree = Tree.empty(1, 4, 2, evaluation, commits=K)
    position, token, probability = tree.position.clone(), tree.token.clone(), tree.probability.clone()
    position[0, 0] = torch.tensor([[2, 5, UNSET], [3, 4, 6]])
    token[0, 0] = torch.tensor([[10, 11, 0], [13, 14, 15]])
    probability[0, 0] = torch.tensor([[0.9, 0.4, 0.0], [0.8, 0.8, 0.8]])
    position[0, 1] = torch.tensor([[3, UNSET, UNSET], [7, UNSET, UNSET]])
    token[0, 1] = torch.tensor([[16, 0, 0], [12, 0, 0]])
    probability[0, 1] = torch.tensor([[0.3, 0.0, 0.0], [0.5, 0.0, 0.0]])
    return attrs.evolve(
        tree,
        position=position,
        token=token,
        probability=probability,
        valid=torch.ones_like(tree.valid),
        parent=torch.tensor([[UNSET, 0, 1, UNSET]]),
        action=torch.tensor([[UNSET, 0, 1, UNSET]]),
        depth=torch.tensor([[0, 1, 2, 0]]),
        children=torch.tensor([[[1, UNSET], [UNSET, 2], [UNSET, UNSET], [UNSET, UNSET]]]),
        expanded=torch.tensor([[True, True, False, False]]),
        count=torch.tensor([3]),
    )


def test_a_macro_tree_holds_k_commits_per_action_and_reads_as_such() -> None:
    tree = macro_tree()
    assert tree.macro and tree.commits == K and tree.actions == 2
    assert tree.position.shape == tree.token.shape == tree.probability.shape == (1, 4, 2, K)
    assert tree.prior.shape == tree.valid.shape == tree.children.shape == (1, 4, 2)
    assert not Tree.empty(1, 4, 2, _flat()).macro and Tree.empty(1, 4, 2, _flat()).commits == 1
    position, token, probability = tree.edges(torch.tensor([0, 0, 0]), torch.tensor([2, 1, 0]))
    assert position.shape == (3, 2, K)
    assert position[0].tolist() == [[2, 5, UNSET], [7, UNSET, UNSET]] and token[0].tolist() == [[10, 11, 0], [12, 0, 0]]
    assert position[1].tolist() == [[2, 5, UNSET], [UNSET] * K] and (position[2] == UNSET).all()
    assert probability[0, 0].tolist() == pytest.approx([0.9, 0.4, 0.0])
    # a move's probability: the geometric mean over its commits (0.6 = sqrt(.9 * .4))
    assert move_probability(tree.position[:, 0], tree.probability[:, 0])[0].tolist() == pytest.approx([0.6, 0.8])


def _flat() -> Evaluation:
    return Evaluation(token=torch.zeros(1, WIDTH, dtype=torch.long), confidence=torch.zeros(1, WIDTH))


def test_a_macro_tree_takes_puts_reroots_grows_and_widens() -> None:
    tree = macro_tree()
    two = tree.joined(Tree.none_like(tree, 1))
    assert two.macro and two.position.shape == (2, 4, 2, K) and two.count.tolist() == [3, 0]
    assert torch.equal(two.take(torch.tensor([0])).position, tree.position)
    swapped = two.put(torch.tensor([1]), tree)
    assert torch.equal(swapped.position[1], tree.position[0]) and swapped.count.tolist() == [3, 3]
    kept = tree.rerooted(torch.tensor([1]))  # the first move committed: its child is the root
    assert kept.count.tolist() == [2] and kept.depth[0, :2].tolist() == [0, 1]
    assert kept.position[0, 0].tolist() == [[3, UNSET, UNSET], [7, UNSET, UNSET]]
    position, _, _ = kept.edges(torch.tensor([0]), torch.tensor([1]))
    assert position.tolist() == [[[7, UNSET, UNSET]]]
    assert tree.with_room(6).position.shape == (1, 6, 2, K)
    wider = tree.widened(3, mask_id=MASK)  # positions shift; a commit not made stays UNSET
    assert wider.position[0, 0].tolist() == [[5, 8, UNSET], [6, 7, 9]]


def test_a_trace_lists_each_macro_move_s_commits() -> None:
    table = SearchedTrees(torch.tensor([0]), torch.tensor([4]), macro_tree(), torch.tensor([1])).node_table(0)
    assert table["parent"] == [UNSET, 0, 1]
    assert table["position"] == [-1, [2, 5], [7]] and table["token"] == [-1, [10, 11], [12]]


def test_rebuild_applies_every_commit_of_each_move_as_one_step() -> None:
    tree = macro_tree()
    state = types.SimpleNamespace(plan=types.SimpleNamespace(commit=ThresholdRule(), mask_id=MASK), layout=LAYOUT)
    root = canvas()
    built = rebuild(state, tree, root, torch.tensor([0, 0]), torch.tensor([2, 1]), torch.tensor([4, 4]))
    assert built.tokens[0].tolist() == [5, 6, 10, MASK, MASK, 11, MASK, 12]
    assert built.tokens[1].tolist() == [5, 6, 10, MASK, MASK, 11, MASK, MASK]
    assert built.commit_confidence[0, [2, 5, 7]].tolist() == pytest.approx([0.9, 0.4, 0.5])
    assert built.commit_depth[0, [2, 5, 7]].tolist() == [1, 1, 2]  # depth counts moves
    assert built.block_round.tolist() == [2, 1]  # one step per move, whatever it commits


# ------------------------------------------------------------------ the generator alone

# confidences of columns 2..7 (the prompt's columns are not masked, never eligible)
CONFIDENCE = [0.0, 0.0, 0.95, 0.5, 0.92, 0.6, 0.3, 0.97]
MARGIN = [0.0, 0.0, 0.2, 0.45, 0.9, 0.1, 0.05, 0.3]


def hand_evaluation(rows: int = 1, uniform: float = 0.5) -> Evaluation:
    """Tokens 20 + column, their probabilities ``CONFIDENCE``; runner-ups 40 + column at 1 - confidence."""
    confidence = torch.tensor([CONFIDENCE] * rows)
    return Evaluation(
        token=(20 + torch.arange(WIDTH)).expand(rows, -1).clone(),
        confidence=confidence,
        margin=torch.tensor([MARGIN] * rows),
        uniform=torch.full((rows, WIDTH), uniform),
        runner_up=(40 + torch.arange(WIDTH)).float().expand(rows, -1).clone(),
        runner_up_confidence=1 - confidence,
    )


def test_each_move_picks_its_rule_s_positions_with_the_node_s_tokens() -> None:
    moves = MacroMoves(
        [
            {"ordering": "confidence", "k": 2},
            {"ordering": "margin", "k": 2},
            {"ordering": "confidence", "threshold": 0.9, "k": 4},
            {"ordering": "confidence", "threshold": 0.99, "k": 4},  # none so sure: at least one
        ]
    )
    assert moves.k == 4 and moves.commits == 4 and moves.statistics == {"margin"}
    position, token, probability, valid = moves.moves(canvas(), hand_evaluation(), LAYOUT)
    assert position.shape == (1, 4, 4) and valid.tolist() == [[True, True, True, True]]
    assert position[0].tolist() == [
        [2, 7, UNSET, UNSET],  # the two most confident, in position order
        [3, 4, UNSET, UNSET],  # the two largest margins
        [2, 4, 7, UNSET],  # every confidence >= 0.9
        [7, UNSET, UNSET, UNSET],  # the most confident alone
    ]
    assert token[0, 0].tolist() == [22, 27, 0, 0] and probability[0, 0].tolist() == pytest.approx([0.95, 0.97, 0, 0])


def test_a_move_that_repeats_an_earlier_one_is_dropped_and_all_alike_leave_one() -> None:
    alike = MacroMoves(
        [{"k": 2}, {"k": 2, "threshold": 0.9}, {"k": 2}]
    )  # three are one here: three at >= 0.9, at most two
    position, _, _, valid = alike.moves(canvas(), hand_evaluation(), LAYOUT)
    assert valid.tolist() == [[True, False, False]] and position[0, 0].tolist() == [2, 7]
    # with one at >= 0.9, the threshold move commits it alone: two distinct moves
    evaluation = hand_evaluation()
    evaluation = attrs.evolve(
        evaluation, confidence=evaluation.confidence.clone().index_fill_(1, torch.tensor([2, 4]), 0.5)
    )
    _, _, _, valid = alike.moves(canvas(), evaluation, LAYOUT)
    assert valid.tolist() == [[True, True, False]]
    done = canvas()
    done = attrs.evolve(done, masked=torch.zeros_like(done.masked))
    assert not alike.moves(done, hand_evaluation(), LAYOUT)[3].any()  # nothing masked: no move


def test_a_sampled_move_draws_tokens_at_its_temperature_from_the_node_s_draws() -> None:
    sampled = MacroMove(ordering="confidence", k=6, temperature=1.0)
    assert sampled.statistics == {"uniform", "runner_up", "runner_up_confidence"}
    c = canvas(64)
    eligible = c.masked & c.unlocked(LAYOUT)
    evaluation = attrs.evolve(
        hand_evaluation(64), uniform=torch.rand(64, WIDTH, generator=torch.Generator().manual_seed(0))
    )
    position, token, probability = sampled.commits(c, evaluation, eligible, 0, 6)
    assert (position[:, :6] == torch.arange(2, 8)).all()
    runner = token >= 40
    assert runner.any() and (~runner).any()
    # the runner-up's chance at T = 1 is its probability: about half at column 3 (0.5), none at 7 (0.03)
    share = runner.float().mean(dim=0)
    assert 0.3 < share[1] < 0.7 and share[5] < 0.15
    assert torch.equal(probability, torch.where(runner, 1 - torch.tensor(CONFIDENCE[2:]), torch.tensor(CONFIDENCE[2:])))
    # keyed by each row's own draws: a row alone draws what it draws in the batch; another move index draws apart
    alone = sampled.commits(c.take(torch.tensor([5])), evaluation.take(torch.tensor([5])), eligible[5:6], 0, 6)
    assert torch.equal(alone[1], token[5:6])
    assert not torch.equal(sampled.commits(c, evaluation, eligible, 1, 6)[1], token)
    # the runner-up is never the mask id: a masked position keeps the most likely token there
    masked_runner = attrs.evolve(evaluation, runner_up=torch.full((64, WIDTH), float(MASK)))
    assert (sampled.commits(c, masked_runner, eligible, 0, 6)[1] < 40).all()


def test_positions_drawn_at_alg_temp_are_seeded_and_eligible() -> None:
    move = MacroMove(k=2, alg_temp=0.5)
    c = canvas(32)
    eligible = c.masked & c.unlocked(LAYOUT)
    evaluation = attrs.evolve(
        hand_evaluation(32), uniform=torch.rand(32, WIDTH, generator=torch.Generator().manual_seed(1))
    )
    position, _, _ = move.commits(c, evaluation, eligible, 0, 2)
    assert (position >= 2).all() and len({tuple(p) for p in position.tolist()}) > 1
    assert torch.equal(move.commits(c, evaluation, eligible, 0, 2)[0], position)


def test_moves_are_read_from_yaml() -> None:
    generator = build(compose(["+decoder=mcts_macro"]), "decoder").candidates
    assert isinstance(generator, MacroMoves) and generator.k == 3 and generator.commits == 4
    assert generator.macros[1] == MacroMove(threshold=0.9, k=4) and generator.macros[2].temperature == 1.0
    with pytest.raises(ValueError, match="at least one move"):
        MacroMoves([])


# ------------------------------------------------------------------ mcts_macro end to end


@pytest.mark.parametrize(
    ("setup", "count", "task"), [(SUDOKU, 3, ()), (SUDOKU, 2, ("task.tier=hard",)), (COUNTDOWN, 6, ())]
)
def test_mcts_macro_decodes_with_moves_of_several_commits(setup, count: int, task: tuple[str, ...]) -> None:
    results = decode(setup, "mcts_macro", count=count, task=task)
    assert all(not r.tokens.eq(r.tokens.new_tensor(-1)).any() for r in results)
    # some search committed two or more positions with one move: at one call, at depth 1 and over
    assert any(
        int(torch.bincount(r.commit_call[searched(r)].clamp(min=0)).max()) >= 2 for r in results if searched(r).any()
    )
    assert sum(r.steps for r in results) < sum(r.tokens_committed for r in results)  # fewer steps than commits


def test_mcts_macro_keeps_the_moves_subtrees_with_k_commits() -> None:
    trees = first_trees("mcts_macro", count=2)
    assert trees and all(t.macro and t.commits == 4 and t.actions == 3 for t in trees)
    assert any(int(t.valid[:, 0].sum(dim=1).max()) > 1 for t in trees)  # a choice was searched


@pytest.mark.parametrize("preset", ["mcts_macro", "gumbel_mcts"])
def test_mcts_macro_does_not_depend_on_the_batch_and_repeats_with_the_seed(preset: str) -> None:
    """Countdown problems one at a time and together, and again (Gumbel halving over macro moves: its
    root noise keyed by the move's index)."""
    overrides = () if preset == "mcts_macro" else ("decoder/candidates=macro_moves",)
    alone = decode(COUNTDOWN, preset, *overrides, count=4, batch_size=1)
    together = decode(COUNTDOWN, preset, *overrides, count=4)
    again = decode.__wrapped__(COUNTDOWN, preset, *overrides, count=4)
    for x, y, z in zip(alone, together, again):
        assert record(x) == record(y) == record(z)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_mcts_macro_samples_seeded_and_batch_invariant(family: str) -> None:
    """Temperature > 0: same seed, same tokens, alone or batched; another seed, other tokens."""
    decoder, verifier, adapter = text_decoder("mcts_macro"), NoRepeatVerifier(), adapter_for(family, True)
    requests = requests_for([4, 9, 2], seed=5)

    def tokens(batch, seed: int) -> list[torch.Tensor]:
        engine = RolloutEngine(adapter=adapter, temperature=1.5, seed=seed)
        return [r.tokens for r in decoder.decode(engine, batch, BLOCK, verifier=verifier)]

    batched = tokens(requests, seed=3)
    assert all(torch.equal(a, tokens([r], seed=3)[0]) for a, r in zip(batched, requests))
    assert any(not torch.equal(a, b) for a, b in zip(batched, tokens(requests, seed=4))), "the seed changed nothing"


def test_admitting_and_evicting_change_no_macro_search(adapter: ModelAdapter) -> None:
    """Kept macro subtrees follow their samples when others join (the canvases widen) or leave."""
    decoder, verifier = text_decoder("mcts_macro"), NoRepeatVerifier()
    session = DecodeSession.open(decoder, RolloutEngine(adapter=adapter), 16, 8, verifier)
    first = make_requests([3, 5, 4], 16, seed=1)
    later = renumbered(make_requests([11, 2], 16, seed=2), 100)
    finished, victim = admit_step_evict(session, first, later)
    for sample in [r for r in first + later if r.uid != victim]:
        [alone] = decoder.decode(RolloutEngine(adapter=adapter), [sample], 8, verifier=verifier)
        assert record(finished[sample.uid]) == record(alone), f"sample uid {sample.uid} changed"


def test_mcts_macro_is_refused_on_a_uniform_noise_model() -> None:
    """Like every tree preset: a move commits masked positions, which a uniform-noise model has none of."""
    run = decoding(("countdown_uniform", "countdown"), "mcts_macro")
    with pytest.raises(ValueError, match="uniform noise") as refused:
        run.prepare(run.task.items()[:1])
    assert "\n" not in str(refused.value) and "'mcts_macro'" in str(refused.value)
