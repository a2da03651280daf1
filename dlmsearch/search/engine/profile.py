"""Where an engine's time goes: the model's forward against the engine's own work around it.

For benchmarks and for finding a host-bound loop: with ``RolloutEngine(profile=ForwardProfile())``
every forward is timed twice, the model call alone (``model_s``) and the call with what the
engine does on its vocabulary-sized logits (``summary_s``: softmax, argmax, statistics, the copy
to the host). On CUDA both are synchronised, which costs a little; without a profile nothing is
timed and nothing synchronises.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import torch


@attrs.define
class ForwardProfile:
    """Accumulated seconds over forwards, since the last ``reset``."""

    model_s: float = 0.0  # inside the model's forward
    summary_s: float = 0.0  # the forward plus the engine's per-forward summaries
    forwards: int = 0  # model calls (a split after running out of memory counts each piece)

    def reset(self) -> None:
        self.model_s, self.summary_s, self.forwards = 0.0, 0.0, 0

    @contextmanager
    def timing(self, part: str, device: str) -> Iterator[None]:
        """Add the time of the enclosed block (synchronised on CUDA) to ``part`` (``model`` or ``summary``)."""
        sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
        sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            sync()
            elapsed = time.perf_counter() - start
            if part == "model":
                self.model_s += elapsed
                self.forwards += 1
            else:
                self.summary_s += elapsed
