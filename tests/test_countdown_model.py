"""The shipped Countdown model (a LLaDA checkpoint the project trains) end to end on CPU: its
tokenizer and chat template, stop ids, known problems solved, the caches, lm-eval's
``generate_until`` on a local task, the Python API and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlmsearch.api import Decoder, Model
from dlmsearch.config import build, compose
from dlmsearch.tasks.arithmetic import extract_equation
from dlmsearch.tasks.countdown import CountdownProblem, check_equation, load_countdown, shipped_countdown_path

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
SMALL = [p for _, p in load_countdown(shipped_countdown_path("small"))]


def prompt(problem: CountdownProblem) -> str:
    return f"Make {problem.target} from {', '.join(map(str, problem.numbers))}."


def solved(texts: list[str], problems: list[CountdownProblem]) -> list[bool]:
    return [check_equation(extract_equation(t), p).correct for t, p in zip(texts, problems)]


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load("countdown", device="cpu")


@pytest.fixture(scope="module")
def shipped() -> Path:
    """The shipped model's directory, as ``model=countdown`` composes it."""
    return Path(compose(["model=countdown"]).model.path)


def test_checkpoint_is_in_llada_format(shipped: Path) -> None:
    config = json.loads((shipped / "config.json").read_text())
    assert config["model_type"] == "llada" and config["architectures"] == ["LLaDAModelLM"]
    assert config["mask_token_id"] == 1402 and config["embedding_size"] == config["vocab_size"] == 1408
    from safetensors import safe_open

    with safe_open(str(shipped / "model.safetensors"), framework="pt") as weights:
        names = set(weights.keys())
    assert {
        "model.transformer.wte.weight",
        "model.transformer.ln_f.weight",
        "model.transformer.ff_out.weight",
        "model.transformer.blocks.0.ff_proj.weight",
        "model.transformer.blocks.0.attn_out.weight",
    } <= names
    assert (shipped / "model.safetensors").stat().st_size < 8_000_000  # small enough to ship


def test_tokenizer_and_chat_template_round_trip(shipped: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(shipped), local_files_only=True)  # no remote code
    assert (
        tokenizer.mask_token_id == 1402
        and tokenizer.eos_token_id == 1401
        and tokenizer.convert_tokens_to_ids("<|eot_id|>") == 1405
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Make 42 from 14, 6, 18."}], add_generation_prompt=True, tokenize=False
    )
    assert text == (
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nMake 42 from 14, 6, 18.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    answer = "18-14=4,4*6=24 and any text: ü"
    assert tokenizer.decode(tokenizer(answer, add_special_tokens=False)["input_ids"]) == answer


def test_stop_ids_cut_the_answer() -> None:
    task = build(compose(["model=countdown", "task=countdown", "task.limit=1"]), "task")
    assert task.gen_length == 16 and task.block_length == 8 and task.tier == "small" and task.stop_ids == (1401, 1405)
    item = task.items()[0]
    answer = "18-14=4,4*6=24"  # the right numbers, the wrong target
    ids = task._tokenizer(answer, add_special_tokens=False)["input_ids"]
    tokens = torch.tensor(ids + [1405] + [1401] * (16 - len(ids) - 1))
    assert task.decode(tokens) == answer
    assert task.details(item, tokens) == {"equation": "(18-14)*6", "value": "24", "why_wrong": "equals 24, not 42"}


# Of the first 16 problems of the small tier, the ones `llada` (block 8) solves with the shipped
# model, measured once (runs/countdown_claims/card/presets/small/llada): 11 of 16.
KNOWN_SOLVED = {2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14}


def test_llada_solves_known_problems(model: Model) -> None:
    problems = SMALL[:16]
    generations = Decoder.from_preset("llada").generate(
        model, [prompt(p) for p in problems], gen_length=16, block_length=8, batch_size=16
    )
    found = {i for i, ok in enumerate(solved([g.text for g in generations], problems)) if ok}
    assert len(found & KNOWN_SOLVED) >= len(KNOWN_SOLVED) - 1, [
        g.text for g in generations
    ]  # one flip of a close call allowed
    assert all(g.steps == 16 and g.row_forwards == 16 for g in generations)


def test_prefix_and_dual_caches_decode(model: Model) -> None:
    problems = SMALL[:8]
    computed = {}
    for cache in ("none", "prefix", "dual"):
        generations = Decoder.from_preset("fast_dllm").generate(
            model, [prompt(p) for p in problems], gen_length=16, block_length=8, cache=cache
        )
        texts = [g.text for g in generations]
        assert sum(solved(texts, problems)) >= 3, (cache, texts)
        computed[cache] = sum(g.token_forwards for g in generations)
    assert computed["dual"] < computed["prefix"] < computed["none"]  # what the caches are for


def test_python_api_matches_the_cli(model: Model, tmp_path: Path) -> None:
    from dlmsearch.run import run

    run(
        compose(
            [
                "+decoder=adalook",
                "model=countdown",
                "model.device=cpu",
                "task=countdown",
                "task.limit=4",
                f"out_dir={tmp_path}",
            ]
        )
    )
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    generations = Decoder.from_preset("adalook").generate(
        model, [prompt(p) for p in SMALL[:4]], gen_length=16, block_length=8
    )
    assert [g.text for g in generations] == [r["output"] for r in records]
    assert [g.steps for g in generations] == [r["steps"] for r in records]
    assert [r["correct"] for r in records] == solved([g.text for g in generations], SMALL[:4])


@pytest.mark.slow
def test_default_text_run_from_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "dlmsearch",
        "+decoder=adalook",
        "model=countdown",
        "task=countdown",
        "task.limit=8",
        f"out_dir={tmp_path}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "adalook on countdown: 8 items" in done.stdout and "--- equation:" in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["items"] == 8 and summary["errors"] == 0 and summary["mean_steps"] > 0


@pytest.mark.slow
def test_lm_eval_generate_until_on_a_local_countdown_task(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (optional extra): pip install -e '.[lm_eval]'")
    import datasets.config
    import huggingface_hub.constants
    import lm_eval
    from lm_eval.tasks import TaskManager

    from dlmsearch.lm_eval import DLMSearchLM

    data = ROOT / "tests" / "data" / "lm_eval_countdown"
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(data)
    monkeypatch.syspath_prepend(str(data))
    lm = DLMSearchLM.create_from_arg_string(
        "family=countdown,decoder=llada,gen_length=16,block_length=8,batch_size=4,device=cpu", {}
    )
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["dlmsearch_countdown_small4"],
        task_manager=TaskManager(include_path=str(data), include_defaults=False),
        log_samples=True,
    )
    samples = results["samples"]["dlmsearch_countdown_small4"]
    texts = [s["resps"][0][0] for s in samples]
    direct = Decoder.from_preset("llada").generate(
        lm.model, [prompt(p) for p in SMALL[:4]], gen_length=16, block_length=8
    )
    assert texts == [g.text for g in direct]
    assert results["results"]["dlmsearch_countdown_small4"]["solved,none"] == pytest.approx(
        sum(solved(texts, SMALL[:4])) / 4
    )
