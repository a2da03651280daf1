"""PC-Sampler's commit rule (Huang et al., arXiv 2508.13021): LLaDA's schedule ranked by a
position-weighted, frequency-calibrated confidence, and its token-frequency prior."""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import torch

from dlmsearch.search.components.commit import LowConfidenceSchedule
from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import check_type, number


def load_token_frequencies(path: str | None) -> tuple[torch.Tensor, float]:
    """A token-frequency prior ``(frequency per id, the frequency of an unseen id)`` from a file in
    PC-Sampler's format (``{"num_token": N, "p_baseline_dict": {"id": count}}``). None: no prior,
    every token alike at ``1/e``, so that ``-ln f = 1`` and the score is the position-weighted confidence."""
    if path is None:
        return torch.zeros(0), math.exp(-1.0)
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"decoder.commit.frequencies={path}: no such file (a token-frequency table in PC-Sampler's format)"
        )
    data = json.loads(file.read_text())
    try:
        total, counts = float(data["num_token"]), {int(k): float(v) for k, v in data["p_baseline_dict"].items()}
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"decoder.commit.frequencies={path}: expected {{'num_token': N, 'p_baseline_dict': {{id: count}}}} ({error})"
        ) from error
    table = torch.full((max(counts, default=-1) + 1,), 1.0 / total)
    if counts:
        table[torch.tensor(list(counts))] = torch.tensor(list(counts.values())) / total
    return table, 1.0 / total


@attrs.define
class PositionCalibratedRule(LowConfidenceSchedule):
    """PC-Sampler (Huang et al., arXiv 2508.13021): LLaDA's schedule, ranking the current block's
    masked positions by ``exp(-decay * r) * min(-c * ln(f(token) + 1e-9), alpha)``, where ``r`` is
    the position within the block, ``decay`` the paper's lambda and ``f`` a token-frequency prior
    (``frequencies``: a file in PC-Sampler's format; unseen ids count as ``1 / total``; no file: no
    prior, the score is ``exp(-decay * r) * min(c, alpha)``): a tunable left-to-right drift that
    also defers frequent, trivial tokens."""

    decay: float = number(float, 0.0, default=0.25)
    alpha: float = number(float, 0.0, default=10.0)
    frequencies: str | None = attrs.field(default=None, validator=check_type(str, optional=True))
    prior: torch.Tensor = attrs.field(init=False, repr=False, factory=lambda: torch.zeros(0))
    unseen: float = attrs.field(init=False, default=1.0)

    def __attrs_post_init__(self) -> None:
        self.prior, self.unseen = load_token_frequencies(self.frequencies)

    def scores(self, canvas: Canvas, evaluation: Evaluation, layout: Layout) -> torch.Tensor:
        token = evaluation.token
        frequency = torch.full(token.shape, self.unseen)
        if len(self.prior):
            known = token < len(self.prior)
            frequency = torch.where(known, self.prior[token.clamp(max=len(self.prior) - 1)], frequency)
        calibrated = torch.clamp(-evaluation.confidence * torch.log(frequency + 1e-9), max=self.alpha)
        offset = (torch.arange(token.shape[1])[None, :] - canvas.block_start(layout)[:, None]).float()
        return torch.exp(-self.decay * offset) * calibrated
