"""``python -m dlmsearch.lm_eval [lm-eval arguments]``: lm-eval's command line with ``--model dlmsearch``.

Registers the model (importing :mod:`dlmsearch.lm_eval`), adds ``--model dlmsearch`` and, where
not given, ``--device auto`` (lm-eval's default is cuda:0) and ``--batch_size 8``; everything else
goes to lm-eval as typed, e.g. ``--model_args path=DIR,family=llada,decoder=fast_dllm --tasks gsm8k``.
"""

from __future__ import annotations

import sys

DEFAULTS = {"--device": "auto", "--batch_size": "8"}


def lm_eval_argv(argv: list[str]) -> list[str]:
    """lm-eval's arguments for ours: ``run --model dlmsearch`` and the defaults not given."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if "--model" in given:
        raise SystemExit("python -m dlmsearch.lm_eval sets --model dlmsearch itself; leave --model out")
    command = argv[:1] if argv[:1] in (["run"], ["ls"], ["validate"]) else []
    rest = argv[len(command) :]
    if command in ([], ["run"]) and not {"-h", "--help"} & set(rest):
        extra = ["--model", "dlmsearch"] + [x for key, value in DEFAULTS.items() if key not in given for x in (key, value)]
        return ["run", *extra, *rest]
    return [*command, *rest]


def main(argv: list[str] | None = None) -> None:
    import dlmsearch.lm_eval  # noqa: F401  (registers --model dlmsearch)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *lm_eval_argv(list(sys.argv[1:] if argv is None else argv))]
    cli_evaluate()


if __name__ == "__main__":
    main()
