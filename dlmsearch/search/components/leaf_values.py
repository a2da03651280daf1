"""Leaf values: how good a tree search's leaf is, judged from its one evaluation.

They are :class:`~dlmsearch.search.components.scorers.Scorer` s (``score`` is what a lookahead
reads: the likelihood, a lookahead has no verifier) with what a tree search asks beside it:
``value`` of a :class:`Leaf`. A leaf is completed at no cost in forwards: every position still
masked takes the token its evaluation proposes (the one-shot completion the leaf's forward
already gives; a block-diffusion model's forward reads one block, so there each later block costs
one forward more), and the value reads that completion:

* :class:`LikelihoodValue` — the model's own likelihood, with no verifier: the geometric mean
  probability of the completed generation (committed tokens at the probability they were
  committed with, the completion's at the leaf's), in ``[0, 1]``. McDiffuSE's reward, the model's
  confidence, read over the whole completion.
* :class:`VerifiedValue` — the task's verifier on the completion: 1 accepted, 0 not.
* :class:`MixedValue` — ``weight * verified + (1 - weight) * likelihood``.
* :class:`GradedValue` — the verifier's count of broken rules, ``exp(-violations / scale)``: 1 for
  an accepted completion, closer to 1 the fewer rules it breaks (a Sudoku grid's repeated digits),
  so that leaves rank before any completion is right.

A value that reads the verifier also ends a leaf whose partial canvas already breaks the task's
rules (a Sudoku conflict): a terminal loss, value 0, never expanded.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from dlmsearch.search.records.state import Canvas, Evaluation, Layout
from dlmsearch.validation import number


@attrs.frozen
class Leaf:
    """The leaves of one wave: their canvases, evaluations, completions and the verifier's verdicts."""

    canvas: Canvas  # [R] the leaves' canvases
    evaluation: Evaluation  # [R] their evaluations (a complete leaf's is empty: it takes no forward)
    layout: Layout
    completed: torch.Tensor  # [R, T] the canvas with every masked position at the evaluation's token
    accepted: torch.Tensor | None  # [R] the verifier accepts the completion (None: no verifier asked)
    violations: torch.Tensor | None = None  # [R] the task's rules the completion breaks (None: no verifier asked)

    def likelihood(self) -> torch.Tensor:
        """``[R]`` the geometric mean probability of the completed generation's decided tokens."""
        generated = torch.zeros_like(self.canvas.masked)
        generated[:, self.layout.gen_start :] = True
        committed = generated & ~self.canvas.masked & (self.canvas.commit_call >= 0)
        filled = generated & self.canvas.masked
        probability = torch.where(
            committed, self.canvas.commit_confidence, torch.where(filled, self.evaluation.confidence, 1.0)
        )
        counted = committed | filled
        logs = torch.where(counted, torch.log(probability.clamp(min=1e-30)), 0.0).sum(dim=1)
        return torch.exp(logs / counted.sum(dim=1).clamp(min=1))


class _ScoresLikelihood:
    """A lookahead's score of a leaf value: the likelihood of the one-shot completion (no verifier there)."""

    def score(
        self, canvas: Canvas, evaluation: Evaluation, layout: Layout, committed_log_confidence: torch.Tensor
    ) -> torch.Tensor:
        completed = torch.where(canvas.masked, evaluation.token, canvas.tokens)
        return Leaf(canvas, evaluation, layout, completed, None).likelihood()


@attrs.define
class LikelihoodValue(_ScoresLikelihood):
    """The model's likelihood of the leaf's completion (module doc); no verifier."""

    needs_verifier: ClassVar[bool] = False

    def value(self, leaf: Leaf) -> torch.Tensor:
        return leaf.likelihood()


@attrs.define
class VerifiedValue(_ScoresLikelihood):
    """The task's verdict on the leaf's completion: 1 accepted, 0 not (module doc)."""

    needs_verifier: ClassVar[bool] = True

    def value(self, leaf: Leaf) -> torch.Tensor:
        assert leaf.accepted is not None
        return leaf.accepted.float()


@attrs.define
class MixedValue(_ScoresLikelihood):
    """``weight`` on the verdict, the rest on the likelihood (module doc)."""

    weight: float = number(float, 0.0, 1.0, default=0.5)
    needs_verifier: ClassVar[bool] = True

    def value(self, leaf: Leaf) -> torch.Tensor:
        assert leaf.accepted is not None
        return self.weight * leaf.accepted.float() + (1 - self.weight) * leaf.likelihood()


@attrs.define
class GradedValue(_ScoresLikelihood):
    """``exp(-violations / scale)`` of the leaf's completion (module doc)."""

    scale: float = number(float, 0.0, default=2.0, open_low=True)
    needs_verifier: ClassVar[bool] = True

    def value(self, leaf: Leaf) -> torch.Tensor:
        assert leaf.violations is not None
        return torch.exp(-leaf.violations / self.scale)
