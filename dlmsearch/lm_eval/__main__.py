"""``python -m dlmsearch.lm_eval [lm-eval arguments]``: lm-eval's command line with ``--model dlmsearch``.

Registers the model (importing :mod:`dlmsearch.lm_eval.backend`), adds ``--model dlmsearch`` and, where
not given, ``--device auto`` (lm-eval's default is cuda:0) and ``--batch_size 8``; everything else
goes to lm-eval as typed, e.g. ``--model_args path=DIR,family=llada,decoder=fast_dllm --tasks dlmsearch_gsm8k``.

dlmsearch's own tasks (:mod:`dlmsearch.lm_eval.shipped`: ``dlmsearch_gsm8k``, ``dlmsearch_countdown``,
over the data shipped in the package, offline) are found beside any ``--include_path``. When every
task named is one of those or of the ``--include_path`` directory, lm-eval's ~15k built-in tasks are
not indexed (that takes about a minute). A mistake in ``--model_args``, an unknown task, or an
lm-eval task whose data set is on an unreachable Hugging Face Hub ends the run with one line,
``error: ...``, and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NoReturn

DEFAULTS = {"--device": "auto", "--batch_size": "8"}


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def lm_eval_argv(argv: list[str]) -> list[str]:
    """lm-eval's arguments for ours: ``run --model dlmsearch`` and the defaults not given."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if "--model" in given:
        fail("python -m dlmsearch.lm_eval sets --model dlmsearch itself; leave --model out")
    command = argv[:1] if argv[:1] in (["run"], ["ls"], ["validate"]) else []
    rest = argv[len(command) :]
    if command in ([], ["run"]) and not {"-h", "--help"} & set(rest):
        extra = ["--model", "dlmsearch"] + [
            x for key, value in DEFAULTS.items() if key not in given for x in (key, value)
        ]
        return ["run", *extra, *rest]
    return [*command, *rest]


def requested_tasks(argv: list[str]) -> tuple[list[str], str | None]:
    """The task names of ``--tasks`` (space- or comma-separated) and the ``--include_path``, as lm-eval reads them."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--tasks", "-t", nargs="+", action="extend", default=[])
    parser.add_argument("--include_path", default=None)
    parser.add_argument("--config", "-C", default=None)
    known, _ = parser.parse_known_args(argv)
    if known.config is not None:  # tasks may come from the config file: index everything
        return [], known.include_path
    return [name for value in known.tasks for name in value.split(",") if name], known.include_path


def task_manager_class(base: type, only_included: bool) -> type:
    """lm-eval's TaskManager with dlmsearch's task directory included (before the user's
    ``--include_path``, which wins on a clash), and without lm-eval's own tasks when ``only_included``."""
    from dlmsearch.lm_eval.shipped import TASKS_DIR

    class DLMSearchTaskManager(base):  # type: ignore[misc, valid-type]
        def __init__(
            self,
            verbosity: str | None = None,
            include_path: Any = None,
            include_defaults: bool = True,
            metadata: Any = None,
        ) -> None:
            paths = (
                list(include_path)
                if isinstance(include_path, (list, tuple))
                else [include_path]
                if include_path
                else []
            )
            super().__init__(
                verbosity=verbosity,
                include_path=[str(TASKS_DIR), *paths],
                include_defaults=include_defaults and not only_included,
                metadata=metadata,
            )

    return DLMSearchTaskManager


def only_included_tasks(base: type, tasks: list[str], include_path: str | None) -> bool:
    """Whether every task named is a task of dlmsearch's directory or of ``include_path`` (so lm-eval's need not be indexed)."""
    if not tasks:
        return False
    manager = task_manager_class(base, only_included=True)(include_path=include_path)
    return all(name in manager.all_subtasks for name in tasks)


class _NoChatTemplateHint(logging.Filter):
    """Drops lm-eval's advice to set ``--apply_chat_template`` for a model path that looks like an Instruct
    model's: ``--model dlmsearch`` applies the tokenizer's template itself (model_args ``chat=true``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "chat template is not applied" not in " ".join(str(record.msg).split())


_NO_CHAT_TEMPLATE_HINT = _NoChatTemplateHint()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    forwarded = lm_eval_argv(args)
    try:
        import dlmsearch.lm_eval.backend  # noqa: F401  (registers --model dlmsearch)
    except ImportError as error:
        if "needs lm-evaluation-harness" not in str(error):
            raise
        fail(str(error))
    import lm_eval.tasks
    from lm_eval.__main__ import cli_evaluate

    from dlmsearch.lm_eval.model_args import ModelArgsError
    from dlmsearch.lm_eval.shipped import TASK_NAMES

    base = lm_eval.tasks.TaskManager
    tasks, include_path = requested_tasks(forwarded[1:]) if forwarded[:1] == ["run"] else ([], None)
    lm_eval.tasks.TaskManager = task_manager_class(base, only_included_tasks(base, tasks, include_path))
    sys.argv = ["lm-eval", *forwarded]
    logging.getLogger("lm_eval.evaluator").addFilter(_NO_CHAT_TEMPLATE_HINT)
    try:
        cli_evaluate()
    except ModelArgsError as error:
        fail(str(error))
    except (
        ConnectionError
    ) as error:  # datasets' "Couldn't reach 'openai/gsm8k' on the Hub", huggingface_hub's offline mode
        fail(
            f"{error}: lm-eval's own tasks download their data sets from the Hugging Face Hub, which cannot be reached from here; "
            f"dlmsearch's tasks need no network: --tasks {' or '.join(TASK_NAMES)}"
        )
    except ValueError as error:
        if not str(error).startswith("Tasks not found"):
            raise
        fail(f"{error} (dlmsearch's offline tasks: {', '.join(TASK_NAMES)}; lm-eval's: lm-eval ls tasks)")
    finally:
        lm_eval.tasks.TaskManager = base


if __name__ == "__main__":
    main()
