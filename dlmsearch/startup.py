"""What both command lines (``python -m dlmsearch`` and ``python -m dlmsearch.serve``) do around
their work: the bare command lists the decoder presets (exit 0); the command line is checked
before Hydra composes it (so a mistake leaves no run directory behind), a missing decoder is
named with the choices, and a mistake ends the process as one ``error: ...`` line on stderr,
exit 2, not a traceback or Hydra's message and exit 1. A run that fails before it decodes leaves
nothing behind (:func:`~dlmsearch.hydra_job.discard_job_dir`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from omegaconf import DictConfig

from dlmsearch.config import ConfigError, check_command_line, decoder_presets, preset_summary
from dlmsearch.hydra_job import discard_job_dir


def fail(error: object, code: int = 2) -> NoReturn:
    """End the process with one ``error: ...`` line on stderr."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(code)


def presets_text(command: str) -> str:
    """What the bare command prints: how to choose a decoder, then each preset and what it is."""
    names = decoder_presets()
    width = max(map(len, names))
    return "\n".join(
        [
            f"{command} +decoder=NAME [key=value ...], NAME one of the decoder presets:",
            *(f"  {name:<{width}}  {preset_summary(name)}" for name in names),
            f"A preset's parameters: {command} +decoder=NAME --cfg job --package decoder",
        ]
    )


def no_decoder() -> str:
    return f"no decoder chosen: add +decoder=NAME, one of: {', '.join(decoder_presets())}"


def start(hydra_main: Callable[[], None], config_name: str = "config", command: str = "python -m dlmsearch") -> None:
    """Run ``hydra_main`` for the command line, checked first against ``conf/<config_name>.yaml``
    (an unknown key, group or option, or no decoder, is one line naming it and the closest valid
    names, exit 2, before Hydra makes a run directory); without arguments, list the presets (exit 0)."""
    if not sys.argv[1:]:
        print(presets_text(command))
        sys.exit(0)
    try:
        composed = check_command_line(sys.argv[1:], config_name)
    except ConfigError as error:
        fail(error)
    if any("decoder" not in cfg for cfg in composed):
        fail(no_decoder())
    hydra_main()


def require_decoder(cfg: DictConfig) -> None:
    """Exit 2 with the decoder presets where the command line chose none (one Hydra composed
    without :func:`start`'s check, e.g. with ``--config-dir``)."""
    if "decoder" not in cfg:
        discard_job_dir()
        fail(no_decoder())
