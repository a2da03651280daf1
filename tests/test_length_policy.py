"""Variable-length decoding (issue 50): the column map of a length change, the policies' rules against
their authors' formulas written out as loops, and the decode's invariants (a sample decoded alone
equals itself in any batch, with lengths that change; seeded; refusals in one line)."""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from conftest import text_decoder
from family_models import MASK_ID, VOCAB, tiny_family_model
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.search.components.length import RhoEos, tail_eos_confidence
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.engine.rollout import RolloutEngine
from dlmsearch.search.records.resize import NEW_ABSENT, NEW_EOS, NEW_MASK, Resize, resized
from dlmsearch.search.records.state import Evaluation, Layout, initial_canvas

# The tiny LLaDA-shaped model predicts id 52 at about half of the masked positions and 51 at a third:
# as its end token, they make lengths shrink and grow.
FREQUENT, COMMON = 52, 51


def resize_of(length: int, insert_at: int = -1, insert: int = 1, tail: int = NEW_MASK) -> Resize:
    one = lambda value: torch.tensor([value])
    return Resize(one(length), one(insert_at), one(insert), one(tail), one(0))


def test_growth_trim_and_insertion_map_the_columns() -> None:
    """An old row of 6 columns: grown by 3 masks; trimmed to 4; an insertion of 3 masks at column 2
    (the columns after it shift right by 2), truncated at 7; given EOS at the tail."""
    old = torch.tensor([6])
    assert resize_of(9).sources(old, 10).tolist() == [[0, 1, 2, 3, 4, 5, NEW_MASK, NEW_MASK, NEW_MASK, NEW_ABSENT]]
    assert resize_of(4).sources(old, 8).tolist() == [[0, 1, 2, 3] + [NEW_ABSENT] * 4]
    inserted = resize_of(7, insert_at=2, insert=3).sources(old, 8).tolist()
    assert inserted == [[0, 1, NEW_MASK, NEW_MASK, NEW_MASK, 3, 4, NEW_ABSENT]]
    assert resize_of(8, tail=NEW_EOS).sources(old, 8).tolist() == [[0, 1, 2, 3, 4, 5, NEW_EOS, NEW_EOS]]


def test_a_commit_record_moves_with_its_token() -> None:
    """An insertion before committed tokens shifts their tokens and their commit records together;
    the prompt, the given EOS and the absent tail hold what each kind of column holds."""
    layout = Layout(gen_start=3, gen_length=8, block_length=8)
    canvas = initial_canvas([torch.tensor([1, 2])], [torch.full((6,), MASK_ID)], Layout(3, 6, 6), MASK_ID, MASK_ID)
    chosen = torch.zeros_like(canvas.masked)
    chosen[0, 3] = chosen[0, 7] = True
    proposal = torch.arange(canvas.tokens.shape[1])[None, :].clone()
    canvas = canvas.commit(chosen, proposal, torch.full(proposal.shape, 0.5), torch.tensor([4]), 0, -1, Layout(3, 6, 6))
    after = resized(canvas, resize_of(9, insert_at=1, insert=3, tail=NEW_EOS), Layout(3, 9, 9), MASK_ID, 60)
    assert after.tokens[0, :3].tolist() == canvas.tokens[0, :3].tolist()
    assert after.tokens[0, 3:].tolist() == [3, MASK_ID, MASK_ID, MASK_ID, MASK_ID, MASK_ID, 7, MASK_ID, 60]
    assert after.commit_call[0, 3:].tolist() == [4, -1, -1, -1, -1, -1, 4, -1, -1]
    assert after.masked[0, 3:].tolist() == [False, True, True, True, True, True, False, True, False]
    grown = resized(canvas, resize_of(5), layout, MASK_ID, 7)
    assert grown.attention[0].tolist() == [False, True, True] + [True] * 5 + [False] * 3
    assert int(grown.extent[0]) == 8 and grown.commit_call[0, 7].item() == 4


def tail_confidence_loop(draft: list[int], confidence: list[float], eos: int, count: int) -> float:
    """The authors' scan, written out: from the row's end backwards, the EOS predictions' probabilities,
    the first ``count`` of them, summed and divided by ``count``."""
    found = [c for d, c in zip(reversed(draft), reversed(confidence)) if d == eos][:count]
    return sum(found) / count


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_tail_eos_confidence_is_the_authors_scan(data: st.DataObject) -> None:
    length = data.draw(st.integers(1, 12))
    count = data.draw(st.integers(1, 6))
    draft = data.draw(st.lists(st.integers(0, 2), min_size=length, max_size=length))
    confidence = data.draw(st.lists(st.floats(0.0, 1.0, width=32), min_size=length, max_size=length))
    prompt, width = 2, 14
    canvas = initial_canvas(
        [torch.tensor([5, 6])], [torch.full((length,), MASK_ID)], Layout(prompt, length, length), MASK_ID, MASK_ID
    )
    pad = width - length
    canvas = resized(canvas, resize_of(length), Layout(prompt, width, width), MASK_ID, 1)
    evaluation = Evaluation.empty(1, prompt + width, frozenset({"draft", "draft_confidence"}))
    columns = [0, 0] + draft + [1] * pad  # EOS (1) in the absent tail is not counted
    evaluation = Evaluation(
        token=evaluation.token,
        confidence=evaluation.confidence,
        draft=torch.tensor([columns], dtype=torch.float32),
        draft_confidence=torch.tensor([[0.9, 0.9] + confidence + [0.7] * pad], dtype=torch.float32),
    )
    found = tail_eos_confidence(evaluation, canvas, Layout(prompt, width, width), 1, count)
    expected = tail_confidence_loop(draft, [float(torch.tensor(c)) for c in confidence], 1, count)
    assert found.item() == pytest.approx(expected, rel=1e-6, abs=1e-7)


def multiplier_loop(density: float, low: float, high: float, scheduler: str) -> tuple[int, int]:
    """rho-EOS's step size, written out per row: (action, K) with action 0 keep, 1 trim, 2 append."""
    density32 = torch.tensor(density, dtype=torch.float32)
    if density32 > high:
        action, gap = 1, (density32 - high).clamp(min=0.0)
    elif density32 < low:
        action, gap = 2, (low - density32).clamp(min=0.0)
    else:
        return 0, 0
    band = int(torch.ceil((gap + 1e-12) / 0.1))
    multiplier = {"const": 1, "linear": max(band, 1), "exp": max(2 ** (band - 1) if band > 0 else 0, 1)}[scheduler]
    return action, min(multiplier, 8) * 8


@pytest.mark.parametrize("scheduler", ["const", "linear", "exp"])
def test_rho_eos_step_sizes_follow_the_authors_table(scheduler: str) -> None:
    densities = torch.linspace(0, 1, 101, dtype=torch.float32)
    policy = RhoEos(low_density=0.35, high_density=0.65, scheduler=scheduler)
    steps = policy.steps(densities)
    for density, step in zip(densities.tolist(), steps.tolist()):
        action, size = multiplier_loop(density, 0.35, 0.65, scheduler)
        assert step == {0: 0, 1: -size, 2: size}[action], density


def tiny_adapter(eos: int, family: str = "llada") -> ModelAdapter:
    """The sharp tiny LLaDA-shaped (or Dream-shaped: logits shifted by one) model with ``eos`` as its end
    token (vocabulary 64, mask 63, 128 positions)."""
    return ModelAdapter(
        module=tiny_family_model(family),
        mask_id=MASK_ID,
        vocab_size=VOCAB,
        stop_ids=[eos],
        max_length=128,
        shift_logits=family == "dream",
    )


def requests(lengths: list[int], initial: int, seed: int) -> list[DecodeRequest]:
    generator = torch.Generator().manual_seed(seed)
    return [
        DecodeRequest(
            uid=uid, prompt=torch.randint(0, 50, (n,), generator=generator), generation=torch.full((initial,), MASK_ID)
        )
        for uid, n in enumerate(lengths)
    ]


POLICIES = {
    "daedal": ("daedal", "decoder.length.max_length=40", "decoder.length.eos_check_tokens=4"),
    "daedal_eager": (
        "daedal",
        "decoder.length.max_length=40",
        "decoder.length.eos_check_tokens=6",
        "decoder.length.low_confidence=0.9",
        "decoder.length.expansion_factor=3",
    ),
    "rho_eos": ("rho_eos", "decoder.length.max_length=40", "decoder.length.max_adjust_rounds=12"),
    "rho_eos_code": (
        "rho_eos",
        "decoder.length.max_length=40",
        "decoder.length.density=tail_confidence",
        "decoder.length.eos_check_tokens=4",
    ),
}


def under_policy(policy: str) -> tuple[str, ...]:
    """A search preset's overrides that add ``policy`` with a ceiling of 40 and a short EOS check."""
    return (f"+decoder/length={policy}", "decoder.length.max_length=40", "decoder.length.eos_check_tokens=4")


def decode(
    policy: str, eos: int, batch: list[DecodeRequest], initial: int, *extra: str, family: str = "llada"
) -> dict[int, tuple]:
    preset, *overrides = POLICIES[policy]
    decoder = text_decoder(preset, *overrides, *extra, gen_length=initial)
    results = decoder.decode(RolloutEngine(adapter=tiny_adapter(eos, family), seed=3), batch, 8)
    return {r.uid: (r.tokens.tolist(), r.steps, r.commit_call.tolist(), r.token_forwards) for r in results}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("eos", [FREQUENT, COMMON])
def test_lengths_change_and_a_sample_alone_equals_itself_in_the_batch(policy: str, eos: int) -> None:
    """Mixed prompt lengths in one batch, each sample against itself decoded alone: identical tokens,
    commit records and counters, while the lengths move away from the initial 16."""
    batch = requests([3, 9, 5, 12], 16, seed=eos)
    together = decode(policy, eos, batch, 16)
    alone = {r.uid: decode(policy, eos, [r], 16)[r.uid] for r in batch}
    assert together == alone
    lengths = [len(tokens) for tokens, *_ in together.values()]
    assert any(n != 16 for n in lengths), lengths


@settings(max_examples=6, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    eos=st.sampled_from([FREQUENT, COMMON]),
    lengths=st.lists(st.integers(1, 10), min_size=2, max_size=4),
    initial=st.sampled_from([8, 16]),
    seed=st.integers(0, 1000),
    temperature=st.sampled_from([0.0, 1.0]),
    family=st.sampled_from(["llada", "dream"]),
)
def test_a_sample_decodes_alike_in_any_batch_property(
    policy: str, eos: int, lengths: list[int], initial: int, seed: int, temperature: float, family: str
) -> None:
    """Hypothesis: any batch, greedy or sampled (seeded), on either adapter shape (Dream's shifted logits
    included), each sample as alone."""
    batch = requests(lengths, initial, seed)
    extra = (f"decoder.sampling.temperature={temperature}",)
    together = decode(policy, eos, batch, initial, *extra, family=family)
    target = batch[len(batch) // 2]
    assert together[target.uid] == decode(policy, eos, [target], initial, *extra, family=family)[target.uid]


@pytest.mark.parametrize("policy", ["daedal_eager", "rho_eos"])
def test_a_dream_shaped_adapter_decodes_alike_in_any_batch_sampled(policy: str) -> None:
    """Dream's logits are read one column earlier: sampled, with lengths that change, each sample as alone."""
    batch = requests([3, 9, 5], 16, seed=11)
    hot = ("decoder.sampling.temperature=1.0",)
    together = decode(policy, FREQUENT, batch, 16, *hot, family="dream")
    assert together == {r.uid: decode(policy, FREQUENT, [r], 16, *hot, family="dream")[r.uid] for r in batch}
    assert any(len(tokens) != 16 for tokens, *_ in together.values())


def test_a_seed_gives_the_same_output_and_another_seed_may_not() -> None:
    batch = requests([4, 7], 16, seed=1)
    hot = ("decoder.sampling.temperature=1.0",)
    assert decode("rho_eos", COMMON, batch, 16, *hot) == decode("rho_eos", COMMON, batch, 16, *hot)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (("+decoder=daedal", "decoder.length.max_length=8"), "use `decoder.length.max_length=16`"),
        (("+decoder=rho_eos", "cache=dual"), "use `cache=none`"),
        (("+decoder=fast_dllm", "+decoder/length=daedal", "cache=prefix"), "use `cache=none`"),
    ],
)
def test_a_length_policy_that_cannot_follow_is_refused_in_one_line(overrides: tuple, expected: str) -> None:
    cfg = compose([*overrides, "decoding=text", "task.gen_length=16"])
    decoder = build(cfg, "decoder")
    cache = next((o.split("=")[1] for o in overrides if o.startswith("cache=")), "none")
    with pytest.raises(ValueError, match=r"^[^\n]*" + expected.replace("`", r"\`").replace(".", r"\.")):
        decoder.plan(RolloutEngine(adapter=tiny_adapter(COMMON), cache=cache), 16, 8)


def test_a_model_without_an_end_token_is_refused() -> None:
    adapter = ModelAdapter(module=tiny_family_model("llada"), mask_id=MASK_ID, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="no end-of-sequence id.*`decoder/length=fixed`"):
        text_decoder("daedal", gen_length=16).plan(RolloutEngine(adapter=adapter), 16, 8)


def test_the_ceiling_must_fit_the_model() -> None:
    """A prompt whose canvas fits at the initial length but not at the ceiling is refused before any forward."""
    decoder = text_decoder("rho_eos", "decoder.length.max_length=200", gen_length=16)
    plan = decoder.plan(RolloutEngine(adapter=tiny_adapter(COMMON)), 16, 8)
    with pytest.raises(ValueError, match="longer than the model's maximum length of 128.*max_length=118"):
        plan.check_canvas(10, "the canvas", "task.gen_length")
    assert math.isfinite(plan.max_rounds())


@pytest.mark.parametrize(
    "preset,policy",
    [
        ("adalook", "rho_eos"),
        ("ete", "daedal"),
        ("best_of_n", "daedal"),
        ("smc", "rho_eos"),
        ("mcts", "rho_eos"),  # the tree presets' base rule takes whole-block steps: a threshold here
        ("gumbel_mcts", "daedal"),
        ("mcts_macro", "rho_eos"),
    ],
)
def test_lookahead_width_and_tree_search_run_on_top_of_a_length_policy(preset: str, policy: str) -> None:
    """A search preset with a length policy added decodes, lengths change, and each sample is as alone
    (a tree search's kept trees follow the canvas's widening; a row whose columns moved starts anew)."""
    batch = requests([3, 8, 5], 16, seed=4)
    overrides = under_policy(policy)
    overrides += ("decoder/commit=threshold",) if "mcts" in preset else ()

    def run(samples: list[DecodeRequest]) -> dict[int, tuple]:
        decoder = text_decoder(preset, *overrides, gen_length=16)
        assert decoder.length.changes
        results = decoder.decode(RolloutEngine(adapter=tiny_adapter(COMMON), seed=3), samples, 8)
        return {r.uid: (r.tokens.tolist(), r.steps, r.commit_call.tolist(), r.commit_depth.tolist()) for r in results}

    together = run(batch)
    assert together == {r.uid: run([r])[r.uid] for r in batch}
    assert any(len(tokens) != 16 for tokens, *_ in together.values())


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("preset,policy", [("mcts", "rho_eos"), ("gumbel_mcts", "daedal")])
def test_a_tree_search_under_a_length_policy_samples_batch_invariantly(preset: str, policy: str, family: str) -> None:
    """Sampled (T = 1), on either adapter shape: each sample as alone, and the lengths move."""
    batch = requests([3, 8, 5], 16, seed=6)
    overrides = under_policy(policy)
    decoder = text_decoder(
        preset, *overrides, "decoder/commit=threshold", "decoder.sampling.temperature=1.0", gen_length=16
    )

    def run(samples: list[DecodeRequest]) -> dict[int, tuple]:
        results = decoder.decode(RolloutEngine(adapter=tiny_adapter(FREQUENT, family), seed=3), samples, 8)
        return {r.uid: (r.tokens.tolist(), r.steps, r.commit_call.tolist()) for r in results}

    together = run(batch)
    assert together == {r.uid: run([r])[r.uid] for r in batch}
    assert any(len(tokens) != 16 for tokens, *_ in together.values())


def test_the_python_api_takes_an_initial_length_and_a_ceiling() -> None:
    """``generate(gen_length=initial, max_length=ceiling)``: the shipped varied-length model, started at 8,
    ends inside the ceiling; a decoder of fixed length refuses a ceiling in one line."""
    from dlmsearch.api import Decoder, Model

    model = Model.load("countdown_varied")
    [out] = Decoder.from_preset("daedal").generate(model, ["Make 54 from 10, 4, 16."], gen_length=8, max_length=40)
    assert 8 < len(out.tokens) <= 40 and out.text
    with pytest.raises(ValueError, match="decodes a fixed length"):
        Decoder.from_preset("fast_dllm").generate(model, ["Make 54 from 10, 4, 16."], gen_length=8, max_length=40)


@pytest.mark.parametrize("preset,policy", [("mcts", "rho_eos"), ("mcts_macro", "rho_eos"), ("gumbel_mcts", "daedal")])
def test_a_kept_tree_is_rooted_at_the_canvas_it_searches_after_lengths_change(
    preset: str, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search that reuses a kept subtree finds at its root the evaluation of the canvas it searches:
    a row whose columns moved (growth, trim, insertion) starts a new tree, one that did not keeps its
    own, widened with the canvas."""
    from dlmsearch.search.decode import tree_phases

    start, reused = tree_phases._start, []

    def checked_start(state, root, evaluation, exploring):
        if state.tree is not None:
            kept = state.tree.take(exploring)
            again = kept.count > 0
            at_root = (kept.evaluation.token[:, 0] == evaluation.token).all(dim=1)
            assert bool(at_root[again].all()), "a kept tree's root is not the canvas searched"
            reused.append(int(again.sum()))
        return start(state, root, evaluation, exploring)

    monkeypatch.setattr(tree_phases, "_start", checked_start)
    overrides = under_policy(policy)
    decoder = text_decoder(preset, *overrides, "decoder/commit=threshold", gen_length=16)
    results = decoder.decode(RolloutEngine(adapter=tiny_adapter(COMMON), seed=3), requests([3, 8, 5], 16, seed=4), 8)
    assert sum(reused) > 0  # kept trees were reused
    assert any(len(r.tokens) != 16 for r in results)


def test_a_tree_search_under_a_length_policy_admits_and_evicts_unchanged() -> None:
    """Samples joining a decode whose canvases have grown (and a longer prompt: they widen on both
    sides) and a sample leaving change no other sample's search or length."""
    from conftest import admit_step_evict

    from dlmsearch.search.session import DecodeSession

    overrides = under_policy("rho_eos")
    decoder = text_decoder("mcts", *overrides, "decoder/commit=threshold", gen_length=16)
    engine = lambda: RolloutEngine(adapter=tiny_adapter(COMMON), seed=3)
    session = DecodeSession.open(decoder, engine(), 16, 8)
    first, later = requests([3, 5, 4], 16, seed=1), requests([11, 2], 16, seed=2)
    later = [attrs.evolve(r, uid=100 + r.uid) for r in later]
    session.admit(first)
    finished = {r.uid: r for _ in range(4) for r in session.step()}
    assert session.state.layout.gen_length > 16 and session.state.tree is not None  # grown, trees kept
    rest, victim = admit_step_evict(session, [], later)
    finished.update(rest)
    for sample in [r for r in first + later if r.uid != victim]:
        [alone] = decoder.decode(engine(), [sample], 8)
        assert finished[sample.uid].tokens.tolist() == alone.tokens.tolist(), f"uid {sample.uid} changed"
    assert any(len(r.tokens) != 16 for r in finished.values())
