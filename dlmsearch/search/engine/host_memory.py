"""Keep freed host memory for reuse when decoding on CPU (glibc's malloc).

Every forward allocates and frees vocabulary-sized tensors (logits, their softmax: 258 MB at
batch 32 x 16 columns x 126k words). With glibc's defaults each free hands the memory back to
the system and the next forward page-faults it in again: on the benchmark's tiny model at batch
32 the host time per forward was 19.6 ms, against 2.7 ms once glibc keeps a pad of freed memory
(``M_TOP_PAD`` and ``M_TRIM_THRESHOLD``; ``experiments/bench_before_after.py``, the table in
``experiments/results/bench/before_after_tiny.md``). CUDA tensors are unaffected: torch's caching allocator reuses them.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_TOP_PAD = -1, -2  # glibc's mallopt parameters (malloc.h)
TOP_PAD_BYTES = 1 << 30
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Ask glibc to keep up to ``TOP_PAD_BYTES`` of freed memory instead of returning it at once
    (once per process; False where the C library is not glibc or refuses)."""
    global _applied
    if _applied is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _applied = bool(
                libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(2**31 - 1))
                and libc.mallopt(M_TOP_PAD, ctypes.c_int(TOP_PAD_BYTES))
            )
        except (OSError, AttributeError):
            _applied = False
    return _applied
