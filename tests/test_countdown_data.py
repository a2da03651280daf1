"""Countdown problems: the generator against brute force, worked answers the judge accepts, the
held-out tiers (disjoint, reachable, never trained on), and the training script's smoke run."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlmsearch.tasks.arithmetic import InvalidExpression, chain_equation, evaluate, extract_equation
from dlmsearch.tasks.countdown import TIERS, CountdownProblem, check_equation, load_countdown, shipped_countdown_path
from dlmsearch.tasks.countdown_problems import combine, draw_problem, draw_tier, solutions

torch.set_num_threads(1)
ROOT = Path(__file__).parents[1]


def brute_force_targets(numbers: tuple[int, int, int]) -> set[int]:
    """Targets in 1-100 of every ``(a op b) op c`` / ``c op (a op b)`` whose inner value is a non-negative whole number."""
    found = set()
    for a, b, c in itertools.permutations(numbers):
        for o1, o2 in itertools.product("+-*/", repeat=2):
            for expression in (f"({a}{o1}{b}){o2}{c}", f"{c}{o2}({a}{o1}{b})"):
                try:
                    inner, value = evaluate(f"{a}{o1}{b}").value, evaluate(expression).value
                except InvalidExpression:
                    continue
                if inner >= 0 and inner.denominator == 1 and value.denominator == 1 and 1 <= value <= 100:
                    found.add(int(value))
    return found


def test_solutions_are_every_reachable_target_and_the_judge_accepts_them() -> None:
    rng = np.random.default_rng(3)
    for _ in range(150):
        numbers = tuple(int(n) for n in rng.choice(np.arange(1, 40), size=3, replace=False))
        worked = solutions(numbers)
        assert set(worked) == brute_force_targets(numbers)
        for target, answers in worked.items():
            for answer in answers:
                assert check_equation(extract_equation(answer), CountdownProblem(numbers, target)).correct, (
                    answer,
                    numbers,
                    target,
                )


def test_steps_are_whole_and_commutative_steps_have_one_spelling() -> None:
    steps = combine(6, 3)
    assert [s.text() for s in steps] == ["6+3=9", "6*3=18", "6-3=3", "6/3=2"]
    assert [s.text() for s in combine(3, 6)] == ["6+3=9", "6*3=18", "6-3=3", "6/3=2"]
    assert [s.text() for s in combine(4, 4)] == ["4+4=8", "4*4=16", "4-4=0", "4/4=1"]
    assert all(s.value >= 0 for a, b in itertools.product(range(12), repeat=2) for s in combine(a, b))


def test_worked_steps_compose_into_one_equation() -> None:
    assert chain_equation("12*5=60,60-1=59") == "(12*5)-1"
    assert chain_equation("8-2=6,9-6=3") == "9-(8-2)"
    assert chain_equation("Step: 3+4=7, 7*2 = 14") == "(3+4)*2"
    assert chain_equation("1+2=3") is None  # one step: an equation of its own
    assert chain_equation("3+4=7,5*2=10") is None  # the first result is never used
    # claimed results are links only: a wrong one makes a wrong equation
    wrong = extract_equation("12*5=61,61-2=59")
    assert wrong == "(12*5)-2" and not check_equation(wrong, CountdownProblem((12, 5, 2), 59)).correct
    assert extract_equation("reasoning\n<answer>(1+2)*3</answer>") == "(1+2)*3"


def test_tiers_are_disjoint_reachable_and_reproducible() -> None:
    triples: dict[str, set[tuple[int, ...]]] = {}
    for tier in TIERS:
        problems = [p for _, p in load_countdown(shipped_countdown_path(tier))]
        triples[tier] = {tuple(sorted(p.numbers)) for p in problems}
        if tier != "d1":
            assert len(triples[tier]) == len(problems)  # distinct triples within a tier
            assert all(p.target in solutions(p.numbers) for p in problems)
    for a, b in itertools.combinations(TIERS, 2):
        assert not triples[a] & triples[b], (a, b)
    small = [p for _, p in load_countdown(shipped_countdown_path("small"))]
    assert len(small) == 256 and max(max(p.numbers) for p in small) <= 20
    from make_countdown_tiers import RECIPES  # experiments/ is on the path (conftest)

    seed, count, low, high, numbers = RECIPES["validation"]
    redrawn = draw_tier(
        seed,
        count,
        low,
        high,
        excluded={tuple(sorted(p.numbers)) for _, p in load_countdown(shipped_countdown_path("d1"))},
        numbers=numbers,
    )
    assert [(p.numbers, p.target) for p in redrawn] == [
        (p.numbers, p.target) for _, p in load_countdown(shipped_countdown_path("validation"))
    ]
    for tier in ("small4", "medium4", "validation4"):
        problems = [p for _, p in load_countdown(shipped_countdown_path(tier))]
        assert all(len(set(p.numbers)) == 4 for p in problems) and len(problems) == RECIPES[tier][1]
        assert max(max(p.numbers) for p in problems) <= RECIPES[tier][3]


def test_four_numbers_take_three_steps_the_judge_accepts() -> None:
    """Four numbers: every worked answer is three steps (a chain, or two pairs then their results) and
    composes into an equation the judge accepts; with three numbers the solver is the two-step one."""
    rng = np.random.default_rng(4)
    shapes = set()
    for _ in range(20):
        numbers = tuple(int(n) for n in rng.choice(np.arange(1, 21), size=4, replace=False))
        for target, answers in solutions(numbers).items():
            for answer in answers:
                steps = answer.split(",")
                assert len(steps) == 3, answer
                assert check_equation(extract_equation(answer), CountdownProblem(numbers, target)).correct, answer
                shapes.add(steps[2].split("=")[0].count(steps[0].split("=")[1]) > 0)
    assert shapes == {True, False}  # some last steps read the first result, some (two pairs) do not directly
    assert solutions((12, 5, 1))[59][0] == "12*5=60,60-1=59"


def test_draws_are_reachable_with_distinct_numbers() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        problem = draw_problem(rng, 1, 20)
        assert len(set(problem.numbers)) == 3 and all(1 <= n <= 20 for n in problem.numbers)
        assert problem.target in solutions(problem.numbers)


def test_training_never_sees_a_held_out_triple() -> None:
    from omegaconf import OmegaConf
    from train_countdown import ProblemSampler, held_out_triples

    excluded = held_out_triples()
    cfg = OmegaConf.load(ROOT / "experiments" / "conf" / "train" / "countdown.yaml").curriculum
    sampler = ProblemSampler(cfg, np.random.default_rng(0), excluded)
    assert sampler.high(0.0) == cfg.start_high and sampler.high(1.0) == cfg.high
    for done in (0.0, 0.5, 1.0):
        for _ in range(200):
            problem, answer = sampler.draw(done)
            assert problem.key() not in excluded
            assert check_equation(extract_equation(answer), CountdownProblem(problem.numbers, problem.target)).correct


TINY = [
    "checkpoint_every=6",
    "batch_size=16",
    "threads=1",
    "warmup_steps=3",
    "lr=3e-3",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.mlp_hidden_size=64",
    "eval_decoders=[llada]",
]


def _train(out_dir: Path, steps: int) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "train_countdown.py"),
            f"steps={steps}",
            *TINY,
            f"out_dir={out_dir}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.slow
def test_train_countdown_checkpoints_resumes_and_writes_a_llada_checkpoint(tmp_path: Path) -> None:
    from dlmsearch.models.loading import load_text_model

    out = tmp_path / "run"
    _train(out, steps=12)
    losses = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in losses] == list(range(1, 13)) and losses[-1]["loss"] < losses[0]["loss"]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals] == [6, 12] and evals[0]["eval"][0]["items"] == 128
    resumed = _train(out, steps=15)
    assert "resumed from" in resumed and "at step 12" in resumed
    assert [json.loads(line)["step"] for line in (out / "loss.jsonl").read_text().splitlines()] == list(range(1, 16))
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["model_type"] == "llada" and config["mask_token_id"] == 1402 and config["n_layers"] == 1
    adapter = load_text_model(str(out / "model"), "llada", 1402, 1408, [1401, 1405], device="cpu", dtype="float32")
    state = torch.load(out / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(adapter.module.state_dict()[k], v) for k, v in state.items())


def test_strict_steps_fails_compensating_slips(tmp_path: Path) -> None:
    from dlmsearch.tasks.arithmetic import wrong_steps

    assert wrong_steps("17+14=29,29*3=93") == ["17+14=29", "29*3=93"] and wrong_steps("12*5=60,60-1=59") == []
    assert wrong_steps("8/3=2,2+1=3") == ["8/3=2"]
    problem = CountdownProblem((17, 14, 3), 93)
    assert check_equation(extract_equation("17+14=29,29*3=93"), problem).correct  # the equation itself is right
