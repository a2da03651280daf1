"""A Hydra callback that collects a multirun when it ends (``sweep.csv``, ``sweep.md``, plots).

Registered by ``conf/hydra/callbacks/collect_sweep.yaml``, which ``conf/config.yaml`` chooses:
every multirun of ``python -m dlmsearch -m ...`` ends with its comparison table printed (and
written, with the paired tests, to ``sweep.md``); the experiment presets set its baseline and
groups. A sweep that stops early
(a job that fails ends a Hydra multirun) is collected with
``python -m dlmsearch.sweeps.collect SWEEP_DIR``, which reads these settings from the sweep's
``multirun.yaml``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class CollectSweep(Callback):
    """On multirun end: collect ``hydra.sweep.dir`` against ``baseline`` (see ``collect``)."""

    def __init__(self, baseline: str | None = None, group_by: list[str] | None = None, connect: bool = False) -> None:
        self.baseline = baseline or None
        self.group_by = list(group_by or [])
        self.connect = bool(connect)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from dlmsearch.sweeps.collect import SweepError, collect, table, write_all

        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            sweep = collect(sweep_dir, self.baseline, self.group_by)
        except SweepError as error:  # a wrong baseline must not hide the runs: collect without it
            log.warning(f"collect_sweep: {error}")
            if self.baseline is None:
                return
            try:
                sweep = collect(sweep_dir, None, self.group_by)
            except SweepError:
                return
        written = write_all(sweep, sweep_dir, self.connect)
        log.info(f"collect_sweep: {len(sweep.rows)} runs -> {', '.join(p.name for p in written)} in {sweep_dir}")
        print("\n".join(["", *table(sweep), "", f"sweep collected: {sweep_dir / 'sweep.md'}"]))
