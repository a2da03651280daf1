"""Counter-based randomness: every draw is a hash of its keys, never of what else is in the batch.

A draw's keys name the seed, the sample, the model call, the row, the position and, for draws
other than the engine's base uniform, one of the named :class:`Stream` s, so that two uses of
randomness at the same place never share numbers. This is what makes sampling, random orders
and a population's diversity independent of batch composition.
"""

from __future__ import annotations

from enum import IntEnum

import torch


class Stream(IntEnum):
    """The named streams (the last key of a draw); the engine's base uniform has none."""

    TOKEN_SAMPLE = 1  # the engine's token sampling at temperature > 0
    ORDER_NOISE = 2  # a population's Gumbel noise on the commit order
    RESAMPLING = 3  # a population's systematic resampling offset
    RENOISE = 4  # a uniform-noise model's random ids: a canvas's initialisation and every re-noising
    TREE_GUMBEL = 5  # a tree search's Gumbel noise on its root actions (sequential halving)


BRANCH_KEYS = (
    1 << 16
)  # a row's key: particle * BRANCH_KEYS + (0 for the particle's own canvas, 1 + branch for a lookahead branch)


def is_root(row_key: torch.Tensor) -> torch.Tensor:
    """Rows that are their slot's own canvas (a particle's root), not a lookahead branch or a re-check."""
    return row_key % BRANCH_KEYS == 0


_MASK64 = (1 << 64) - 1


def _to_signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _to_signed(0x9E3779B97F4A7C15)
_MIX1 = _to_signed(0xBF58476D1CE4E5B9)
_MIX2 = _to_signed(0x94D049BB133111EB)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch shifts signed values arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def hashed_uniform(keys: list[torch.Tensor]) -> torch.Tensor:
    """Uniform [0, 1) numbers from a splitmix64 hash of integer keys (broadcast together).

    Counter-based randomness: a draw depends only on its keys (seed, sample, call, row,
    position), never on what else is in the batch, so sampling is batch-invariant.
    """
    x = torch.zeros((), dtype=torch.long)
    for key in keys:
        x = x * _GOLDEN + key.long() + 0x632BE5AB
        x = x + _GOLDEN
        x = (x ^ _shift_right(x, 30)) * _MIX1
        x = (x ^ _shift_right(x, 27)) * _MIX2
        x = x ^ _shift_right(x, 31)
    return _shift_right(x, 11).double().mul_(2.0**-53).float()
