"""The statistics of a sweep, from exact sums: Wilson intervals, the exact sign test, Pareto fronts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

Z95 = NormalDist().inv_cdf(0.975)  # 1.959963984540054


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % by default); (0, 1) for no trials."""
    if trials <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be within [0, {trials}], got {successes}")
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z / (1 + z2 / trials) * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    # at p = 0 or 1 the bound is exactly 0 or 1; rounding must not push it past
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test p-value for ``wins`` against ``losses`` (ties already dropped):
    ``min(1, 2 * P[X <= min(wins, losses)])`` for ``X ~ Binomial(wins + losses, 1/2)``; 1 with no
    discordant pairs. Integer sums, so it stays exact for large counts."""
    if wins < 0 or losses < 0:
        raise ValueError(f"counts must be non-negative, got {wins} and {losses}")
    n, k = wins + losses, min(wins, losses)
    if 2 * k >= n - 1:  # the smaller count is at the middle: the doubled tail reaches 1
        return 1.0
    term = tail = 1  # C(n, 0); C(n, i + 1) = C(n, i) (n - i) / (i + 1), exact in integers
    for i in range(k):
        term = term * (n - i) // (i + 1)
        tail += term
    return min(1.0, 2 * tail / 2**n)


def pareto_front(costs: Sequence[float], accuracies: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats (cost no higher and accuracy no lower, one of
    them strictly), ordered by cost. Of exact duplicates the first is kept."""
    order = sorted(range(len(costs)), key=lambda i: (costs[i], -accuracies[i], i))
    front: list[int] = []
    best = -math.inf
    for i in order:
        if accuracies[i] > best:
            front.append(i)
            best = accuracies[i]
    return front
