"""The markdown table of one model's memory per rank, one row per parallel degree."""

from __future__ import annotations

from dlmsearch.estimate.architecture import Architecture
from dlmsearch.estimate.rank_memory import rank_memory

GIB = 2**30
CAPACITIES_GB = (80, 141)  # H100 / A100 80 GB, H200 141 GB: decimal gigabytes, as the cards are sold


HEADER = (
    "| N | weights per rank (GiB) | of which replicated (GiB) | KV cache per rank (GiB) "
    "| total per rank (GiB) | fits 80 GB / 141 GB? |"
)
FITS_LEGEND = (
    "Fits: total per rank within 80e9 / 141e9 bytes (74.5 / 131.3 GiB); activations, logits, workspace "
    "and the CUDA context come on top."
)


def fits(total: int) -> str:
    """``yes``/``no`` per capacity in :data:`CAPACITIES_GB`, joined by `` / ``."""
    return " / ".join("yes" if total <= gb * 10**9 else "no" for gb in CAPACITIES_GB)


def memory_table(arch: Architecture, tp: list[int], dtype: str, batch: int, length: int, cache: str = "prefix") -> str:
    """The markdown block for one model: a heading line, the table, its legend and notes.

    Args:
        arch: the model.
        tp: the parallel degrees, one row each.
        dtype: ``bfloat16`` or ``float32``.
        batch: rows decoded together.
        length: tokens per row, prompt included.
        cache: ``prefix`` or ``none``.
    """
    rows = [rank_memory(arch, n, dtype, batch, length, cache) for n in tp]
    experts = f", {arch.num_experts} routed experts per MoE layer" if arch.num_experts else ""
    lines = [
        f"### {arch.name}: {arch.description}",
        "",
        f"{arch.total / 1e9:.2f}B parameters{experts}; {dtype}, batch {batch} x {length} tokens, KV cache: {cache}",
        "",
        HEADER,
        "|---:|---:|---:|---:|---:|:---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.ranks} | {row.weights / GIB:.2f} | {row.replicated / GIB:.2f} | {row.kv_cache / GIB:.2f} "
            f"| {row.total / GIB:.2f} | {fits(row.total)} |"
        )
    lines += [
        "",
        f"Replicated on every rank: {arch.replicated_parts}. {FITS_LEGEND}",
    ]
    lines += [f"Note: {note}." for row in rows for note in row.notes]
    return "\n".join(lines)
