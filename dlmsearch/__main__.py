"""Command line: ``python -m dlmsearch +decoder=adalook [overrides]``."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from dlmsearch.config import CONF_DIR, ConfigError, decoder_presets


def _report(summary: dict) -> None:
    accuracy = summary["accuracy"]
    print(
        f"{summary['decoder']} on {summary['task']}: {summary['items']} items, "
        + (f"solved/correct {100 * accuracy:.1f} %, " if accuracy is not None else "")
        + f"mean steps {summary['mean_steps']:.2f}, mean row-forwards {summary['mean_row_forwards']:.2f}, "
        f"mean token-forwards {summary['mean_token_forwards']:.0f}, "
        f"wall {summary['wall_seconds']:.1f} s"
    )
    for example in summary["examples"]:
        print(example)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> None:
    if "decoder" not in cfg:
        print(f"no decoder chosen: add +decoder=NAME, one of: {', '.join(decoder_presets())}", file=sys.stderr)
        sys.exit(2)
    from dlmsearch.run import run

    try:
        summary = run(cfg)
    except (ConfigError, FileNotFoundError, ValueError, TypeError, FloatingPointError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    _report(summary)
    print(f"results: {cfg.out_dir}")


def main() -> None:
    """Console-script entry point."""
    _main()


if __name__ == "__main__":
    main()
