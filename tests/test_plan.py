"""The decode plan: every refused combination fails once, before any forward, with one line; the
configured decoder is never written; a preset uses what the task's verifier offers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import (
    MASK_ID,
    VOCAB,
    CountingModule,
    NoRepeatVerifier,
    cached_adapter,
    make_requests,
    text_decoder,
    tiny_denoiser,
)

from dlmsearch.config import build, compose
from dlmsearch.core import attention as pattern
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.run import run
from dlmsearch.search.engine.cache_policy import DualCache, PrefixCache, cache_policy
from dlmsearch.search.engine.rollout import RolloutEngine

torch.set_num_threads(1)


class FinalOnly(NoRepeatVerifier):
    """A task that checks complete outputs only (Countdown's kind)."""

    checks_partial = False


def test_verified_best_of_n_prunes_only_where_the_task_checks_partial_outputs() -> None:
    engine = RolloutEngine(adapter=ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB))
    decoder = text_decoder("verified_best_of_n")
    assert decoder.population.prune_conflicts == "auto"
    assert decoder.plan(engine, 16, 8, NoRepeatVerifier()).population.prune_conflicts is True
    assert decoder.plan(engine, 16, 8, FinalOnly()).population.prune_conflicts is False
    assert decoder.population.prune_conflicts == "auto", "the plan wrote into the configured decoder"
    results = decoder.decode(engine, make_requests([3, 4], 16), 8, verifier=FinalOnly())
    assert all(not bool((r.tokens == MASK_ID).any()) for r in results)


def test_a_refused_combination_fails_before_any_forward() -> None:
    module = CountingModule(tiny_denoiser())
    engine = RolloutEngine(adapter=ModelAdapter(module=module, mask_id=MASK_ID, vocab_size=VOCAB))
    decoder = text_decoder("verified_best_of_n", "decoder.population.prune_conflicts=true")
    with pytest.raises(ValueError, match="prune_conflicts needs a verifier that checks partial outputs"):
        decoder.decode(engine, make_requests([3], 16), 8, verifier=FinalOnly())
    with pytest.raises(ValueError, match="needs cache=none"):
        text_decoder("klass").decode(RolloutEngine(adapter=cached_adapter(), cache="prefix"), make_requests([3], 16), 8)
    assert module.calls == []


def test_binding_leaves_the_configured_rule_unwritten() -> None:
    decoder = text_decoder("llada")
    engine = RolloutEngine(adapter=ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB))
    one, two = decoder.plan(engine, 16, 8), decoder.plan(engine, 16, 16)
    assert (one.block_budget, two.block_budget) == (decoder.commit.steps // 2, decoder.commit.steps)
    assert decoder.commit.block_budget is None


def test_a_run_refuses_once_at_the_start(tmp_path: Path) -> None:
    """The whole run stops with one line before decoding, instead of recording the error per item."""
    cfg = compose(
        [
            "+decoder=verified_best_of_n",
            "decoder.population.prune_conflicts=true",
            "task=countdown",
            "model=countdown",
            "task.limit=3",
            f"out_dir={tmp_path}",
        ]
    )
    with pytest.raises(ValueError, match="prune_conflicts needs a verifier that checks partial outputs"):
        run(cfg)
    assert not (tmp_path / "results.jsonl").exists() or not (tmp_path / "results.jsonl").read_text().strip()


def test_cache_policies_by_group_and_by_the_older_name() -> None:
    assert isinstance(build(compose(["cache=dual"]), "engine", adapter=cached_adapter()).cache, DualCache)
    assert isinstance(build(compose(["engine.cache=prefix"]), "engine", adapter=cached_adapter()).cache, PrefixCache)
    with pytest.raises(ValueError, match="unknown cache policy 'prefx'; available: auto, none, prefix, dual"):
        cache_policy("prefx")


def test_block_causal_attention_counts_blocks_from_the_first_real_token() -> None:
    real = torch.tensor(
        [[False, True, True, True, True, True, True]]
    )  # one pad, then positions 0..5: blocks {0,1}, {2,3}, {4,5}
    mask = pattern.block_causal(real, block_length=2)[0]
    assert mask[1].tolist() == [False, True, True, False, False, False, False]  # block 0 sees itself
    assert mask[3].tolist() == [False, True, True, True, True, False, False]  # block 1 sees block 0 and itself
    assert mask[6].tolist() == [False, True, True, True, True, True, True]  # block 2 sees everything real
    assert not bool(mask[:, 0].any())  # the padding is seen by no one


def test_a_fallback_of_the_same_name_keeps_its_own_plan(tmp_path: Path) -> None:
    """A fallback preset named like the primary (``+decoder=adalook`` with overrides, fallback
    ``adalook``) must not replace the primary's plan (issue 36: plans were kept by decoder name,
    so the primary decoded with the fallback's commit rule)."""
    from dlmsearch.run import Decoding, build_fallback
    from dlmsearch.tasks.sudoku import SudokuTask

    cfg = compose(
        ["+decoder=adalook", "decoder.commit.threshold=0.5", "fallback=adalook", "task.limit=2", f"out_dir={tmp_path}"]
    )
    engine = build(cfg, "engine", adapter=build(cfg, "model"))
    primary, fallback = build(cfg, "decoder"), build_fallback(cfg)
    assert primary.name == fallback.name and primary.commit.threshold != fallback.commit.threshold
    task = SudokuTask(limit=2)
    plan = Decoding(primary, engine, task, fallback).prepare(task.items())
    assert plan.commit.threshold == primary.commit.threshold == 0.5
