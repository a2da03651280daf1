"""Memory per rank under tensor parallelism: weights (split and replicated) and KV cache, from a config.

``python -m dlmsearch.estimate --preset llada2-flash --tp 1 2 4 8`` (or ``--config DIR/config.json``)
prints one markdown table per model. The parts, one job each:
:mod:`~dlmsearch.estimate.architecture` counts a ``config.json``'s parameters exactly, by placement;
:mod:`~dlmsearch.estimate.rank_memory` says what one rank of ``N`` holds (and which ``N`` cannot be
laid out: an :class:`EstimateError`); :mod:`~dlmsearch.estimate.table` writes the markdown;
:mod:`~dlmsearch.estimate.known_models` holds the public shapes behind ``--preset``.
"""

from __future__ import annotations

from dlmsearch.estimate.architecture import Architecture, Attention, EstimateError, architecture, native_config
from dlmsearch.estimate.known_models import PRESETS, preset
from dlmsearch.estimate.rank_memory import RankMemory, rank_memory
from dlmsearch.estimate.table import memory_table

__all__ = [
    "PRESETS",
    "Architecture",
    "Attention",
    "EstimateError",
    "RankMemory",
    "architecture",
    "memory_table",
    "native_config",
    "preset",
    "rank_memory",
]
