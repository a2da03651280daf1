"""The lm-evaluation-harness backend (dlmsearch.lm_eval) on the tiny text checkpoints: generate_until
cut at the requests' stop strings, log-likelihood refused, lm-eval end to end on a local
two-item task (tests/data/lm_eval/), offline, and ``python -m dlmsearch.lm_eval`` with the shipped
tasks (dlmsearch_gsm8k, dlmsearch_countdown: offline, without indexing lm-eval's own) and its
one-line errors. Skipped where lm-eval is not installed (the optional extra: ``pip install -e
'.[lm_eval]'`` in a clone)."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

pytest.importorskip("lm_eval", reason="lm-eval is not installed (optional extra): pip install -e '.[lm_eval]'")

from lm_eval.api.instance import Instance
from tiny_checkpoints import requires_upstream

from dlmsearch.api import Decoder
from dlmsearch.lm_eval import DLMSearchLM, cut_at_stop, gen_length_for
from dlmsearch.lm_eval.__main__ import lm_eval_argv

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "lm_eval"
TASK = "dlmsearch_tiny_gsm8k"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def request(context: str, index: int, **gen_kwargs) -> Instance:
    return Instance(
        request_type="generate_until", doc={}, arguments=(context, gen_kwargs), idx=index, metadata=("test", index, 1)
    )


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
        "run",
        "--model",
        "dlmsearch",
        "--device",
        "auto",
        "--batch_size",
        "8",
        "--model_args",
        "path=D,family=llada",
        "--tasks",
        "gsm8k",
    ]
    assert lm_eval_argv(["run", "--device=cpu", "--batch_size", "2", "--tasks", "x"]) == [
        "run",
        "--model",
        "dlmsearch",
        "--device=cpu",
        "--batch_size",
        "2",
        "--tasks",
        "x",
    ]
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
    texts = lm.generate_until(
        [request(context, i, until=u, do_sample=False) for i, u in enumerate(untils)], disable_tqdm=True
    )
    assert texts == [
        full,
        cut_at_stop(full, [full[1:]]),
        cut_at_stop(full, ["zzz", full[-1], full[1:]]),
        cut_at_stop(full, [full[1:]]),
    ]
    assert len(texts[1]) < len(full) and len(texts[2]) < len(full)


@requires_upstream
def test_llada_requests_lengths_and_loglikelihood(checkpoints) -> None:
    lm = small("llada", checkpoints["llada"], ",decoder.commit.threshold=0.5,model.logits_eos_inf=true")
    assert (
        lm.decoder.config(lm.model).decoder.commit.threshold == 0.5
        and lm.model.adapter.suppressed_ids == checkpoints["llada"].stop_ids[:1]
    )
    requests = [
        request("Question: 2 + 2?\nAnswer:", 0, until=["Question:"]),
        request("Hi", 1, until="\n\n", max_gen_toks=5),
        request("Count:", 2),
    ]
    texts = lm.generate_until(requests, disable_tqdm=True)
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)
    assert all("Question:" not in t for t in texts[:1]) and "\n\n" not in texts[1]
    with pytest.raises(NotImplementedError, match="dlmsearch decodes; log-likelihood requests are not supported"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("a", " b"), 0)])
    with pytest.raises(NotImplementedError, match="dlmsearch decodes; log-likelihood requests are not supported"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("a b",), 0)])
    with pytest.raises(
        ValueError, match=r"family must be a text model \(llada, dream, sdar, llada2, diffusion_gemma\)"
    ):
        DLMSearchLM(path=str(checkpoints["llada"].directory), family="sudoku")
    with pytest.raises(ValueError, match="unknown model_args: temprature"):
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
    command = [
        sys.executable,
        "-m",
        "dlmsearch.lm_eval",
        "--model_args",
        args,
        "--tasks",
        TASK,
        "--include_path",
        str(DATA),
        "--output_path",
        str(tmp_path / "out"),
    ]
    env = {**os.environ, **OFFLINE, "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, cwd=DATA, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert TASK in done.stdout and "exact_match" in done.stdout
    assert list((tmp_path / "out").rglob("results_*.json"))


# ------------------------------------------------ python -m dlmsearch.lm_eval: shipped tasks, errors


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The Hugging Face Hub switched off in this process: anything that reaches for it fails. lm-eval's
    CLI logs to the stderr of the test that first ran it: each test gets its own handler (then none)."""
    import logging

    import datasets.config
    import huggingface_hub.constants
    import lm_eval.utils

    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() sets sys.argv for lm-eval's parser
    logger = logging.getLogger("lm_eval")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)
    yield
    logger.handlers[:] = handlers
    logger.propagate, logger.level = propagate, level


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``python -m dlmsearch.lm_eval ARGV`` in this process: exit status, stdout, stderr."""
    from dlmsearch.lm_eval.__main__ import main

    try:
        main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_shipped_tasks_load_offline_with_the_cli_tasks_prompts_and_judges(offline: None) -> None:
    """dlmsearch_gsm8k and dlmsearch_countdown come from the data in the package, with
    ``python -m dlmsearch task=gsm8k`` / ``task=countdown model=countdown``'s prompts and judges."""
    from lm_eval.tasks import TaskManager
    from omegaconf import OmegaConf

    from dlmsearch.lm_eval.__main__ import only_included_tasks, task_manager_class
    from dlmsearch.lm_eval.shipped import (
        COUNTDOWN_TEMPLATE,
        COUNTDOWN_TIER,
        TASK_NAMES,
        countdown_results,
        gsm8k_results,
    )
    from dlmsearch.models.trained_on import read_trained_on
    from dlmsearch.shipped import package_data
    from dlmsearch.tasks.gsm8k import GSM8KTask

    manager = task_manager_class(TaskManager, only_included=True)()
    assert (
        set(TASK_NAMES) <= set(manager.all_subtasks) and "gsm8k" not in manager.all_tasks
    )  # lm-eval's own not indexed
    assert only_included_tasks(TaskManager, list(TASK_NAMES), None)
    assert not only_included_tasks(TaskManager, ["dlmsearch_gsm8k", "gsm8k"], None)  # a Hub task: lm-eval's index too
    assert only_included_tasks(TaskManager, ["dlmsearch_tiny_gsm8k", "dlmsearch_countdown"], str(DATA))
    tasks = manager.load(list(TASK_NAMES))["tasks"]
    gsm8k, countdown = (next(t for name, t in tasks.items() if str(name).endswith(n)) for n in TASK_NAMES)
    docs = list(gsm8k.test_docs())
    assert len(docs) == 1319 and docs[0]["reference"] == "18"
    first = GSM8KTask(tokenizer=str(package_data("countdown_model")), mask_id=1402, vocab_size=1408).sources()[
        0
    ]  # any tokenizer: prompts are text
    assert gsm8k.doc_to_text(docs[0]) == first[1] and gsm8k.config.generation_kwargs["max_gen_toks"] == 256
    trained = OmegaConf.create(read_trained_on(str(package_data("countdown_model"))))
    assert (COUNTDOWN_TEMPLATE, COUNTDOWN_TIER) == (trained.template, trained.tier)
    cd_docs = list(countdown.test_docs())
    assert len(cd_docs) == 256 and countdown.doc_to_text(cd_docs[0]) == "Make 42 from 14, 6, 18."
    assert countdown.config.generation_kwargs["max_gen_toks"] == trained.gen_length
    assert gsm8k_results(docs[0], ["so 9 * 2 = 18 dollars.\n#### 18"]) == {"correct": 1.0}
    assert gsm8k_results(docs[0], ["#### 17"]) == {"correct": 0.0}
    assert countdown_results(cd_docs[0], ["18/6=3,14*3=42"]) == {"solved": 1.0}
    assert countdown_results(cd_docs[0], ["13*8=104,104-13=92"]) == {"solved": 0.0}


def test_shipped_task_files_are_package_data() -> None:
    """The task YAMLs ship in the wheel (pyproject's package-data)."""
    from dlmsearch.lm_eval.shipped import TASK_NAMES, TASKS_DIR

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dlmsearch"]
    files = sorted(p.relative_to(ROOT / "dlmsearch").as_posix() for p in TASKS_DIR.iterdir() if p.is_file())
    assert files == [f"lm_eval/tasks/{name}.yaml" for name in sorted(TASK_NAMES)]
    assert all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)


@pytest.mark.parametrize(
    "model_args",
    [
        "family=countdown,decoder=adalook,cache=dual",
        "family=countdown_uniform,decoder=diffusion_gemma",  # lm-eval's greedy requests leave it to the schedule
    ],
)
def test_the_cli_runs_a_shipped_task_offline(
    offline: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    model_args: str,
) -> None:
    """docs/lm_eval.md's Countdown command, offline, from any directory (lm-eval's own tasks are not indexed)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(
        [
            "--model_args",
            model_args,
            "--tasks",
            "dlmsearch_countdown",
            "--limit",
            "2",
        ],
        capsys,
    )
    assert code == 0, err[-3000:]
    assert "dlmsearch_countdown" in out and "solved" in out
    assert "Custom kwargs" not in err and "is not supported" not in err  # no noise about metadata or --batch_size 8


@pytest.mark.parametrize(
    ("model_args", "message"),
    [
        (
            "path=/models/LLaDA-8B-Instruct,family=llada,decoder=adalook,cache=dual",
            "error: model_args path=/models/LLaDA-8B-Instruct is not a directory",
        ),
        ("path={empty},family=llada", "has no config.json"),
        ("family=lada", "error: model_args family must be a text model"),
        ("family=countdown,decoder=adalok", "error: model_args: unknown decoder preset 'adalok'"),
        ("family=countdown,temprature=0.5", "error: unknown model_args: temprature"),
        ("family=countdown,decoder.commit.thresh=0.5", "did you mean decoder.commit.threshold?"),
        ("family=countdown,cache=duall", "unknown cache policy 'duall'"),
    ],
)
def test_model_args_mistakes_are_one_line(
    model_args: str, message: str, offline: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = model_args.format(empty=tmp_path)
    code, _out, err = run_main(["--model_args", args, "--tasks", "dlmsearch_countdown", "--limit", "1"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err and last.startswith("error: ") and message in last, err[-3000:]
    assert (
        "apply_chat_template" not in err
    )  # lm-eval's advice for "Instruct" paths does not apply: dlmsearch applies the template


def test_a_hub_task_offline_is_one_line(offline: None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An lm-eval task whose data set is on the Hub (as lm-eval's gsm8k), with the Hub out of reach."""
    (tmp_path / "hub_gsm8k.yaml").write_text(
        (DATA / "tiny_gsm8k.yaml")
        .read_text()
        .replace("dlmsearch_tiny_gsm8k", "hub_gsm8k")
        .replace("dataset_path: json", "dataset_path: openai/gsm8k\ndataset_name: main")
        .replace("dataset_kwargs:\n  data_files:\n    test: tiny_gsm8k.jsonl\n", "")
    )
    code, _out, err = run_main(
        ["--model_args", "family=countdown", "--tasks", "hub_gsm8k", "--include_path", str(tmp_path), "--limit", "1"],
        capsys,
    )
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert last.startswith("error: ") and "Hugging Face Hub" in last and "dlmsearch_gsm8k" in last


def test_without_lm_eval_the_message_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """dlmsearch is not on PyPI: the hint installs the extra from a clone or the wheel."""
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    monkeypatch.delitem(sys.modules, "dlmsearch.lm_eval.backend")
    code, _out, err = run_main(["--model_args", "family=countdown", "--tasks", "dlmsearch_countdown"], capsys)
    assert (
        code == 2
        and err.startswith("error: dlmsearch.lm_eval needs lm-evaluation-harness")
        and len(err.strip().splitlines()) == 1
    )
    assert "pip install -e '.[lm_eval]'" in err and "'dlmsearch[lm_eval]'" not in err
    assert "pip install -e '.[lm_eval]'" in (ROOT / "docs" / "lm_eval.md").read_text()


def test_a_length_policy_starts_at_gen_length_and_stops_at_max_gen_toks() -> None:
    """Under ``decoder=daedal`` the model arg ``gen_length`` is the initial length and the request's
    ``max_gen_toks`` the ceiling: the shipped varied-length model grows from 8 and stays inside it."""
    lm = DLMSearchLM.create_from_arg_string(
        "family=countdown_varied,decoder=daedal,gen_length=8,block_length=8,batch_size=2,device=cpu",
        {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"},
    )
    context = "Make 54 from 10, 4, 16."
    [text] = lm.generate_until([request(context, 0, until=[], max_gen_toks=40, do_sample=False)], disable_tqdm=True)
    direct = Decoder.from_preset("daedal").generate(
        lm.model, [context], gen_length=8, block_length=8, chat=lm.chat, max_length=40
    )
    assert text == direct[0].text and 8 < len(direct[0].tokens) <= 40
