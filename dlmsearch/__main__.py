"""Command line: ``python -m dlmsearch +decoder=adalook [overrides]``."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from dlmsearch.config import CONF_DIR, ConfigError
from dlmsearch.hydra_job import discard_job_dir
from dlmsearch.startup import fail, require_decoder, start


def _report(summary: dict) -> None:
    accuracy = summary["accuracy"]
    print(
        f"{summary['decoder']}"
        + (f" [{summary['label']}]" if summary.get("label") else "")  # a sweep's arm
        + f" on {summary['task']}"
        + (f" (cache {summary['cache']})" if summary.get("cache", "none") != "none" else "")
        + (f" ({summary['population']['size']} particles)" if isinstance(summary.get("population"), dict) else "")
        + f": {summary['items']} items, "
        + (f"solved/correct {100 * accuracy:.1f} %, " if accuracy is not None else "")
        + f"mean steps {summary['mean_steps']:.2f}, mean row-forwards {summary['mean_row_forwards']:.2f}, "
        f"mean token-forwards {summary['mean_token_forwards']:.0f}, "
        + (
            f"mean live particles {summary['mean_live_particles']:.2f}, "
            if summary.get("mean_live_particles", 1.0) != 1.0
            else ""
        )
        + f"wall {summary['wall_seconds']:.1f} s"
    )
    print(
        f"latency p50/p95/p99 {summary['latency_p50_s']:.3f}/{summary['latency_p95_s']:.3f}/{summary['latency_p99_s']:.3f} s per item, "
        f"{summary['samples_per_s']} items/s, {summary['tokens_per_s']} tokens/s, peak RSS {summary['peak_rss_mb']} MB"
        + (f", CUDA peak {summary['cuda_max_allocated_mb']} MB" if "cuda_max_allocated_mb" in summary else "")
        + f"; errors {summary['errors']}, fallbacks {summary['fallbacks']}, deadline hits {summary['deadline_hits']}"
    )
    for example in summary["examples"]:
        print(example)


# What a mistake in the config or the files it names raises: one ``error:`` line, exit 2.
MISTAKES = (ConfigError, FileNotFoundError, ValueError, TypeError, FloatingPointError)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> None:
    require_decoder(cfg)
    from dlmsearch.run import Interrupted, decode_run, prepare_run

    try:
        prepared = prepare_run(cfg)
    except BaseException as error:  # nothing decoded: Hydra's directory for the job goes too
        discard_job_dir()
        if isinstance(error, MISTAKES):
            fail(error)
        raise
    try:
        summary = decode_run(prepared)  # run.json says how it ended
    except MISTAKES as error:
        fail(error)
    except Interrupted as stop:
        print(f"\n{stop}", file=sys.stderr)
        sys.exit(128 + stop.signum)
    _report(summary)
    print(f"results: {cfg.out_dir}")
    if summary["errors"]:
        print(f"{summary['errors']} item(s) ended in error (see the 'error' field in results.jsonl)", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    """Console-script entry point: the command line is checked first, so that an unknown key,
    group or option is one line naming it and the closest valid names (exit 2), not Hydra's."""
    start(_main)


if __name__ == "__main__":
    main()
