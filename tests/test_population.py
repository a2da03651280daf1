"""Width search: populations of particles in the one decode loop (tiny models, one thread)."""

from __future__ import annotations

import attrs
import paradigm_models
import pytest
import torch
from conftest import MASK_ID, NoRepeatVerifier, make_requests, record, text_decoder
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import ConfigError, build, compose, decoder_presets
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.run import Decoding
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.width.diversity import DistinctFirst, OrderTemperature, TokenTemperature
from dlmsearch.search.width.final_choice import Finalists, MajorityVote
from dlmsearch.search.width.population import Population
from dlmsearch.search.width.population_hook import SinglePath
from dlmsearch.search.width.resampling import KeepBest, ResamplingPoint, SMCResampling
from dlmsearch.tasks.countdown import CountdownProblem, CountdownVerifier
from dlmsearch.tasks.sudoku import SudokuTask, grids_to_tokens

WIDTH_PRESETS = ("best_of_n", "beam", "smc", "verified_best_of_n", "beam_adalook")


def decode(decoder, adapter: ModelAdapter, requests, block_length: int = 8, **engine):
    return decoder.decode(RolloutEngine(adapter=adapter, **engine), requests, block_length, verifier=NoRepeatVerifier())


def counters(result) -> tuple:
    return result.steps, result.row_forwards, result.token_forwards


def test_width_presets_exist() -> None:
    assert set(WIDTH_PRESETS) <= set(decoder_presets())


@settings(max_examples=20, deadline=None)
@given(
    preset=st.sampled_from(WIDTH_PRESETS),
    prompts=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    seed=st.integers(0, 500),
)
def test_a_population_of_one_is_the_plain_decoder(
    adapter: ModelAdapter, preset: str, prompts: list[int], seed: int
) -> None:
    requests = make_requests(prompts, 16, seed=seed, fixed=2)
    plain, reference = one_particle(text_decoder(preset))
    for x, y in zip(decode(plain, adapter, requests), decode(reference, adapter, requests)):
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.commit_call, y.commit_call)
        assert counters(x) == counters(y) and x.population == y.population


def one_particle(decoder):
    """The width preset ``decoder`` with a population of one particle that nothing ends early, and
    the same decoder with no population at all (the driver's default): the two must decode as one."""
    plain = attrs.evolve(
        decoder, population=attrs.evolve(decoder.population, size=1, prune_conflicts=False, stop_when_accepted=False)
    )
    plain = attrs.evolve(plain, population=Population()) if plain.population.choice.needs_verifier else plain
    return plain, attrs.evolve(plain, population=SinglePath())


@pytest.mark.parametrize("preset", ["best_of_n", "smc", "beam"])
@pytest.mark.parametrize("case", sorted(paradigm_models.CASES))
def test_a_population_of_one_is_the_plain_decode_on_every_paradigm_and_cache(case: str, preset: str) -> None:
    """Masked (every cache policy kind), block diffusion (with and without its exact cache) and uniform noise."""
    plain, reference = one_particle(paradigm_models.decoder(case, preset))
    requests, block = paradigm_models.requests(case, seed=4), paradigm_models.block_length(case)
    got = plain.decode(paradigm_models.engine(case), requests, block)
    expected = reference.decode(paradigm_models.engine(case), requests, block)
    assert [record(r) for r in got] == [record(r) for r in expected]


def with_population(preset: str, population: Population):
    return attrs.evolve(text_decoder(preset), population=population)


POPULATIONS = {
    "order": Population(size=4, diversity=OrderTemperature(temperature=0.5)),
    "tokens": Population(size=3, diversity=TokenTemperature(temperature=1.0)),
    "beam": Population(size=4, diversity=DistinctFirst(uncertain_below=0.9), resampling=KeepBest(keep=2)),
    "smc": Population(
        size=4,
        diversity=OrderTemperature(temperature=0.5),
        resampling=SMCResampling(temperature=0.05, ess_fraction=1.0),
    ),
}


@pytest.mark.parametrize("name", sorted(POPULATIONS))
@pytest.mark.parametrize("preset", ["fast_dllm", "llada", "adalook"])
def test_populations_do_not_depend_on_batch_or_row_budget(adapter: ModelAdapter, name: str, preset: str) -> None:
    decoder = with_population(preset, POPULATIONS[name])
    requests = make_requests([3, 0, 5], 16, seed=3, fixed=2)
    together = decode(decoder, adapter, requests)
    chunked = decode(decoder, adapter, requests, row_budget=3)
    for index, request in enumerate(requests):
        [alone] = decode(decoder, adapter, [request])
        for other in (together[index], chunked[index]):
            assert torch.equal(alone.tokens, other.tokens)
            assert counters(alone) == counters(other)
    again = decode(decoder, adapter, requests)
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(together, again)), "same seed, different output"


def test_particles_diverge_and_identical_ones_cost_one_row(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 0, 5, 2], 16, seed=7)
    base = decode(text_decoder("fast_dllm"), adapter, requests)
    # never uncertain: the four particles stay one canvas and are forwarded once
    same = decode(
        with_population("fast_dllm", Population(size=4, diversity=DistinctFirst(uncertain_below=0.0))),
        adapter,
        requests,
    )
    for a, b in zip(base, same):
        assert torch.equal(a.tokens, b.tokens) and counters(a) == counters(b)
    # always uncertain at first: the particles split, and pay for their own rows
    split = decode(
        with_population("fast_dllm", Population(size=4, diversity=DistinctFirst(uncertain_below=1.0))),
        adapter,
        requests,
    )
    assert sum(r.row_forwards for r in split) > sum(r.row_forwards for r in base)
    assert all(r.row_forwards <= 4 * r.steps for r in split)
    assert all(r.population.live_particles <= 4 for r in split)


def test_token_temperature_particles_differ_from_the_greedy_one(adapter: ModelAdapter) -> None:
    requests = make_requests([2, 4], 16, seed=1)
    decoder = with_population("fast_dllm", Population(size=4, diversity=TokenTemperature(temperature=2.0)))
    seen = []
    decoder.decode(
        RolloutEngine(adapter=adapter), requests, 8, on_round=lambda canvas, source: seen.append(canvas.tokens.clone())
    )
    final = seen[-1].view(2, 4, -1)
    assert any(len({tuple(p.tolist()) for p in sample}) > 1 for sample in final), (
        "token temperature made no particle differ"
    )


def test_verifier_ends_conflicting_particles_and_stops_accepted_samples(adapter: ModelAdapter) -> None:
    requests = make_requests([3, 0, 5, 2], 16, seed=2)
    decoder = with_population(
        "fast_dllm",
        Population(
            size=4,
            diversity=OrderTemperature(temperature=1.0),
            prune_conflicts=True,
            stop_when_accepted=True,
            choice=MajorityVote(),
        ),
    )
    results = decode(decoder, adapter, requests)
    verifier = NoRepeatVerifier()
    assert all(r.population.accepted is not None for r in results)
    for r in results:
        assert bool(verifier.accepts(torch.zeros(1), r.tokens[None])[0]) == r.population.accepted
    with pytest.raises(ValueError, match="needs a task verifier"):
        decoder.decode(RolloutEngine(adapter=adapter), requests, 8)


def test_keep_best_keeps_the_best_distinct_canvases() -> None:
    scores = torch.tensor([[0.0, 5.0, 5.0, 1.0]])
    tokens = torch.tensor([[[1], [2], [2], [3]]])  # particles 1 and 2 hold the same canvas
    point = ResamplingPoint(
        scores, torch.zeros_like(scores), torch.ones(1, 4, dtype=torch.bool), tokens, torch.zeros(1)
    )
    source = KeepBest(keep=2).sources(point)
    # Particle 2 repeats particle 1's canvas, so the two best distinct ones are 1 (score 5) and
    # 3 (score 1), best first. The rule (resampling._fill): survivors keep their own slots, and
    # the other slots, in slot order, copy the survivors in turn, best first: slot 0 takes 1,
    # slot 2 takes 3. [[3, 1, 1, 3]] would give the first free slot the worse survivor.
    assert source.tolist() == [[1, 1, 3, 3]]


def test_smc_resamples_towards_the_weights() -> None:
    scores = torch.tensor([[0.0, 10.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    point = ResamplingPoint(
        scores,
        torch.zeros_like(scores),
        torch.ones(2, 4, dtype=torch.bool),
        torch.zeros(2, 4, 1),
        torch.tensor([0.5, 0.5]),
    )
    source = SMCResampling(temperature=0.1).sources(point)
    assert source[0].tolist() == [1, 1, 1, 1]
    assert source[1].tolist() == [0, 1, 2, 3], "equal weights: nothing to resample"


def test_majority_vote_picks_the_most_stated_answer() -> None:
    class Answers:
        def answers(self, sample, tokens):
            return [str(int(t[0])) for t in tokens]

    tokens = torch.tensor([[[7], [3], [3], [9]]])
    scores = torch.tensor([[9.0, 1.0, 2.0, 8.0]])
    finalists = Finalists(scores, torch.ones(1, 4, dtype=torch.bool), torch.zeros(1, 4, dtype=torch.bool), tokens)
    chosen = MajorityVote().choose(finalists, Answers())
    assert chosen.tolist() == [2]


def test_sudoku_verifier_checks_rules_and_clues() -> None:
    task = SudokuTask(tier="easy", limit=2)
    items = task.items()
    verifier = task.verifier([i.question for i in items])
    solution = grids_to_tokens(items[0].reference.solution[None])
    assert verifier.accepts(torch.tensor([0]), solution).tolist() == [True]
    assert verifier.accepts(torch.tensor([1]), solution).tolist() == [False], "another puzzle's clues are not kept"
    swapped = solution.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    blank = items[0].generation[None]
    open_cells = (blank[0] == 9).nonzero().flatten()[:2]
    partial = blank.clone()  # the clues and two open cells filled from the solution
    partial[0, open_cells] = solution[0, open_cells]
    assert verifier.consistent(torch.tensor([0]), partial, partial == 9).tolist() == [True]
    row = blank[0, 9 * (int(open_cells[1]) // 9) :][:9]
    repeated = partial.clone()  # the second open cell now repeats a clue of its row
    repeated[0, open_cells[1]] = row[row != 9][0]
    assert verifier.consistent(torch.tensor([0]), repeated, repeated == 9).tolist() == [False]
    assert verifier.accepts(torch.tensor([0]), swapped).tolist() == [False]
    blank = items[0].generation[None]
    assert verifier.consistent(torch.tensor([0]), blank, blank == 9).tolist() == [True]


def test_countdown_verifier_checks_numbers_and_target() -> None:
    texts = {1: "<answer>(1 + 2) * 3</answer>", 2: "<answer>1 + 2 + 3</answer>", 3: "<answer>(1 + 2) * 4</answer>"}
    verifier = CountdownVerifier(lambda row: texts[int(row[0])], (CountdownProblem(numbers=(1, 2, 3), target=9),))
    tokens = torch.tensor([[1], [2], [3]])
    assert verifier.accepts(torch.zeros(3, dtype=torch.long), tokens).tolist() == [True, False, False]
    assert verifier.answers(torch.zeros(3, dtype=torch.long), tokens) == ["9", None, None]


class Unreadable:
    """A reference that fails the moment anything reads it."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the verifier read the reference answer ({name})")


def test_verifiers_never_see_the_reference() -> None:
    cfg = compose(["+decoder=verified_best_of_n", "task.limit=3"])
    task = build(cfg, "task")
    items = [attrs.evolve(i, reference=Unreadable()) for i in task.items()]
    engine = build(cfg, "engine", adapter=build(cfg, "model"))
    decoding = Decoding(build(cfg, "decoder"), engine, task)
    results = decoding.results(decoding.decoder, items, [0, 1, 2])
    assert all(r.population.accepted is not None for r in results)


def test_scores_compose_in_yaml_and_bad_terms_fail_clearly() -> None:
    decoder = build(compose(["+decoder=best_of_n", "decoder/population/score=hybrid"]), "decoder")
    assert [type(t).__name__ for t in decoder.population.score.terms] == ["LogProbability", "RepetitionPenalty"]
    with pytest.raises(ConfigError, match="reduce"):
        build(compose(["+decoder=best_of_n", "decoder.population.score.terms.0.reduce=median"]), "decoder")
    with pytest.raises(ConfigError, match="size"):
        build(compose(["+decoder=beam", "decoder.population.size=0"]), "decoder")


@pytest.mark.slow
def test_width_search_on_the_shipped_sudoku_model() -> None:
    """The verifier-guided population solves puzzles the plain rule does not, and says how."""
    from dlmsearch.run import run

    def summary(preset: str, out: str) -> dict:
        return run(
            compose(
                [
                    f"+decoder={preset}",
                    "task.tier=hard",
                    "task.limit=16",
                    "batch_size=16",
                    f"out_dir={out}",
                    "examples=0",
                ]
            )
        )

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        plain = summary("fast_dllm", f"{tmp}/plain")
        verified = summary("verified_best_of_n", f"{tmp}/verified")
    assert plain["mean_live_particles"] == 1.0
    assert 1.0 < verified["mean_live_particles"] <= 4.0
    assert verified["accuracy"] >= plain["accuracy"]


def test_the_models_recheck_is_counted_as_one_more_step(adapter: ModelAdapter) -> None:
    from dlmsearch.search.width.particle_scores import LogProbability, RemaskAgreement, WeightedSum

    requests = make_requests([3, 0, 5], 16, seed=4)
    population = Population(size=4, diversity=OrderTemperature(temperature=1.0))
    plain = decode(with_population("fast_dllm", population), adapter, requests)
    score = WeightedSum([LogProbability(weight=0.0), RemaskAgreement(groups=2)])
    rechecked = decode(with_population("fast_dllm", attrs.evolve(population, score=score)), adapter, requests)
    assert any(r.steps == p.steps + 1 for r, p in zip(rechecked, plain)), (
        "no sample was rechecked: the test proves nothing"
    )
    for r, p in zip(rechecked, plain):
        extra_rows = r.row_forwards - p.row_forwards
        # one row per group and distinct complete particle (particles holding one canvas share their rows)
        assert (r.steps - p.steps, extra_rows) == (0, 0) or (r.steps - p.steps == 1 and 2 <= extra_rows <= 8)


populations = st.fixed_dictionaries(
    {
        "size": st.integers(1, 4),
        "diversity": st.sampled_from(
            [OrderTemperature(temperature=0.5), TokenTemperature(temperature=1.0), DistinctFirst(uncertain_below=0.9)]
        ),
        "resampling": st.sampled_from(
            [None, KeepBest(keep=1), KeepBest(keep=2, every=2), SMCResampling(temperature=0.1, ess_fraction=1.0)]
        ),
        "prune": st.booleans(),
        "stop": st.booleans(),
    }
)


@settings(max_examples=20, deadline=None)
@given(
    config=populations,
    preset=st.sampled_from(["fast_dllm", "llada", "ete", "adalook"]),
    prompts=st.lists(st.integers(0, 5), min_size=1, max_size=3),
    seed=st.integers(0, 300),
)
def test_population_invariants(adapter: ModelAdapter, config: dict, preset: str, prompts: list[int], seed: int) -> None:
    """Within every particle's lineage unmasking is monotonic and no committed or given cell
    changes; results do not depend on the batch or on how rows are chunked into calls."""
    from dlmsearch.search.width.resampling import NoResampling

    population = Population(
        size=config["size"],
        diversity=config["diversity"],
        resampling=config["resampling"] or NoResampling(),
        prune_conflicts=config["prune"],
        stop_when_accepted=config["stop"],
    )
    decoder = with_population(preset, population)
    requests = make_requests(prompts, 16, seed=seed, fixed=2)
    canvases, sources = [], []
    results = decoder.decode(
        RolloutEngine(adapter=adapter),
        requests,
        8,
        verifier=NoRepeatVerifier(),
        on_round=lambda canvas, source: (canvases.append(canvas), sources.append(source)),
    )
    for before, after, source in zip(canvases, canvases[1:], sources[1:]):
        if source is not None:
            before = before.take(source)
        assert not (after.masked & ~before.masked).any(), "a position was re-masked"
        kept = ~before.masked & before.attention
        assert torch.equal(after.tokens[kept], before.tokens[kept]), "a committed token changed"
    for request, result in zip(requests, results):
        given_cells = request.generation != MASK_ID
        assert torch.equal(result.tokens[given_cells], request.generation[given_cells])
        assert not (result.tokens == MASK_ID).any()
    chunked = decode(decoder, adapter, requests, row_budget=2)
    [alone] = decode(decoder, adapter, requests[-1:])
    for other in (chunked[-1], results[-1]):
        assert torch.equal(alone.tokens, other.tokens) and counters(alone) == counters(other)


def test_pruning_needs_a_verifier_of_partial_outputs() -> None:
    from dlmsearch.tasks.text import AnswerVerifier

    with pytest.raises(ValueError, match="decoder.population.prune_conflicts=auto"):
        Population(size=2, prune_conflicts=True).for_verifier(AnswerVerifier(lambda row: ""))
    Population(size=2, stop_when_accepted=True).for_verifier(AnswerVerifier(lambda row: ""))


def test_klass_keeps_every_particles_history(adapter: ModelAdapter) -> None:
    """KLASS inside a population: every particle's own canvas stores its step's distributions
    (``is_root``), not only particle 0's (issue 36: the others compared against zeros forever, so
    their tokens were never stable and they fell back to LLaDA's split)."""
    from dlmsearch.search.session import DecodeSession

    decoder = with_population("klass", Population(size=2, diversity=OrderTemperature(temperature=0.0)))
    session = DecodeSession.open(decoder, RolloutEngine(adapter=adapter), 16, 8)
    session.admit(make_requests([3, 0, 5], 16, seed=1, fixed=2))
    session.step()
    history = session.state.memory.history.probs
    stored = history.flatten(1).abs().sum(dim=1) > 0
    assert stored.tolist() == [True] * 6, f"slots with a stored history: {stored.tolist()}"
