"""Every attention mask and position layout the models run with, built in one place.

A canvas row is left-padded: ``real [rows, width]`` marks its tokens, and a column's position
counts real tokens only, so padding never shifts a row (:func:`positions`). From that:

* :func:`padding_mask` — full bidirectional attention over the real tokens (LLaDA, Dream);
* :func:`window_visibility` — a row that forwards only its columns ``first:high`` against its
  slot's stored keys and values: which stored columns it reads (never its own forwarded ones)
  and which of its own queries each query sees;
* :func:`shadow_layout` / :func:`shadow_window_visibility` — WINO's shadow block: mask tokens
  appended at the positions of the block's columns, each seeing everything but its mirror
  column, uncached or against a prefix cache;
* :func:`block_causal` / :func:`block_window_visibility` — block diffusion (SDAR, LLaDA2.x):
  bidirectional inside a block, causal across blocks, blocks counted from each row's first real
  token; uncached, or against a slot's exact block cache.

Masks are ``True`` where a query may attend to a key. Nothing here knows a model or a search.
"""

from __future__ import annotations

import torch


def positions(real: torch.Tensor) -> torch.Tensor:
    """``[rows, width]`` each column's position counted over real tokens only (left padding does not shift a row)."""
    return (real.long().cumsum(dim=1) - 1).clamp(min=0)


def padding_mask(real: torch.Tensor) -> torch.Tensor:
    """``[rows, 1, 1, width]`` full bidirectional attention: every query sees every real key."""
    return real.bool()[:, None, None, :]


def window_visibility(
    real: torch.Tensor, first: torch.Tensor, high: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A cached forward of each row's columns ``first[r]:high[r]`` (``length`` query slots,
    padded past a row's end): ``[rows, width]`` the stored columns each row reads (its real
    columns outside its window) and ``[rows, length, length]`` which of its own queries each sees
    (the real ones)."""
    canvas = torch.arange(real.shape[1])[None, :]
    stored = real.bool() & ((canvas < first[:, None]) | (canvas >= high[:, None]))
    valid = first[:, None] + torch.arange(length)[None, :] < high[:, None]
    return stored, valid[:, None, :].expand(-1, length, -1)


def shadow_layout(real: torch.Tensor, mirror: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """WINO's canvas plus a shadow of ``B`` mask tokens at the positions of columns ``mirror [rows, B]``,
    uncached: ``[rows, width + B, width + B]`` attention (canvas queries see the canvas only;
    shadow query ``j`` sees every shadow slot and the canvas except its own mirror column) and
    ``[rows, width + B]`` positions."""
    rows, width = real.shape
    block = mirror.shape[1]
    real = real.bool()
    canvas = torch.arange(width)
    attention = torch.zeros(rows, width + block, width + block, dtype=torch.bool)
    attention[:, :width, :width] = real[:, None, :]
    attention[:, width:, :width] = real[:, None, :] & (canvas[None, None, :] != mirror[:, :, None])
    attention[:, width:, width:] = True
    at = positions(real)
    return attention, torch.cat([at, at.gather(1, mirror)], dim=1)


def shadow_window_visibility(
    real: torch.Tensor, low: torch.Tensor, mirror: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """WINO's shadow against a prefix cache: each row forwards its columns ``low[r]:`` (``length``
    query slots) and the shadow. ``[rows, width]`` stored columns read (those before the window)
    and ``[rows, length + B, length + B]`` visibility among the fresh queries (a shadow query
    never sees its mirror column)."""
    rows, width = real.shape
    block = mirror.shape[1]
    column = low[:, None] + torch.arange(length)[None, :]
    valid = column < width
    queries = length + block
    fresh = torch.zeros(rows, queries, queries, dtype=torch.bool)
    fresh[:, :length, :length] = valid[:, None, :]
    fresh[:, length:, :length] = valid[:, None, :] & (column[:, None, :] != mirror[:, :, None])
    fresh[:, length:, length:] = True
    stored = real.bool() & (torch.arange(width)[None, :] < low[:, None])
    return stored, fresh


def block_causal(real: torch.Tensor, block_length: int) -> torch.Tensor:
    """``[rows, width, width]`` block diffusion's attention (SDAR, LLaDA2.x): query column ``q``
    sees real key ``k`` when ``block(k) <= block(q)``, a column's block being its position (counted
    from the row's first real token, :func:`positions`) over ``block_length``: bidirectional inside
    a block, causal across blocks, the prompt's first tokens its own leading blocks."""
    block = positions(real) // block_length
    return real.bool()[:, None, :] & (block[:, None, :] <= block[:, :, None])


def block_window_visibility(
    real: torch.Tensor, first: torch.Tensor, high: torch.Tensor, length: int, block_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A block-diffusion row forwarding its columns ``first[r]:high[r]`` against its slot's exact
    block cache: ``[rows, width]`` the stored columns it reads (the real ones before ``first``:
    every later column is a later block or its own) and ``[rows, length, length]`` which of its own
    queries each sees (block-causally, the real ones)."""
    column = first[:, None] + torch.arange(length)[None, :]
    inside = column.clamp(max=real.shape[1] - 1)
    valid = (column < high[:, None]) & real.bool().gather(1, inside)
    block = positions(real).gather(1, inside) // block_length
    stored = real.bool() & (torch.arange(real.shape[1])[None, :] < first[:, None])
    return stored, valid[:, None, :] & (block[:, None, :] <= block[:, :, None])
