"""What a decoder's tree search may spend: its simulations per step and its budget in row-forwards."""

from __future__ import annotations

import attrs
import torch

from dlmsearch.validation import check_choice, number


@attrs.define
class TreeSettings:
    """``decoder.tree``: ``simulations`` per search (each expands one node: one row-forward, none for
    a leaf with nothing left to decide), ``budget`` the row-forwards per problem (the currency every
    decoder's summary reports) after which a sample stops searching and finishes with the base rule
    (None: no budget), ``prior`` of an action: the model's probability of the move (``confidence``),
    or ``uniform``; ``completion_steps``: the steps of a leaf's completion before its value is read
    (each one more row-forward per leaf; 0: the one-shot completion its own evaluation gives). On a
    block-diffusion model a completion also evaluates each later block (one row-forward each), and the
    budget reserves those too. ``every_step_above``: while a sample's unspent budget covers that many
    whole searches, it searches at every step, whatever the trigger says (None: only where it fires)."""

    simulations: int = number(int, 1, default=8)
    budget: int | None = number(int, 1, optional=True, default=None)
    prior: str = attrs.field(default="confidence", validator=check_choice("confidence", "uniform"))
    completion_steps: int = number(int, 0, default=0)
    every_step_above: float | None = number(float, 0.0, optional=True, default=None)

    def simulation_cost(self, blocks: torch.Tensor | int = 0) -> torch.Tensor | int:
        """The most row-forwards one simulation may spend: its leaf's evaluation, each completion step, and
        one per later block its completion must evaluate (``blocks``, from
        :func:`~dlmsearch.search.decode.tree_phases.completion_blocks`: 0 where a forward reads the whole canvas)."""
        return 1 + self.completion_steps + blocks

    def allowance(self, spent: torch.Tensor, simulated: torch.Tensor, blocks: torch.Tensor | int = 0) -> torch.Tensor:
        """``[S]`` simulations each tree may still run: the per-search count left, as many as the
        budget still covers at their most (``spent``: its sample's row-forwards so far; ``blocks``: the
        later blocks a leaf's completion evaluates, per tree)."""
        left = self.simulations - simulated
        if self.budget is not None:
            cost = self.simulation_cost(blocks)
            left = torch.minimum(left, torch.div(self.budget - spent, cost, rounding_mode="floor"))
        return left.clamp(min=0)

    def every_step(self, spent: torch.Tensor, blocks: torch.Tensor | int = 0) -> torch.Tensor:
        """``[S]`` samples that search at every step, whatever the trigger says: their unspent budget still
        covers ``every_step_above`` whole searches (``simulations`` simulations, each at its most). A large
        budget is spent from the first step on; a small one where the trigger fires (None: only there)."""
        if self.every_step_above is None:
            return torch.zeros_like(spent, dtype=torch.bool)
        if self.budget is None:
            return torch.ones_like(spent, dtype=torch.bool)
        return self.budget - spent >= self.every_step_above * self.simulations * self.simulation_cost(blocks)

    def searches(self, spent: torch.Tensor, blocks: torch.Tensor | int = 0) -> torch.Tensor:
        """``[S]`` samples whose budget leaves room for a search's first simulation."""
        return self.allowance(spent, torch.zeros_like(spent), blocks) > 0

    def priors(self, probability: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``[R, A]`` priors over the valid actions, summing to 1 (0 where no action is valid)."""
        weight = torch.where(valid, probability if self.prior == "confidence" else torch.ones_like(probability), 0.0)
        return weight / weight.sum(dim=1, keepdim=True).clamp(min=1e-30)
