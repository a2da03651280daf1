"""What the running Hydra job says about itself: its overrides, which of them name its arm of a
sweep, and the directory Hydra made for it (removed again where the job never decoded).

Outside a Hydra job (the Python API, scripts, tests) each answer is empty and nothing is removed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dlmsearch.run_dir import HYDRA_FILES, discard_unused


def _hydra() -> Any:
    """The running job's Hydra config, or None outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def hydra_overrides() -> list[str]:
    """The overrides of the Hydra job running now (the CLI, a sweep's job); none outside one."""
    hydra = _hydra()
    return [str(o) for o in hydra.overrides.task] if hydra is not None else []


def swept_keys(sweep: Any) -> set[str]:
    """The keys a multirun gives several values, from its ``multirun.yaml`` config: each key's
    values as the basic sweeper takes them (the command line's, else ``hydra.sweeper.params``')."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(sweep, "hydra.sweeper.params", default=None) or {}
    given = [str(o) for o in OmegaConf.select(sweep, "hydra.overrides.task", default=None) or []]
    parsed = OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()), *given])
    spec = {o.key_or_group: o.is_sweep_override() for o in parsed}  # later (the command line) wins
    return {key for key, swept in spec.items() if swept}


def sweep_label() -> str | None:
    """The overrides that name this job's arm of a multirun (``ablate.arm=fixed_d2
    decoder.candidates.k=4``: the keys the sweep varies, with this job's values); None outside a
    multirun, or where its sweep configuration cannot be read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    hydra = _hydra()
    if hydra is None or hydra.mode != RunMode.MULTIRUN:
        return None
    try:
        keys = swept_keys(OmegaConf.load(Path(hydra.sweep.dir) / "multirun.yaml"))
    except (OSError, ValueError):
        return None
    own = OverridesParser.create().parse_overrides(hydra_overrides())
    return " ".join(o.input_line.lstrip("+~") for o in own if o.key_or_group in keys) or None


def discard_job_dir() -> None:
    """Remove the directory Hydra made for this job (and the date or sweep folders above it) where
    it holds nothing but Hydra's own files: a run that never decoded leaves nothing behind."""
    hydra = _hydra()
    if hydra is not None:
        own = HYDRA_FILES | {f"{hydra.job.name}.log"}  # the job's log (hydra/job_logging)
        discard_unused(Path(hydra.runtime.output_dir), Path(hydra.runtime.cwd), own)
