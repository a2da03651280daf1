"""Unsupervised classifier-free guidance, as LLaDA's ``generate(cfg_scale=s)`` does it.

Each row is forwarded beside a copy of itself with its prompt positions set to the mask (the
unconditional row), in the same model call, and the logits are combined before anything reads
them: ``un + (s + 1) * (cond - un)``. The extra rows are compute, not sequential calls: they
count in row-forwards, never in steps. Every row the engine evaluates (roots, lookahead
branches, particles) gets its guided logits.
"""

from __future__ import annotations

import attrs
import torch

from dlmsearch.validation import number


@attrs.frozen
class Guidance:
    """``scale`` is LLaDA's ``cfg_scale`` (0: off)."""

    scale: float = number(float, 0.0, default=0.0)

    @property
    def active(self) -> bool:
        return self.scale > 0


def unconditional(tokens: torch.Tensor, attention: torch.Tensor, prompt_end: int, mask_id: int) -> torch.Tensor:
    """``tokens`` with every real prompt position (columns before ``prompt_end``) set to the mask."""
    prompt = attention & (torch.arange(tokens.shape[1], device=tokens.device) < prompt_end)[None, :]
    return torch.where(prompt, mask_id, tokens)


def combine(conditional: torch.Tensor, unconditional_logits: torch.Tensor, scale: float) -> torch.Tensor:
    """``un + (s + 1) * (cond - un)``."""
    return unconditional_logits + (scale + 1) * (conditional - unconditional_logits)
