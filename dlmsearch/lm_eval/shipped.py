"""dlmsearch's own lm-eval tasks over the data shipped in the package (``tasks/*.yaml``), offline.

``python -m dlmsearch.lm_eval`` adds :data:`TASKS_DIR` to lm-eval's task paths, so ``--tasks
dlmsearch_gsm8k`` and ``--tasks dlmsearch_countdown`` need no download (lm-eval's own ``gsm8k``
fetches ``openai/gsm8k`` from the Hugging Face Hub). Any other lm-eval model can use them too:
``lm-eval run --include_path "$(python -c 'import dlmsearch.lm_eval.shipped as s; print(s.TASKS_DIR)')" ...``.
The YAMLs name the functions below with ``!function dlmsearch.lm_eval.shipped.NAME``.

- ``dlmsearch_gsm8k``: the 1319 GSM8K test problems (``dlmsearch/data/gsm8k``), zero-shot, with
  the prompt and the judge of ``python -m dlmsearch task=gsm8k`` (the question, then "Please
  reason step by step, and put your final answer after ####."; correct when the number the text
  states equals the reference), 256 tokens.
- ``dlmsearch_countdown``: the held-out ``small`` tier (256 problems, numbers 1-20) with the
  prompt the shipped Countdown model was trained on, 16 tokens, judged as ``task=countdown``
  (the equation uses each number once and reaches the target).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
TASK_NAMES = ("dlmsearch_gsm8k", "dlmsearch_countdown")
COUNTDOWN_TEMPLATE = "Make {target} from {numbers}."  # the shipped model's trained_on.json (tested)
COUNTDOWN_TIER = "small"  # the shipped model's trained_on.json (tested)


def _test_split(rows: list[dict[str, Any]]) -> Any:
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def gsm8k_dataset(**_: Any) -> Any:
    """The shipped GSM8K test split: ``question``, ``answer``, ``reference`` (the gold number) and ``prompt``."""
    from dlmsearch.tasks.gsm8k import DEFAULT_INSTRUCTION, gsm8k_prompt, load_gsm8k, shipped_gsm8k_path

    return _test_split(
        [
            {
                "id": id_,
                "question": p.question,
                "answer": p.solution,
                "reference": p.reference,
                "prompt": gsm8k_prompt(p.question, DEFAULT_INSTRUCTION),
            }
            for id_, p in load_gsm8k(shipped_gsm8k_path())
        ]
    )


def gsm8k_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``correct``: the number the text states equals the reference (``task=gsm8k``'s judge)."""
    from dlmsearch.tasks.answers import extract_answer, numbers_equal

    return {"correct": float(numbers_equal(extract_answer(results[0]), doc["reference"]))}


def countdown_dataset(**_: Any) -> Any:
    """The shipped Countdown ``small`` tier: ``numbers`` ("3, 4, 6"), ``target`` and ``prompt``."""
    from dlmsearch.tasks.countdown import load_countdown, shipped_countdown_path

    rows = []
    for id_, p in load_countdown(shipped_countdown_path(COUNTDOWN_TIER)):
        numbers = ", ".join(map(str, p.numbers))
        rows.append(
            {
                "id": id_,
                "numbers": numbers,
                "target": p.target,
                "prompt": COUNTDOWN_TEMPLATE.format(numbers=numbers, target=p.target),
            }
        )
    return _test_split(rows)


def countdown_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """``solved``: the equation uses each number once and reaches the target (``task=countdown``'s judge)."""
    from dlmsearch.tasks.arithmetic import extract_equation
    from dlmsearch.tasks.countdown import check_equation
    from dlmsearch.tasks.countdown_problems import CountdownProblem

    problem = CountdownProblem(numbers=tuple(int(n) for n in doc["numbers"].split(",")), target=int(doc["target"]))
    return {"solved": float(check_equation(extract_equation(results[0]), problem).correct)}


class _QuietCustomDataset(logging.Filter):
    """Drops lm-eval's note, for a task with ``custom_dataset``, that custom kwargs go to ``--metadata``:
    these tasks take none."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(message.startswith(f"{name}: Custom kwargs") for name in TASK_NAMES)


logging.getLogger("lm_eval.api.task").addFilter(_QuietCustomDataset())
