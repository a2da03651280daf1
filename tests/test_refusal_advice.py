"""Issue 51, item 3: a refusal names the whole fix. Every rule of ``plan.RULES`` (and the plan's
verifier check) ends its one line with the override(s) that fix it, in backticks (several in one
span: all of them; ``+decoder=NAME``: that preset in place of the command's own). Each rule is
triggered here by the command a user would write, each fix is applied as written, and the command
must then pass the plan (the CLI's own check before decoding) with no second refusal."""

from __future__ import annotations

import copy
import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from conftest import text_decoder, tiny_denoiser
from omegaconf import OmegaConf

from dlmsearch.config import build, compose_checked
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.run import Decoding, build_fallback
from dlmsearch.search import plan, plan_rules
from dlmsearch.search.components.commit import FastBlockRule
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine

ROOT = Path(__file__).resolve().parents[1]
COUNTDOWN = ["model=countdown", "task=countdown"]
BLOCK = ["model=countdown_block", "task=countdown"]
UNIFORM = ["model=countdown_uniform", "task=countdown"]
REVISION = "dlmsearch.search.components.revision.RunningConfidence"  # RCR's, in place of no revision
PROMPT = ["model=countdown", "task=prompts", "task.prompt='Make 12 from 3, 5, 7.'"]  # its verifier judges nothing


def fixes(message: str) -> list[list[str]]:
    """The fixes a refusal names: each backticked span, split as a shell splits it."""
    return [shlex.split(span) for span in re.findall(r"`([^`]+)`", message)]


def applied(command: list[str], fix: list[str]) -> list[str]:
    """``command`` with ``fix`` appended (a preset, ``+decoder=NAME``, in place of the command's own)."""
    for override in fix:
        if override.startswith("+decoder="):
            command = [o for o in command if not o.startswith("+decoder=")]
        command = [*command, override]
    return command


@functools.cache
def _model(model_yaml: str) -> ModelAdapter:
    return build(OmegaConf.create(model_yaml), "model")


def model(cfg) -> ModelAdapter:
    """The command's model, loaded once per configuration; ``model.tensor_parallel=N`` declared on a copy
    (what the plan reads of a sharded model: one process cannot shard it)."""
    section = OmegaConf.to_container(cfg.model, resolve=True)
    shards = section.pop("tensor_parallel", 1)
    adapter = _model(OmegaConf.to_yaml({"model": section}))
    if shards == 1:
        return adapter
    sharded = copy.copy(adapter)
    sharded.capabilities = attrs.evolve(adapter.capabilities, tensor_parallel=shards)
    return sharded


Tweak = Callable[[SearchDecoder], SearchDecoder]


def refusal(command: list[str], tweak: Tweak | None = None) -> str | None:
    """What ``python -m dlmsearch COMMAND`` refuses before decoding (None: it would decode): the run's
    own composition and plan (``Decoding.prepare``), on its first item."""
    cfg = compose_checked([*command, "task.limit=1"])
    engine = build(cfg, "engine", adapter=model(cfg))
    decoder = build(cfg, "decoder")
    decoding = Decoding(tweak(decoder) if tweak else decoder, engine, build(cfg, "task"), build_fallback(cfg))
    try:
        decoding.prepare(decoding.task.items())
    except ValueError as refused:
        assert "make_plan" in _frames(refused) or "check_canvas" in _frames(refused), refused  # by the plan alone
        return str(refused)
    return None


def _frames(error: BaseException) -> list[str]:
    """The functions an error was raised through, outermost first."""
    tb, names = error.__traceback__, []
    while tb is not None:
        names, tb = [*names, tb.tb_frame.f_code.co_name], tb.tb_next
    return names


@attrs.define
class VerifiedFastBlock(FastBlockRule):
    """Fast block diffusion asking for WINO's shadow block: rule 20 has no preset that breaks it."""

    statistics = frozenset({"verify"})


def verified_fast_block(decoder: SearchDecoder) -> SearchDecoder:
    if type(decoder.commit) is not FastBlockRule:
        return decoder
    return attrs.evolve(decoder, commit=VerifiedFastBlock(**attrs.asdict(decoder.commit, recurse=False)))


# (the rule that refuses, the command, the text of its fix); a decoder tweak where no command breaks the rule
CASES: list[tuple[str, list[str], str] | tuple[str, list[str], str, Tweak]] = [
    ("_layerwise_cache", ["+decoder=llada", "cache=dllm_cache"], "`cache=none`"),
    ("_layerwise_cache", ["+decoder=llada", *BLOCK, "cache=dkv"], "`cache=block`"),
    ("_layerwise_cache", ["+decoder=saber", *BLOCK, "cache=d2cache"], "`cache=none`"),
    ("_layerwise_cache", ["+decoder=diffusion_gemma", *UNIFORM, "cache=elastic"], "`cache=auto`"),
    ("_cache_the_model_runs", ["+decoder=llada", "cache=block"], "`cache=none`"),
    ("_cache_the_model_runs", ["+decoder=llada", "cache=prefix"], "`cache=none`"),
    ("_cache_the_model_runs", ["+decoder=fast_dllm", *COUNTDOWN, "cache=encoder"], "`cache=none`"),
    ("_cache_the_model_runs", ["+decoder=sdar", *BLOCK, "cache=prefix"], "`cache=block`"),
    ("_cache_the_model_runs", ["+decoder=klass", *BLOCK, "cache=dual"], "`cache=none`"),
    ("_cache_the_model_runs", ["+decoder=diffusion_gemma", *UNIFORM, "cache=dual"], "`cache=auto`"),
    ("_compile", ["+decoder=llada", "engine.compile=true"], "`engine.compile=false`"),
    ("_model_blocks", ["+decoder=dream", *BLOCK], "`++decoder.block_length=null`"),
    ("_guidance", ["+decoder=llada", *COUNTDOWN, "cache=prefix", "decoder.guidance.scale=1"], "`cache=none`"),
    ("_stop_tokens", ["+decoder=llada", "decoder.stop_at_eos=true"], "`decoder.stop_at_eos=false`"),
    ("_whole_prefix", ["+decoder=saber", *BLOCK], "`cache=none`"),
    ("_revision_over_layerwise", ["+decoder=rcr", *COUNTDOWN, "cache=dllm_cache"], "`cache=none`"),
    ("_history", ["+decoder=klass", *BLOCK], "`cache=none`"),
    ("_shadow", ["+decoder=wino", *COUNTDOWN, "cache=dual"], "`cache=none`"),
    ("_shadow", ["+decoder=wino", *COUNTDOWN, "decoder.guidance.scale=1"], "`decoder.guidance.scale=0`"),
    ("_shadow", ["+decoder=wino", *BLOCK], "`+decoder=fast_dllm`"),
    ("_whole_block_steps", ["+decoder=diffusion_gemma", *COUNTDOWN], "`+decoder=llada`"),
    ("_whole_block_steps", ["+decoder=diffusion_gemma"], "`+decoder=llada`"),  # before its stop tokens (rule 6)
    ("_parts_without_mask_token", ["+decoder=rcr", *UNIFORM], "`'~decoder.revision'`"),
    (
        "_parts_without_mask_token",
        ["+decoder=llada", *UNIFORM, "decoder.guidance.scale=1"],
        "`decoder.guidance.scale=0`",
    ),
    (
        "_parts_without_mask_token",
        ["+decoder=diffusion_gemma", *UNIFORM, "+decoder/population=best_of_n"],
        "`decoder/population/score=log_probability`",
    ),
    ("_temperature", ["+decoder=diffusion_gemma", *UNIFORM, "engine.temperature=0.5"], "`engine.temperature=null`"),
    ("_temperature", ["+decoder=sdar", *UNIFORM], "`decoder.sampling.temperature=null`"),
    (
        "_temperature",
        ["+decoder=best_of_n", *UNIFORM, "decoder/population/diversity=token_temperature"],
        "`decoder/population/diversity=order_temperature`",
    ),
    ("_sharded_layerwise", ["+decoder=llada", *COUNTDOWN, "model.tensor_parallel=2", "cache=dkv"], "`cache=none`"),
    (
        "_sharded_compile",
        ["+decoder=llada", *COUNTDOWN, "model.tensor_parallel=2", "engine.compile=true"],
        "`engine.compile=false`",
    ),
    ("_lookahead_over_revision", ["+decoder=rcr", "decoder/trigger=always"], "`decoder/trigger=never`"),
    ("_lookahead_over_revision", ["+decoder=mcts", "decoder.revision._target_=" + REVISION], "`'~decoder.revision'`"),
    ("_lookahead_parts", ["+decoder=fast_dllm", "decoder/trigger=always"], "`decoder/trigger=never`"),
    # the task refuses a generation that is not whole in its own blocks; the model's blocks are the plan's to check
    ("_whole_blocks", ["+decoder=sdar", *BLOCK, "task.block_length=2", "task.gen_length=14"], "`task.gen_length=16`"),
    (
        "_whole_blocks",
        ["+decoder=diffusion_gemma", *UNIFORM, "task.block_length=4", "task.gen_length=12"],
        "`task.gen_length=16`",
    ),
    ("_whole_blocks", ["+decoder=llada", "+decoder.block_length=10"], "`++decoder.block_length=9`"),
    ("_canvas_fits", ["+decoder=llada", *COUNTDOWN, "task.gen_length=256"], "`task.gen_length="),
    ("_shadow_blocks", ["+decoder=fast_block"], "`decoder/commit=wide_in`", verified_fast_block),
    ("_tree_search", ["+decoder=mcts", "decoder/expansion=variance_gate"], "`decoder/expansion=puct`"),
    ("_tree_search", ["+decoder=mcts", "decoder/trigger=never"], "`decoder/trigger=always`"),
    ("_tree_search", ["+decoder=fast_dllm", "+decoder/tree=default"], "+decoder/candidates=top_confidence"),
    ("_tree_search", ["+decoder=rcr", "+decoder/tree=default"], "+decoder/selector=most_visited '~decoder.revision'`"),
    ("_tree_search", ["+decoder=best_of_n", "+decoder/tree=default"], "'~decoder.population'`"),
    ("_tree_search", ["+decoder=mcts", *UNIFORM], "`+decoder=best_of_n`"),
    ("_tree_search", ["+decoder=mcts", "+decoder/population=best_of_n"], "`'~decoder.population'`"),
    ("_tree_search", ["+decoder=gumbel_mcts", *COUNTDOWN, "cache=prefix"], "`cache=none`"),
    (
        "_length_policy",
        ["+decoder=daedal", *COUNTDOWN, "decoder.length.max_length=4"],
        "`decoder.length.max_length=16`",
    ),
    (
        "_length_policy",
        ["+decoder=rho_eos", *COUNTDOWN, "decoder.length.max_length=64", "cache=prefix"],
        "`cache=none`",
    ),
    ("_canvas_fits", ["+decoder=daedal", *COUNTDOWN], "`decoder.length.max_length=104`"),  # the ceiling's canvas
    ("_length_policy", ["+decoder=rho_eos", *BLOCK], "`decoder/length=fixed decoder.stop_at_eos=true`"),
    (
        "_length_policy",
        ["+decoder=diffusion_gemma", "+decoder/length=rho_eos", *UNIFORM],
        "`decoder/length=fixed decoder.stop_at_eos=true`",
    ),
    ("_length_policy", ["+decoder=daedal"], "`decoder/length=fixed`"),  # the Sudoku model has no end token
    (
        "_length_policy",
        ["+decoder=mcts", "+decoder/length=rho_eos", *COUNTDOWN, "decoder.length.max_length=64"],
        "`decoder/commit=threshold`",
    ),
    # make_plan's own checks: what the task's verifier allows, what the layout binds
    ("make_plan", ["+decoder=mcts_verified", *PROMPT], "`decoder/scorer=likelihood_value`"),
    (
        "make_plan",
        ["+decoder=verified_best_of_n", *COUNTDOWN, "decoder.population.prune_conflicts=true"],
        "`decoder.population.prune_conflicts=auto`",
    ),
    ("make_plan", ["+decoder=llada", *COUNTDOWN, "decoder.commit.steps=3"], "`decoder.commit.steps=4`"),
    ("make_plan", ["+decoder=rcr", "decoder/commit=threshold"], "`decoder/commit=fill_block`"),
]


def test_every_rule_has_a_case() -> None:
    """A new rule cannot be added without a command that breaks it and a check that its fix works."""
    assert {rule.__name__ for rule in plan.RULES} <= {case[0] for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{' '.join(c[1])}" for c in CASES])
def test_a_refusals_fixes_each_make_a_command_that_runs(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    rule, command, fix, *tweak = case
    fired: list[str] = []

    def watched(check: Callable[[plan.Meeting], str | None]) -> Callable[[plan.Meeting], str | None]:
        def watch(meeting: plan.Meeting) -> str | None:
            message = check(meeting)
            fired.extend([check.__name__] if message else [])
            return message

        return watch

    monkeypatch.setattr(plan_rules, "RULES", tuple(watched(r) for r in plan.RULES))  # what validate reads
    message = refusal(command, *tweak)
    assert message is not None, f"{command} was not refused"
    assert fired == ([] if rule in ("_canvas_fits", "make_plan") else [rule]), message
    assert "\n" not in message and fix in message, message
    assert fixes(message), f"no fix named: {message}"
    for fix_ in fixes(message):
        fixed = applied(command, fix_)
        assert refusal(fixed, *tweak) is None, (message, fixed, refusal(fixed, *tweak))


def test_a_population_that_needs_a_verifier_decoded_without_one_is_told_what_reads_it(adapter: ModelAdapter) -> None:
    """Decoding with no verifier at all (the Python API's ``decode``): the fix drops every part that reads one."""
    engine = RolloutEngine(adapter=adapter)
    with pytest.raises(ValueError) as refused:
        text_decoder("verified_best_of_n").plan(engine, 16, 8, None)
    [fix] = fixes(str(refused.value))
    assert fix == ["decoder.population.stop_when_accepted=false", "decoder/population/choice=best_score"]
    assert text_decoder("verified_best_of_n", *fix).plan(engine, 16, 8, None).population.size == 4


def test_a_canvas_too_long_is_told_the_longest_that_fits() -> None:
    """Rule 19's fix is the longest generation of whole blocks (of 8) that fits the model's 128 positions."""
    message = refusal(["+decoder=llada", *COUNTDOWN, "task.gen_length=256"])
    prompt = int(re.search(r"\(prompt (\d+) \+", message).group(1))
    assert f"`task.gen_length={(128 - prompt) // 8 * 8}`" in message, message


# ------------------------------------------------------------------ the command line, as a shell reads it


@pytest.fixture(scope="module")
def sudoku_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Sudoku denoiser saved like the shipped one: a run that is not refused is quick."""
    directory = tmp_path_factory.mktemp("tiny_sudoku")
    tiny_denoiser(vocab=10, mask_id=9, max_len=81, grid_side=9).save(directory)
    return directory


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m dlmsearch COMMAND`` as bash runs it (the fix pasted as the message writes it)."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(ROOT)}
    line = f"{shlex.quote(sys.executable)} -m dlmsearch {command}"
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_cli_refuses_in_one_line_and_runs_with_its_fix(sudoku_model: Path, tmp_path: Path) -> None:
    base = f"+decoder=rcr decoder/trigger=always model.path={sudoku_model} task.limit=1 out_dir={tmp_path / 'run'}"
    done = shell(base, tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-2000:])
    [fix] = re.findall(r"`([^`]+)`", lines[0])
    fixed = shell(f"{base} {fix}", tmp_path)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert (tmp_path / "run" / "results.jsonl").exists()


# Two mistakes in one command: two refusals, one at a time, each by its own rule with its own fix
TWO_MISTAKES = [
    ["+decoder=remdm", *UNIFORM],  # a revision and a temperature that a uniform-noise model's own step replaces
    ["+decoder=wino", *BLOCK, "cache=prefix"],  # a full-attention cache, and a decoder that needs a shadow block
    ["+decoder=mcts", *UNIFORM, "cache=dkv"],  # a layerwise cache, and a tree over masked positions
]


@pytest.mark.parametrize("command", TWO_MISTAKES, ids=[" ".join(c) for c in TWO_MISTAKES])
def test_following_each_fix_in_turn_ends_in_a_run(command: list[str]) -> None:
    seen = []
    while (message := refusal(command)) is not None:
        assert message not in seen and len(seen) < 2, seen + [message]
        seen.append(message)
        command = applied(command, fixes(message)[0])
    assert len(seen) == 2, seen
