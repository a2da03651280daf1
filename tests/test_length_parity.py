"""Parity of the variable-length decoders (``daedal``, ``rho_eos``) with their authors' licensed loops.

The reference loops (DAEDAL's and rho-EOS's ``generate``, Apache-2.0) run from ``../shared/upstream``
through ``tests/upstream_length.py``, one prompt at a time; dlmsearch decodes the same three prompts
(of different lengths) in one batch. Temperature 0, no guidance. Each sample must come out with the
same tokens (its own final length) after the same number of model calls.

Every case first checks, on the reference's own runs, that it exercised what it is there for
(``Case.exercises``, see :func:`exercised`): a case whose lengths never move would pass on a decoder
that ignores the length rule. A random tiny model almost never predicts EOS (1 id in 126k), so on
it every length rule only grows; the cases run on

* ``eos``: the tiny random LLaDA of ``conftest.checkpoints`` with its output head rewritten so
  that EOS is often the argmax at masked positions (:func:`write_eos_biased`; the same safetensors
  are read by the reference model and by dlmsearch), and
* ``countdown``: the trained Countdown model shipped in ``dlmsearch/data/countdown_model`` (LLaDA's
  format; real EOS behaviour: it writes its answer, ``<|eot_id|>``, then ``<|endoftext|>``), on
  prompts of the shipped tiers (two of three numbers, one of four: 24, 27 and 24 tokens);
* ``tiny``: the plain tiny model, for the published settings (only growth; slow).

Settings are the reference loops' keywords; :func:`overrides` maps them onto dlmsearch's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import PARITY_PROMPT_LENGTHS, TextCheckpoint, text_decoder
from tiny_checkpoints import requires_upstream
from upstream import load_upstream
from upstream_length import (
    LengthRun,
    daedal_run,
    length_upstream_missing_reason,
    rho_eos_module,
    rho_eos_run,
)

pytestmark = [
    requires_upstream,
    pytest.mark.skipif(
        length_upstream_missing_reason() is not None,
        reason=length_upstream_missing_reason() or "variable-length reference code present",
    ),
]

COUNTDOWN_MODEL = Path(__file__).resolve().parents[1] / "dlmsearch" / "data" / "countdown_model"

EOS_HEAD_SCALE = 0.4
""":func:`write_eos_biased`: factor on every output-head row but the mask token's."""
EOS_MASK_GAIN = 4.0
""":func:`write_eos_biased`: length of the mask token's (unit) embedding added to EOS's head row."""

# The published settings (both papers' evaluation scripts: blocks of 32, initial length 64,
# thresholds 0.9 / 0.1 / 0.5 / 0.9, factor 8, 32 EOS check tokens; rho-EOS: 0.4 / 0.6 / exp),
# max_gen_length lowered from 2048 to 96 (the Countdown model's context is 128 positions).
DAEDAL_PUBLISHED = {
    "block_length": 32,
    "initial_gen_length": 64,
    "max_gen_length": 96,
    "high_conf_threshold": 0.9,
    "low_conf_threshold": 0.1,
    "eos_confidence_threshold": 0.5,
    "expand_eos_confidence_threshold": 0.9,
    "expansion_factor": 8,
    "eos_check_tokens": 32,
}
RHO_PUBLISHED = {
    "block_length": 32,
    "initial_gen_length": 64,
    "max_gen_length": 96,
    "high_conf_threshold": 0.9,
    "expansion_factor": 8,
    "eos_check_tokens": 32,
    "low_density_threshold": 0.4,
    "high_density_threshold": 0.6,
    "scheduler": "exp",
}
SMALL = {"block_length": 8, "initial_gen_length": 8, "max_gen_length": 40, "expansion_factor": 4, "eos_check_tokens": 8}


def _daedal(*bases: dict, **changes) -> dict:
    """The published DAEDAL settings, updated by ``bases`` then ``changes``."""
    return {**DAEDAL_PUBLISHED, **{k: v for base in bases for k, v in base.items()}, **changes}


def _rho(*bases: dict, **changes) -> dict:
    """The published rho-EOS settings, updated by ``bases`` then ``changes``."""
    return {**RHO_PUBLISHED, **{k: v for base in bases for k, v in base.items()}, **changes}


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def write_eos_biased(source: Path, target: Path, *, mask_id: int, eos_id: int) -> None:
    """A copy of the tiny LLaDA checkpoint ``source`` whose head makes EOS a common argmax.

    Everything but the weights is copied as it is (config, generation config, tokenizer). The
    output head ``model.transformer.ff_out.weight`` is rewritten: every row but the mask token's is
    multiplied by :data:`EOS_HEAD_SCALE` (0.4: flatter distributions, so that confidences below
    DAEDAL's 0.1 occur and its insertions happen), then EOS's row gets
    :data:`EOS_MASK_GAIN` (4) times the unit vector of the mask token's input embedding added. A
    masked position's final hidden state leans towards the mask embedding (cosine about 0.7), a
    filled one's does not, so EOS becomes the argmax at many masked positions, as in a trained
    model, by a margin that varies with the prompt and the position. The mask row is kept: the
    mask token still has probability 0.
    """
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model*.safetensors", "model.safetensors.index.json"))
    state = load_file(str(source / "model.safetensors"))
    head, embedding = state["model.transformer.ff_out.weight"], state["model.transformer.wte.weight"]
    mask_row = head[mask_id].clone()
    head.mul_(EOS_HEAD_SCALE)
    head[mask_id] = mask_row
    head[eos_id] += EOS_MASK_GAIN * embedding[mask_id] / embedding[mask_id].norm()
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="session")
def length_models(checkpoints, tmp_path_factory) -> dict[str, TextCheckpoint]:
    """``tiny`` (``checkpoints["llada"]``), ``eos`` (its EOS-biased copy) and ``countdown`` (shipped)."""
    tiny = checkpoints["llada"]
    directory = tmp_path_factory.mktemp("eos_llada") / "model"
    write_eos_biased(tiny.directory, directory, mask_id=tiny.mask_id, eos_id=tiny.stop_ids[0])
    eos = TextCheckpoint(directory, directory, load_upstream(directory), tiny.mask_id, tiny.vocab_size, tiny.stop_ids)
    config = json.loads((COUNTDOWN_MODEL / "config.json").read_text())
    stops = json.loads((COUNTDOWN_MODEL / "generation_config.json").read_text())["eos_token_id"]
    assert stops[0] == config["eos_token_id"], "EOS first"
    countdown = TextCheckpoint(
        COUNTDOWN_MODEL,
        COUNTDOWN_MODEL,
        load_upstream(COUNTDOWN_MODEL),
        config["mask_token_id"],
        config["vocab_size"],
        list(stops),
    )
    return {"tiny": tiny, "eos": eos, "countdown": countdown}


def random_prompts(seed: int) -> list[torch.Tensor]:
    """``conftest.mixed_batch``'s prompts: random ids below 1000, of 5, 11 and 8 tokens."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 1000, (n,), generator=generator) for n in PARITY_PROMPT_LENGTHS]


def countdown_prompts() -> list[torch.Tensor]:
    """The Countdown model's own prompt (its chat template around ``Make {target} from {numbers}.``)
    for the first and third problems of the ``small`` tier and the first of ``small4`` (four numbers)."""
    from transformers import AutoTokenizer

    from dlmsearch.tasks.countdown import shipped_countdown_path

    tokenizer = AutoTokenizer.from_pretrained(str(COUNTDOWN_MODEL))

    def problem(tier: str, index: int) -> str:
        line = json.loads(shipped_countdown_path(tier).read_text().splitlines()[index])
        return f"Make {line['output']} from {', '.join(line['input'].split(','))}."

    prompts = []
    for text in (problem("small", 0), problem("small4", 0), problem("small", 2)):
        templated = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(torch.tensor(tokenizer(templated, add_special_tokens=False)["input_ids"]))
    return prompts


# ---------------------------------------------------------------------------------------------
# What a case exercised
# ---------------------------------------------------------------------------------------------


def exercised(algorithm: str, runs: list[LengthRun], settings: dict) -> set[str]:
    """The facts that hold for at least one sample of a case (the reference's runs).

    DAEDAL: ``grew`` (its first stage lengthened the all-mask generation), ``kept`` (its first
    stage left the initial length), ``inserted`` (a second-stage mask insertion),
    ``insertion_cut`` (an insertion that grew by less than ``expansion_factor - 1``: cut at
    ``max_gen_length``, the row's tail dropped), ``tail_cut`` (the ``eos_check_tokens // 2`` EOS
    tokens appended after the first stage were cut at ``max_gen_length``), ``max`` (ended at
    ``max_gen_length``). rho-EOS: ``grew`` (an expansion), ``trimmed`` (a contraction),
    ``emptied`` (a contraction to length 0), ``max``, ``forced_stop`` (stopped after
    ``max_gen_length`` steps).
    """
    facts = set()
    top = settings["max_gen_length"]
    for run in runs:
        if len(run.tokens) == top:
            facts.add("max")
        if algorithm == "daedal":
            initial, first = settings["initial_gen_length"], run.stage1_length
            facts.add("grew" if first > initial else "kept")
            tail = settings["eos_check_tokens"] // 2
            # The second stage starts from the first stage's length plus the EOS tail, clamped.
            assert run.stage2_lengths[0] == min(first + tail, top), (first, run.stage2_lengths[0])
            if first + tail > top:
                facts.add("tail_cut")
            if run.insertions:
                facts.add("inserted")
            if any(growth < settings["expansion_factor"] - 1 for growth in run.insertions):
                facts.add("insertion_cut")
        else:
            for _density, action, before, after in run.adjustments:
                if action == 2 and after > before:
                    facts.add("grew")
                if action == 1 and after < before:
                    facts.add("trimmed")
                    if after == 0:
                        facts.add("emptied")
            if run.printed("max_decode_steps"):
                facts.add("forced_stop")
    return facts


# ---------------------------------------------------------------------------------------------
# dlmsearch's side
# ---------------------------------------------------------------------------------------------

_DAEDAL_KEYS = {
    "max_gen_length": "decoder.length.max_length",
    "expansion_factor": "decoder.length.expansion_factor",
    "eos_confidence_threshold": "decoder.length.eos_confidence",
    "expand_eos_confidence_threshold": "decoder.length.expand_eos_confidence",
    "eos_check_tokens": "decoder.length.eos_check_tokens",
    "low_conf_threshold": "decoder.length.low_confidence",
    "high_conf_threshold": "decoder.commit.threshold",
}
_RHO_KEYS = {
    "max_gen_length": "decoder.length.max_length",
    "expansion_factor": "decoder.length.expansion_factor",
    "low_density_threshold": "decoder.length.low_density",
    "high_density_threshold": "decoder.length.high_density",
    "scheduler": "decoder.length.scheduler",
    "eos_check_tokens": "decoder.length.eos_check_tokens",
    "high_conf_threshold": "decoder.commit.threshold",
}
RHO_ADJUST_ROUNDS = 64
"""rho-EOS's ``max_adjust_length_steps`` (a constant in its ``generate``)."""


def overrides(algorithm: str, settings: dict, density: str | None) -> list[str]:
    """dlmsearch's overrides for the reference keywords ``settings`` (initial length and block
    length are the request's and ``decode``'s; the reference's unused keywords are dropped)."""
    keys = _DAEDAL_KEYS if algorithm == "daedal" else _RHO_KEYS
    words = [f"{keys[name]}={value}" for name, value in settings.items() if name in keys]
    if algorithm == "rho_eos":
        words += [f"decoder.length.density={density}", f"decoder.length.max_adjust_rounds={RHO_ADJUST_ROUNDS}"]
    return words


def dlmsearch_decode(spec: TextCheckpoint, algorithm: str, settings: dict, density: str | None, prompts):
    from dlmsearch.models.loading import load_text_model
    from dlmsearch.search.decode.intake import DecodeRequest
    from dlmsearch.search.engine.rollout import RolloutEngine

    initial = settings["initial_gen_length"]
    decoder = text_decoder(algorithm, *overrides(algorithm, settings, density), gen_length=initial)
    adapter = load_text_model(
        str(spec.directory), "llada", spec.mask_id, spec.vocab_size, spec.stop_ids, device="cpu", dtype="float32"
    )
    requests = [
        DecodeRequest(uid=i, prompt=p, generation=torch.full((initial,), spec.mask_id)) for i, p in enumerate(prompts)
    ]
    return decoder.decode(RolloutEngine(adapter=adapter), requests, settings["block_length"])


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    algorithm: str  # daedal | rho_eos
    model: str  # tiny | eos | countdown
    settings: dict
    exercises: frozenset[str]
    seed: int = 0  # random prompts (tiny, eos)
    density: str | None = None  # rho_eos: tail_confidence | masked_fraction
    slow: bool = False

    def param(self):
        marks = [pytest.mark.slow] if self.slow else []
        return pytest.param(self, id=self.name, marks=marks)


def _f(*facts: str) -> frozenset[str]:
    return frozenset(facts)


DAEDAL_CASES = [
    # First stage grows one row to the maximum and keeps two; those get one insertion each.
    Case("eos-small", "daedal", "eos", _daedal(SMALL), _f("grew", "kept", "inserted", "max")),
    # The same at max 14: the growth is clamped (8, 12, 14) and both insertions are cut to +2.
    Case(
        "eos-cut",
        "daedal",
        "eos",
        _daedal(SMALL, max_gen_length=14),
        _f("grew", "kept", "inserted", "insertion_cut", "max"),
    ),
    # Initial 16, factor 8, max 24: one insertion of 7 is cut to 4; one row ends below the maximum.
    Case(
        "eos-16",
        "daedal",
        "eos",
        _daedal(SMALL, initial_gen_length=16, max_gen_length=24, expansion_factor=8),
        _f("grew", "kept", "inserted", "insertion_cut", "max"),
    ),
    # Countdown: the first stage grows every row (8 -> 16); one insertion of 7.
    Case(
        "countdown-small",
        "daedal",
        "countdown",
        _daedal(
            block_length=8,
            initial_gen_length=8,
            max_gen_length=32,
            expansion_factor=8,
            eos_check_tokens=4,
            low_conf_threshold=0.3,
        ),
        _f("grew", "inserted"),
    ),
    # Countdown: 8 -> 24, 20, 24; one row gets six insertions (3, 3, 3, 3, 3, then 1: cut at 48).
    Case(
        "countdown-insertions",
        "daedal",
        "countdown",
        _daedal(
            block_length=8,
            initial_gen_length=8,
            max_gen_length=48,
            expansion_factor=4,
            eos_check_tokens=16,
            low_conf_threshold=0.5,
        ),
        _f("grew", "inserted", "insertion_cut", "max"),
    ),
    # Countdown, published settings (max 96: its context is 128): 64 -> 96, 64 kept (+16 EOS), 88 (+16 cut to 96).
    Case("countdown-published", "daedal", "countdown", _daedal(), _f("grew", "kept", "tail_cut", "max")),
    # The plain tiny model never predicts EOS: every row grows to the maximum.
    Case("tiny-published", "daedal", "tiny", _daedal(), _f("grew", "max"), slow=True),
    # An initial length that is not whole blocks (12 in blocks of 8): the canvas ends inside its second block.
    Case("eos-partial", "daedal", "eos", _daedal(SMALL, initial_gen_length=12), _f("grew", "kept", "inserted", "max")),
]

RHO_CASES = [
    # An initial length that is not whole blocks (12 in blocks of 8), the paper's density.
    Case(
        "eos-partial-masked",
        "rho_eos",
        "eos",
        _rho(SMALL, initial_gen_length=12),
        _f("grew", "trimmed", "max"),
        density="masked_fraction",
    ),
    # One row expands step by step and is trimmed twice (+12 +16 +20 +24 -20 +24 -20 +28 +32 +40).
    Case(
        "eos-small-tail", "rho_eos", "eos", _rho(SMALL), _f("grew", "trimmed", "max"), seed=3, density="tail_confidence"
    ),
    # Two rows start above the high density and are cut to length 0 at the first step.
    Case(
        "eos-empty-tail",
        "rho_eos",
        "eos",
        _rho(SMALL),
        _f("grew", "trimmed", "emptied", "max"),
        density="tail_confidence",
    ),
    # One row grows in steps (+24 +32 +36 +40), one is cut to length 0.
    Case(
        "eos-small-masked",
        "rho_eos",
        "eos",
        _rho(SMALL),
        _f("grew", "trimmed", "emptied", "max"),
        seed=1,
        density="masked_fraction",
    ),
    # Countdown, the released rule: +40 -8 +16 -0 (two rows end empty), +40 -8.
    Case(
        "countdown-small-tail",
        "rho_eos",
        "countdown",
        _rho(block_length=8, initial_gen_length=8, max_gen_length=48, expansion_factor=4, eos_check_tokens=4),
        _f("grew", "trimmed", "emptied"),
        density="tail_confidence",
    ),
    # Countdown, the paper's density (over the positions masked when the model was called): the rows
    # end at 12, 8 and 12 tokens after growing and trimming.
    Case(
        "countdown-small-masked",
        "rho_eos",
        "countdown",
        _rho(block_length=8, initial_gen_length=16, max_gen_length=64, expansion_factor=4, eos_check_tokens=8),
        _f("grew", "trimmed"),
        density="masked_fraction",
    ),
    # Countdown, published settings (max 96): two rows grow to 96, the four-number one is trimmed 64 -> 32.
    Case(
        "countdown-published-tail",
        "rho_eos",
        "countdown",
        _rho(),
        _f("grew", "trimmed", "max"),
        density="tail_confidence",
    ),
    Case("countdown-published-masked", "rho_eos", "countdown", _rho(), _f("grew", "max"), density="masked_fraction"),
    Case("tiny-published-tail", "rho_eos", "tiny", _rho(), _f("grew", "max"), density="tail_confidence", slow=True),
    Case("tiny-published-masked", "rho_eos", "tiny", _rho(), _f("grew", "max"), density="masked_fraction", slow=True),
]


def _reference(case: Case, spec: TextCheckpoint, prompts) -> list[LengthRun]:
    ids = {"mask_id": spec.mask_id, "eos_token_id": spec.stop_ids[0]}
    if case.algorithm == "daedal":
        return [daedal_run(spec.upstream, p, **case.settings, **ids) for p in prompts]
    return [rho_eos_run(spec.upstream, p, density=case.density, **case.settings, **ids) for p in prompts]


def _check(case: Case, length_models) -> None:
    spec = length_models[case.model]
    prompts = countdown_prompts() if case.model == "countdown" else random_prompts(case.seed)
    assert len({len(p) for p in prompts}) > 1, "a mixed batch: prompts of different lengths"
    runs = _reference(case, spec, prompts)
    facts = exercised(case.algorithm, runs, case.settings)
    summary = [(len(r.tokens), r.calls) for r in runs]
    assert case.exercises <= facts, f"{case.name} exercised {sorted(facts)}, not {sorted(case.exercises)}: {summary}"
    results = dlmsearch_decode(spec, case.algorithm, case.settings, case.density, prompts)
    assert len(results) == len(runs)
    for prompt, run, result in zip(prompts, runs, results):
        label = f"prompt of {len(prompt)}: reference length {len(run.tokens)}, dlmsearch {len(result.tokens)}"
        assert torch.equal(result.tokens.cpu(), run.tokens), label
        assert result.steps == run.calls, f"{label}: model calls {result.steps} != reference {run.calls}"


@pytest.mark.parametrize("case", [c.param() for c in DAEDAL_CASES])
def test_daedal_matches_reference(length_models, case: Case) -> None:
    """DAEDAL's ``generate`` one prompt at a time against the ``daedal`` preset on a mixed batch."""
    _check(case, length_models)


@pytest.mark.parametrize("case", [c.param() for c in RHO_CASES])
def test_rho_eos_matches_reference(length_models, case: Case) -> None:
    """rho-EOS's ``generate`` (as released, or with the paper's density) one prompt at a time
    against the ``rho_eos`` preset on a mixed batch."""
    _check(case, length_models)


# ---------------------------------------------------------------------------------------------
# The harness itself
# ---------------------------------------------------------------------------------------------


def test_harness_leaves_no_stand_ins() -> None:
    """The evaluation-harness stand-ins exist only while the reference modules import."""
    import sys

    rho_eos_module()
    assert not any(name == "dllm_eval" or name.startswith("dllm_eval.") for name in sys.modules)
    stand_in = [n for n in ("accelerate", "datasets") if n in sys.modules and sys.modules[n].__spec__ is None]
    assert not stand_in, stand_in


def test_masked_fraction_reads_the_state_the_forward_saw(length_models, monkeypatch) -> None:
    """The paper's density, as :func:`upstream_length.rho_eos_run` plugs it in: at every step it is
    computed over exactly the positions masked in the canvas that step's forward read (the README's
    "remaining MASK at step t"), and it is the density the loop acts on (clamped into [low, high] in
    denoise-only mode); the released function is back afterwards."""
    spec = length_models["countdown"]
    module = rho_eos_module()
    paper, released = module._calculate_eos_density, module._calculate_eos_confidence
    seen = []

    def recording(logits, currently_masked, eos_token_id):
        out = paper(logits, currently_masked, eos_token_id)
        seen.append((int(currently_masked.sum()), float(out[0][0])))
        return out

    forwarded = []
    handle = spec.upstream.register_forward_pre_hook(
        lambda module, args: forwarded.append(int((args[0] == spec.mask_id).sum()))
    )
    monkeypatch.setattr(module, "_calculate_eos_density", recording)
    settings = _rho(block_length=8, initial_gen_length=16, max_gen_length=64, expansion_factor=4, eos_check_tokens=8)
    try:
        run = rho_eos_run(
            spec.upstream,
            countdown_prompts()[1],
            density="masked_fraction",
            mask_id=spec.mask_id,
            eos_token_id=spec.stop_ids[0],
            **settings,
        )
    finally:
        handle.remove()
    assert module._calculate_eos_confidence is released
    assert len(seen) == len(forwarded) == run.calls
    assert [counted for counted, _ in seen] == forwarded
    denoise_only_from = next((calls for calls, line in run.log if "denoise-only" in line), run.calls)
    low, high = settings["low_density_threshold"], settings["high_density_threshold"]
    expected = [
        round(min(max(density, low), high) if step >= denoise_only_from else density, 4)
        for step, (_, density) in enumerate(seen)
    ]
    assert [density for density, *_ in run.adjustments] == expected
    assert 1 in {action for _, action, *_ in run.adjustments}  # the length moved (it trimmed)
