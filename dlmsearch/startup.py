"""What both command lines (``python -m dlmsearch`` and ``python -m dlmsearch.serve``) do around
their work: the command line is checked before Hydra composes it, a missing decoder is named
with the choices, and a mistake ends the process as one ``error: ...`` line on stderr, exit 2,
not a traceback or Hydra's message and exit 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from omegaconf import DictConfig

from dlmsearch.config import ConfigError, check_command_line, decoder_presets


def fail(error: object, code: int = 2) -> NoReturn:
    """End the process with one ``error: ...`` line on stderr."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(code)


def start(hydra_main: Callable[[], None], config_name: str = "config") -> None:
    """Check the command line against ``conf/<config_name>.yaml`` first (an unknown key, group or
    option is one line naming it and the closest valid names, exit 2), then run ``hydra_main``."""
    try:
        check_command_line(sys.argv[1:], config_name)
    except ConfigError as error:
        fail(error)
    hydra_main()


def require_decoder(cfg: DictConfig) -> None:
    """Exit 2 with the decoder presets where the command line chose none."""
    if "decoder" not in cfg:
        print(f"no decoder chosen: add +decoder=NAME, one of: {', '.join(decoder_presets())}", file=sys.stderr)
        sys.exit(2)
