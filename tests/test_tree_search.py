"""The tree search in the decode loop (issue 49) with the shipped Sudoku and Countdown models: one
simulation per step without exploration is the base rule; every preset is batch-invariant and
seeded; the budget in row-forwards bounds the search; and the combinations a tree cannot serve
are refused in one line."""

from __future__ import annotations

import functools
import sys

import attrs
import paradigm_models
import pytest
import torch
from conftest import NoRepeatVerifier, admit_step_evict, cached_adapter, make_requests, record, renumbered, text_decoder
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.run import Decoding, request
from dlmsearch.search import driver
from dlmsearch.search.decode import results as results_module
from dlmsearch.search.decode import tree_phases
from dlmsearch.search.decode.calls import evaluate
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.tree import Tree
from dlmsearch.search.session import DecodeSession
from dlmsearch.tasks.base import Task

# mcts with one simulation per step, no exploration and one simulation per wave: its base rule, LLaDA's
ONE_SIMULATION = ("decoder.tree.simulations=1", "decoder.expansion.c=0", "decoder.expansion.parallel=1")
SUDOKU = ("sudoku", "sudoku")
COUNTDOWN = ("countdown", "countdown")
BLOCK_COUNTDOWN = ("countdown_block", "countdown")  # the shipped block-diffusion model: a forward reads one block


@functools.cache
def loaded(model: str, task: str, *task_settings: str) -> tuple[ModelAdapter, Task]:
    """The shipped model and the task (loaded once)."""
    cfg = compose([f"model={model}", f"task={task}", "model.device=cpu", *task_settings])
    return build(cfg, "model"), build(cfg, "task")


def decoding(setup: tuple[str, str], preset: str, *overrides: str, task: tuple[str, ...] = ()) -> Decoding:
    """What the CLI decodes ``+decoder=preset model=.. task=..`` with (the task's verifier included)."""
    model, task_name = setup
    adapter, loaded_task = loaded(model, task_name, *task)
    cfg = compose([f"+decoder={preset}", f"model={model}", f"task={task_name}", "model.device=cpu", *task, *overrides])
    return Decoding(build(cfg, "decoder"), build(cfg, "engine", adapter=adapter), loaded_task)


@functools.cache
def decode(
    setup: tuple[str, str],
    preset: str,
    *overrides: str,
    count: int,
    batch_size: int | None = None,
    task: tuple[str, ...] = (),
) -> list[DecodeResult]:
    """The task's first ``count`` items, ``batch_size`` at a time (item ``i`` keyed as the ``i``-th of a run)."""
    run = decoding(setup, preset, *overrides, task=task)
    items = run.task.items()[:count]
    size = batch_size or count
    results: list[DecodeResult] = []
    for start in range(0, count, size):
        uids = list(range(start, min(count, start + size)))
        results += run.results(run.decoder, [items[i] for i in uids], uids)
    return results


def counters(result: DecodeResult) -> tuple[int, int, int]:
    return result.steps, result.row_forwards, result.token_forwards


# ------------------------------------------------------------------ one simulation, no exploration = the base rule


@pytest.mark.parametrize(
    ("setup", "count", "task"),
    [(SUDOKU, 3, ()), (SUDOKU, 2, ("task.tier=hard",)), (COUNTDOWN, 8, ())],
    ids=["sudoku-easy", "sudoku-hard", "countdown-small"],
)
def test_one_simulation_without_exploration_is_the_base_rule(setup, count: int, task: tuple[str, ...]) -> None:
    """The tree's one child per step is the base rule's most confident position with the model's
    token, and its forward is the one the base rule would spend on the next step."""
    base = decode(setup, "llada", count=count, task=task)
    tree = decode(setup, "mcts", *ONE_SIMULATION, count=count, task=task)
    for x, y in zip(base, tree):
        assert torch.equal(x.tokens, y.tokens)
        assert counters(x) == counters(y)
        assert int(searched(y).sum()) > y.tokens_committed // 2  # the search made the moves


@settings(max_examples=10, deadline=None)
@given(
    prompts=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    blocks=st.sampled_from([(16, 8), (16, 4), (12, 12)]),
    fixed=st.integers(0, 3),
    seed=st.integers(0, 1000),
)
def test_one_simulation_without_exploration_is_the_base_rule_on_tiny_models(
    adapter: ModelAdapter, prompts: list[int], blocks: tuple[int, int], fixed: int, seed: int
) -> None:
    gen_length, block_length = blocks
    requests = make_requests(prompts, gen_length, seed=seed, fixed=fixed)
    base = text_decoder("llada", gen_length=gen_length).decode(RolloutEngine(adapter=adapter), requests, block_length)
    tree = text_decoder("mcts", *ONE_SIMULATION, gen_length=gen_length)
    for x, y in zip(base, tree.decode(RolloutEngine(adapter=adapter), requests, block_length)):
        assert torch.equal(x.tokens, y.tokens) and counters(x) == counters(y)


def test_one_simulation_without_exploration_is_the_base_rule_on_a_block_model() -> None:
    case = "block/none"
    requests, block = paradigm_models.requests(case, seed=5), paradigm_models.block_length(case)
    base = paradigm_models.decoder(case, "llada").decode(paradigm_models.engine(case), requests, block)
    tree = paradigm_models.decoder(case, "mcts", *ONE_SIMULATION).decode(paradigm_models.engine(case), requests, block)
    for x, y in zip(base, tree):
        assert torch.equal(x.tokens, y.tokens) and counters(x) == counters(y)


def test_the_block_cache_keeps_writing_under_a_tree_search() -> None:
    """A move that finishes a block has the next root evaluated after the cache's write (an adopted
    node's evaluation would never write it): the same tokens as without a cache, at fewer token-forwards
    per row-forward than a canvas forwarded whole."""
    uncached, cached = (
        paradigm_models.decoder(case, "mcts").decode(
            paradigm_models.engine(case),
            paradigm_models.requests(case, seed=5),
            paradigm_models.block_length(case),
        )
        for case in ("block/none", "block/block")
    )
    for plain, stored in zip(uncached, cached):
        assert torch.equal(plain.tokens, stored.tokens)
        assert stored.token_forwards * plain.row_forwards < plain.token_forwards * stored.row_forwards / 2


# ------------------------------------------------------------------ batch invariance and seeds

PRESETS = [
    ("mcts", ()),
    ("mcts", ("decoder.tree.simulations=6", "decoder.expansion.parallel=2")),  # three waves: backups between them
    ("mcts_verified", ()),
    ("gumbel_mcts", ()),
    ("gumbel_mcts", ("decoder.tree.simulations=8",)),  # two halving phases
    ("mcts_verified", ("decoder.tree.completion_steps=2",)),  # leaves completed in steps, each a forward
]


@pytest.mark.parametrize(
    ("preset", "overrides"), PRESETS, ids=lambda p: p if isinstance(p, str) else "-".join(p) or "preset"
)
def test_tree_presets_do_not_depend_on_the_batch_and_repeat_with_the_seed(
    preset: str, overrides: tuple[str, ...]
) -> None:
    """Four Countdown problems (different numbers and targets) one at a time and four together, and again."""
    alone = decode(COUNTDOWN, preset, *overrides, count=4, batch_size=1)
    together = decode(COUNTDOWN, preset, *overrides, count=4)
    again = decode.__wrapped__(COUNTDOWN, preset, *overrides, count=4)  # not the cached decode
    for x, y, z in zip(alone, together, again):
        assert record(x) == record(y) == record(z)


def test_mcts_verified_on_hard_sudoku_is_batch_invariant() -> None:
    """Partial-rule checks (a conflict is a terminal loss) and verified leaves, where puzzles differ."""
    hard = ("task.tier=hard",)
    alone = decode(SUDOKU, "mcts_verified", count=3, batch_size=1, task=hard)
    together = decode(SUDOKU, "mcts_verified", count=3, task=hard)
    for x, y in zip(alone, together):
        assert record(x) == record(y)


def test_a_verified_leaf_commits_the_completion_its_verifier_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """With leaves completed in steps, a search that commits a verified leaf ends its sample with that
    leaf's stored completion, which the verifier accepts; each step is a row-forward, and every call's
    charge, the steps' included, reaches the results."""
    hard, steps = ("task.tier=hard",), ("decoder.tree.completion_steps=4", "decoder.tree.budget=240")
    run = decoding(SUDOKU, "mcts_verified", *steps, task=hard)
    charged: dict[str, int] = {}  # row-forwards each call charged, by the function that asked for it

    def counted(engine, state, usage, *args, **kwargs):
        evaluation, after = evaluate(engine, state, usage, *args, **kwargs)
        caller = sys._getframe(1).f_code.co_name
        charged[caller] = charged.get(caller, 0) + int((after.row_forwards - usage.row_forwards).sum())
        return evaluation, after

    for module in (driver, tree_phases, results_module):
        monkeypatch.setattr(module, "evaluate", counted)
    items = run.task.items()[:6]
    verifier = run.task.verifier([i.question for i in items])
    searches: list = []
    results = run.decoder.decode(
        run.engine,
        [request(j, item) for j, item in enumerate(items)],
        run.task.block_length,
        verifier=verifier,
        on_lookahead=searches.append,
    )
    committed = 0
    for search in searches:
        for s, (slot, chosen) in enumerate(zip(search.slots.tolist(), search.chosen.tolist())):
            if chosen > 0 and bool(search.tree.accepted[s, chosen]):
                region = search.tree.completion[s, chosen, -81:]
                assert results[slot].tokens[-81:].tolist() == region.tolist()
                assert bool(verifier.accepts(torch.tensor([slot]), region[None]))
                committed += 1
    assert committed > 0
    assert charged.get("_completed", 0) > 0  # completion steps ran, and their charge reached the results:
    assert sum(r.row_forwards for r in results) == sum(charged.values())


def test_a_completion_stops_at_the_step_that_breaks_the_task_s_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leaf's completion in steps evaluates no canvas that already breaks the task's rules (a Sudoku
    conflict: it can never be accepted), so such a completion costs no more forwards."""
    run = decoding(SUDOKU, "mcts_verified", "decoder.tree.completion_steps=4", task=("task.tier=hard",))
    items = run.task.items()[:4]
    verifier = run.task.verifier([i.question for i in items])
    evaluate, completion_rows = tree_phases.evaluate, []

    def watched(engine, state, usage, canvas, slot, key):  # the phase's own signature
        if sys._getframe(1).f_code.co_name == "_completed":
            region = slice(state.layout.gen_start, state.layout.width)
            owner = state.slots.owner[slot]
            assert bool(verifier.consistent(owner, canvas.tokens[:, region], canvas.masked[:, region]).all())
            completion_rows.append(len(slot))
        return evaluate(engine, state, usage, canvas, slot, key)

    monkeypatch.setattr(tree_phases, "evaluate", watched)
    requests = [request(j, item) for j, item in enumerate(items)]
    run.decoder.decode(run.engine, requests, run.task.block_length, verifier=verifier)
    assert sum(completion_rows) > 0


@pytest.mark.parametrize("preset", ["mcts", "gumbel_mcts", "mcts_verified"])
def test_admitting_and_evicting_change_no_sample_s_search(adapter: ModelAdapter, preset: str) -> None:
    """Kept subtrees follow their samples when others join (a longer prompt: the canvases widen) or leave."""
    decoder, verifier = text_decoder(preset), NoRepeatVerifier()
    session = DecodeSession.open(decoder, RolloutEngine(adapter=adapter), 16, 8, verifier)
    first = make_requests([3, 5, 4], 16, seed=1)
    later = renumbered(make_requests([11, 2], 16, seed=2), 100)
    finished, victim = admit_step_evict(session, first, later)
    for sample in [r for r in first + later if r.uid != victim]:
        [alone] = decoder.decode(RolloutEngine(adapter=adapter), [sample], 8, verifier=verifier)
        assert record(finished[sample.uid]) == record(alone), f"{preset}: sample uid {sample.uid} changed"


def first_trees(preset: str, *overrides: str, count: int) -> list[Tree]:
    """The tree of each search of a decode of the first ``count`` Countdown problems together."""
    run = decoding(COUNTDOWN, preset, *overrides)
    items = run.task.items()[:count]
    seen: list[Tree] = []
    verifier = run.task.verifier([i.question for i in items])
    requests = [request(j, item) for j, item in enumerate(items)]
    run.decoder.decode(
        run.engine, requests, run.task.block_length, verifier=verifier, on_lookahead=lambda s: seen.append(s.tree)
    )
    return seen


def test_a_search_continues_the_subtree_its_last_search_kept() -> None:
    """Four simulations per search: a root with more than four visits carried some over."""
    trees = first_trees("mcts", count=2)
    assert trees[0].visits[:, 0].tolist() == [4, 4]  # the first search: a new tree
    assert any(int(tree.visits[:, 0].max()) > 4 for tree in trees[1:])


def test_the_gumbel_noise_is_keyed_by_the_seed_and_not_by_the_batch() -> None:
    together = first_trees("gumbel_mcts", count=3)[0]
    assert together.trees == 3 and together.considered.any(dim=1).all()
    for index in range(3):
        run = decoding(COUNTDOWN, "gumbel_mcts")
        item = run.task.items()[index]
        seen: list[Tree] = []
        run.decoder.decode(
            run.engine, [request(index, item)], run.task.block_length, on_lookahead=lambda s: seen.append(s.tree)
        )
        assert torch.equal(seen[0].gumbel[0], together.gumbel[index])
    assert torch.equal(first_trees("gumbel_mcts", count=3)[0].gumbel, together.gumbel)
    other = first_trees("gumbel_mcts", "seed=1", count=3)[0]
    assert not torch.equal(other.gumbel, together.gumbel)


# ------------------------------------------------------------------ the budget


def searched(result: DecodeResult) -> torch.Tensor:
    """``[n]`` the generation positions the search committed (depth 1 and deeper; the base rule's are depth 0)."""
    return (result.commit_call >= 0) & (result.commit_depth >= 1)


def base_commits(result: DecodeResult) -> int:
    return int(((result.commit_call >= 0) & (result.commit_depth == 0)).sum())


def test_a_budget_of_one_row_forward_is_the_base_rule_and_of_two_one_search() -> None:
    base = decode(SUDOKU, "llada", count=2)
    # the root's own evaluation spends the one row-forward: no search at all
    for x, y in zip(base, decode(SUDOKU, "mcts", "decoder.tree.budget=1", count=2)):
        assert record(x)[0] == record(y)[0] and counters(x) == counters(y)
        assert int(searched(y).sum()) == 0
    # two: one search of one simulation, whose evaluation the base rule's next step reuses
    for x, y in zip(base, decode(SUDOKU, "mcts", "decoder.tree.budget=2", count=2)):
        assert int(searched(y).sum()) == 1
        assert y.row_forwards == x.row_forwards and y.tokens_committed == x.tokens_committed


@pytest.mark.parametrize("budget", [5, 13, 40])
def test_the_search_stops_once_its_budget_is_spent(budget: int) -> None:
    """Row-forwards never exceed the budget by more than the base rule's steps after it; an
    unbudgeted search spends more."""
    free = decode(SUDOKU, "mcts", count=2)
    budgeted = decode(SUDOKU, "mcts", f"decoder.tree.budget={budget}", count=2)
    for unlimited, result in zip(free, budgeted):
        assert unlimited.row_forwards > budget + base_commits(result)
        assert result.row_forwards <= budget + base_commits(result)
        assert 1 <= int(searched(result).sum()) < result.tokens_committed  # it searched, and the base rule finished
        assert not (result.tokens == 9).any()


def test_a_budget_bounds_the_verified_search_too() -> None:
    budget = 6
    for result in decode(COUNTDOWN, "mcts_verified", f"decoder.tree.budget={budget}", count=4):
        assert result.row_forwards <= budget + base_commits(result)


@pytest.mark.parametrize("budget", [7, 20])
def test_a_budget_bounds_a_search_whose_leaves_complete_in_steps(budget: int) -> None:
    """A leaf completed in ``m`` steps may cost ``1 + m`` row-forwards: a search runs only the
    simulations whose cost the budget still covers (it once ran all of them and overspent 2.8-fold)."""
    settings = (f"decoder.tree.budget={budget}", "decoder.tree.completion_steps=4", "decoder.tree.simulations=8")
    results = decode(COUNTDOWN, "mcts_verified", *settings, "decoder.expansion.parallel=8", count=4)
    assert any(int(searched(r).sum()) for r in results)
    for result in results:
        assert result.row_forwards <= budget + base_commits(result)


@pytest.mark.parametrize(
    ("every_step_above", "trigger"), [("0", "always"), ("100", "unsure")], ids=["always", "never-rich"]
)
def test_a_rich_budget_searches_every_step_and_a_poor_one_where_the_trigger_fires(
    every_step_above: str, trigger: str
) -> None:
    """``decoder.tree.every_step_above=0``: every sample with budget left is rich, so the tree searches
    at every step, as the ``always`` trigger does; a threshold no budget reaches leaves the trigger alone."""
    budget, alone = "decoder.tree.budget=24", "decoder.tree.every_step_above=null"  # the trigger alone
    rich = decode(COUNTDOWN, "mcts_verified", budget, f"decoder.tree.every_step_above={every_step_above}", count=4)
    plain = decode(COUNTDOWN, "mcts_verified", budget, alone, f"decoder/trigger={trigger}", count=4)
    for x, y in zip(rich, plain):
        assert record(x) == record(y)
    if trigger == "always":  # and the two triggers differ here, so the equality says something
        unsure = decode(COUNTDOWN, "mcts_verified", budget, alone, count=4)
        assert [record(x) for x in unsure] != [record(y) for y in plain]


@pytest.mark.parametrize("budget", [12, 40])
def test_a_budget_bounds_a_search_whose_leaves_complete_block_by_block(budget: int) -> None:
    """On a block-diffusion model a leaf's completion evaluates each later block: the budget reserves
    those forwards too, so a search still spends no more than it allows."""
    results = decode(BLOCK_COUNTDOWN, "mcts_verified", f"decoder.tree.budget={budget}", count=4)
    assert any(int(searched(r).sum()) for r in results)
    for result in results:
        assert result.row_forwards <= budget + base_commits(result)


def test_a_leaf_on_a_block_model_is_completed_through_its_later_blocks() -> None:
    """A block-diffusion model's forward summarises only the block it decodes (the exact block cache),
    so a leaf's completion evaluates each later block in turn: every completion is a whole answer the
    verifier can judge. Before, later blocks kept the mask id, every leaf's value was 0 and the tree
    decoded as ``llada`` did."""
    run = decoding(BLOCK_COUNTDOWN, "mcts_verified")
    items = run.task.items()[:3]
    verifier = run.task.verifier([i.question for i in items])
    searches: list = []
    run.decoder.decode(
        run.engine,
        [request(j, item) for j, item in enumerate(items)],
        run.task.block_length,
        verifier=verifier,
        on_lookahead=searches.append,
    )
    for search in searches:  # every leaf (the roots aside) read a completion with a likelihood: none unevaluated
        tree = search.tree
        assert bool((tree.value[:, 1:][tree.expanded[:, 1:]] > 0).all())
    first = searches[0].tree  # the first block's search: the answer's later blocks are not in its forward
    assert bool(first.accepted.any())  # and yet its leaves' whole answers were judged, some accepted


@pytest.mark.parametrize("sampling", [(), ("engine.temperature=1.0", "seed=3")], ids=["greedy", "sampled"])
def test_tree_search_on_a_block_model_does_not_depend_on_the_batch(sampling: tuple[str, ...]) -> None:
    """Leaves completed block by block, each block a forward against the slot's stored prefix (sampled:
    each block's draws keyed by the leaf's node)."""
    settings = ("decoder.tree.budget=60", *sampling)
    alone = decode(BLOCK_COUNTDOWN, "mcts_verified", *settings, count=4, batch_size=1)
    together = decode(BLOCK_COUNTDOWN, "mcts_verified", *settings, count=4)
    for x, y in zip(alone, together):
        assert record(x) == record(y)


# ------------------------------------------------------------------ refusals (plan rule 21 and make_plan)


def refusal(decoder, engine: RolloutEngine, verifier: object = "none") -> str:
    with pytest.raises(ValueError) as refused:
        decoder.plan(engine, 16, 8, None if verifier == "none" else verifier)
    message = str(refused.value)
    assert "\n" not in message, message
    return message


def test_a_uniform_noise_model_is_refused() -> None:
    """``+decoder=mcts model=countdown_uniform task=countdown``: refused before any forward, naming uniform noise."""
    run = decoding(("countdown_uniform", "countdown"), "mcts")
    with pytest.raises(ValueError) as refused:
        run.prepare(run.task.items()[:1])
    message = str(refused.value)
    assert "\n" not in message and "uniform noise" in message and "'mcts'" in message


@pytest.mark.parametrize("cache", ["dllm_cache", "prefix", "dual"])
def test_a_stale_cache_is_refused(cache: str) -> None:
    """Fast-dLLM's prefix and dual caches are approximate too: after an adoption the root is not evaluated
    again, so their windows would never refresh and the tree's values would read stale keys."""
    message = refusal(text_decoder("mcts"), RolloutEngine(adapter=cached_adapter(), cache=cache))
    assert f"cache={cache}" in message and "stale" in message and "cache=none" in message


def test_a_verified_value_on_a_free_text_task_is_refused() -> None:
    """A free-text task's verifier extracts answers but never accepts one: a verified value would read
    zeros and the search would run on half the likelihood, silently."""
    from dlmsearch.tasks.text import AnswerVerifier

    verifier = AnswerVerifier(decode=lambda row: "")
    message = refusal(text_decoder("mcts_verified"), RolloutEngine(adapter=cached_adapter()), verifier)
    assert "verifier" in message and "likelihood_value" in message


def test_a_verified_value_without_a_verifier_is_refused() -> None:
    message = refusal(text_decoder("mcts_verified"), RolloutEngine(adapter=cached_adapter()))
    assert "verifier" in message and "likelihood_value" in message
    text_decoder("mcts").plan(RolloutEngine(adapter=cached_adapter()), 16, 8, None)  # the likelihood needs none


def test_a_population_or_a_revision_with_a_tree_is_refused() -> None:
    engine = RolloutEngine(adapter=cached_adapter())
    message = refusal(text_decoder("mcts", "+decoder/population=best_of_n"), engine)
    assert "tree per sample" in message and "`'~decoder.population'`" in message
    # a revision: refused by the lookahead-over-revision rule before rule 21 (every tree's trigger explores)
    revised = attrs.evolve(text_decoder("mcts"), revision=text_decoder("rcr").revision)
    assert "revises commits" in refusal(revised, engine)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("decoder/expansion=fixed_depth", "decoder/expansion"),
        ("decoder/selector=best_score", "decoder/selector"),
        ("decoder/trigger=never", "trigger"),
    ],
)
def test_parts_that_cannot_search_a_tree_are_refused(override: str, named: str) -> None:
    message = refusal(text_decoder("mcts", override), RolloutEngine(adapter=cached_adapter()))
    assert "decoder.tree" in message and named in message
