"""The lm-evaluation-harness backend (dlmsearch.lm_eval) on the tiny text checkpoints: generate_until
cut at the requests' stop strings, log-likelihood refused, and lm-eval end to end on a local
two-item task (tests/data/lm_eval/), offline. Skipped where lm-eval is not installed (it is the
optional extra ``dlmsearch[lm_eval]``, too heavy for ``dev``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (optional extra): pip install 'dlmsearch[lm_eval]'")

from lm_eval.api.instance import Instance  # noqa: E402

from dlmsearch.api import Decoder  # noqa: E402
from dlmsearch.lm_eval import DLMSearchLM, cut_at_stop, gen_length_for  # noqa: E402
from dlmsearch.lm_eval.__main__ import lm_eval_argv  # noqa: E402
from tiny_checkpoints import requires_upstream  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "lm_eval"
TASK = "dlmsearch_tiny_gsm8k"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def request(context: str, index: int, **gen_kwargs) -> Instance:
    return Instance(request_type="generate_until", doc={}, arguments=(context, gen_kwargs), idx=index, metadata=("test", index, 1))


def small(family: str, spec, extra: str = "") -> DLMSearchLM:
    return DLMSearchLM.create_from_arg_string(
        f"path={spec.directory},family={family},decoder=fast_dllm,gen_length=16,block_length=8,batch_size=2,device=cpu{extra}",
        {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"},  # what lm-eval's CLI adds: model_args win
    )


def test_stop_strings_and_lengths() -> None:
    assert cut_at_stop("abc Question: x\n\ny", ["\n\n", "Question:"]) == "abc "
    assert cut_at_stop("abc", []) == "abc" and cut_at_stop("abc", [""]) == "abc"
    assert [gen_length_for(n, 32) for n in (1, 32, 33, 256)] == [32, 32, 64, 256]
    assert lm_eval_argv(["--model_args", "path=D,family=llada", "--tasks", "gsm8k"]) == [
        "run", "--model", "dlmsearch", "--device", "auto", "--batch_size", "8", "--model_args", "path=D,family=llada", "--tasks", "gsm8k"
    ]
    assert lm_eval_argv(["run", "--device=cpu", "--batch_size", "2", "--tasks", "x"]) == ["run", "--model", "dlmsearch", "--device=cpu", "--batch_size", "2", "--tasks", "x"]
    assert lm_eval_argv(["ls", "tasks"]) == ["ls", "tasks"]


@requires_upstream
def test_generate_until_cuts_at_until(checkpoints) -> None:
    """Dream's tiny tokenizer decodes some of what the tiny model writes (LLaDA's writes ids beyond
    the tiny tokenizer, so its text is empty): the cut is checked on a real text."""
    spec = checkpoints["dream"]
    lm = small("dream", spec)
    assert lm.batch_size == 2 and lm.model.adapter.device == "cpu"
    context = "Hello there"
    full = Decoder.from_preset("fast_dllm").generate(lm.model, [context], gen_length=16, block_length=8)[0].text
    assert len(full) >= 2, f"the tiny Dream model's text is too short to cut: {full!r}"
    untils = [[], [full[1:]], ["zzz", full[-1], full[1:]], full[1:]]
    texts = lm.generate_until([request(context, i, until=u, do_sample=False) for i, u in enumerate(untils)], disable_tqdm=True)
    assert texts == [full, cut_at_stop(full, [full[1:]]), cut_at_stop(full, ["zzz", full[-1], full[1:]]), cut_at_stop(full, [full[1:]])]
    assert len(texts[1]) < len(full) and len(texts[2]) < len(full)


@requires_upstream
def test_llada_requests_lengths_and_loglikelihood(checkpoints) -> None:
    lm = small("llada", checkpoints["llada"], ",decoder.commit.threshold=0.5,model.logits_eos_inf=true")
    assert lm.decoder.config(lm.model).decoder.commit.threshold == 0.5 and lm.model.adapter.suppressed_ids == checkpoints["llada"].stop_ids[:1]
    requests = [request("Question: 2 + 2?\nAnswer:", 0, until=["Question:"]), request("Hi", 1, until="\n\n", max_gen_toks=5), request("Count:", 2)]
    texts = lm.generate_until(requests, disable_tqdm=True)
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)
    assert all("Question:" not in t for t in texts[:1]) and "\n\n" not in texts[1]
    with pytest.raises(NotImplementedError, match="dlmsearch decodes; log-likelihood requests are not supported"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("a", " b"), 0)])
    with pytest.raises(NotImplementedError, match="dlmsearch decodes; log-likelihood requests are not supported"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("a b",), 0)])
    with pytest.raises(ValueError, match=r"family must be a text model \(llada, dream, sdar, llada2\)"):
        DLMSearchLM(path=str(checkpoints["llada"].directory), family="sudoku")
    with pytest.raises(TypeError, match="unknown model_args: temprature"):
        DLMSearchLM(path=str(checkpoints["llada"].directory), temprature=0.5)


@requires_upstream
def test_simple_evaluate_on_a_local_task(checkpoints, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """lm-eval end to end, offline: a local JSONL task, decoded by the tiny LLaDA, scored by exact match."""
    import datasets.config
    import huggingface_hub.constants
    import lm_eval
    from lm_eval.tasks import TaskManager

    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(DATA)  # the task's data_files path is relative to the working directory
    lm = small("llada", checkpoints["llada"])
    manager = TaskManager(include_path=str(DATA), include_defaults=False)
    results = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=manager, log_samples=True)
    assert results is not None
    scores = results["results"][TASK]
    assert scores["sample_len"] == 2 and 0.0 <= scores["exact_match,last-number"] <= 1.0
    samples = results["samples"][TASK]
    assert len(samples) == 2 and all(isinstance(s["resps"][0][0], str) for s in samples)


@pytest.mark.slow
@requires_upstream
def test_command_line(checkpoints, tmp_path: Path) -> None:
    """``python -m dlmsearch.lm_eval`` (lm-eval's CLI indexes all of its ~15k tasks first: about a minute)."""
    args = f"path={checkpoints['llada'].directory},family=llada,decoder=fast_dllm,gen_length=16,block_length=8,batch_size=2"
    command = [sys.executable, "-m", "dlmsearch.lm_eval", "--model_args", args, "--tasks", TASK, "--include_path", str(DATA), "--output_path", str(tmp_path / "out")]
    env = {**os.environ, **OFFLINE, "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, cwd=DATA, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert TASK in done.stdout and "exact_match" in done.stdout
    assert list((tmp_path / "out").rglob("results_*.json"))
