"""From a forward's logits to the per-position summaries every component reads.

Sampling is a chain of logits processors applied per row inside the engine's call (the
vocabulary-sized tensors never leave it), in Dream's order: temperature, then top-p (nucleus),
then top-k. Where the confidence is read is a switch, because the two families differ:

* ``confidence: model`` (LLaDA's ``generate()``): the proposal is drawn from the processed
  distribution (Gumbel-max over ``logits / T`` in LLaDA), but its confidence, margin and entropy
  are those of the model's own distribution, ``softmax(logits)`` at temperature 1;
* ``confidence: sampling`` (Dream's ``sample_tokens``): confidence, margin and entropy are read
  from the tempered, truncated distribution the token was drawn from (at temperature 0 with
  top-k 50: over the 50 most likely tokens, renormalised).

Draws are counter-based (``randomness``): a proposal at temperature > 0 is the inverse CDF of
the processed distribution at the position's seeded uniform, so it does not depend on the batch.
"""

from __future__ import annotations

import math

import torch

from dlmsearch.search.engine.statistics import Statistic
from dlmsearch.search.records.row_sampling import RowSampling


def top_p_filter(logits: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """Nucleus truncation: keep the most likely tokens until their mass first exceeds ``top_p``
    (the token that crosses it is kept, and always the most likely one); the rest get -inf.
    ``top_p [R]`` per row of ``logits [R, T, V]``: a row at 1 or more keeps every token."""
    ordered, order = torch.sort(logits, dim=-1, descending=True)
    mass = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
    before = torch.cat([torch.zeros_like(mass[..., :1]), mass[..., :-1]], dim=-1)  # mass of the tokens ranked above
    if isinstance(top_p, torch.Tensor):
        limit = top_p.to(mass.device, mass.dtype)
        top_p = torch.where(limit < 1.0, limit, math.inf).view(-1, *(1,) * (logits.dim() - 1))
    drop_sorted = before > top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def top_k_filter(logits: torch.Tensor, top_k: int | torch.Tensor) -> torch.Tensor:
    """Keep the tokens whose logit is at least the ``top_k``-th largest (ties at it are kept); the
    rest get -inf. ``top_k [R]`` per row of ``logits [R, T, V]``: a row at 0 keeps every token."""
    if not isinstance(top_k, torch.Tensor):
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        return logits.masked_fill(logits < kth, -math.inf)
    k = top_k.to(logits.device).clamp(max=logits.shape[-1])
    largest = torch.topk(logits, max(int(k.max()), 1), dim=-1).values
    shape = (-1, *(1,) * (logits.dim() - 1))
    kth = largest.gather(-1, (k - 1).clamp(min=0).view(shape).expand(*largest.shape[:-1], 1))
    kth = torch.where((k > 0).view(shape), kth, -math.inf)
    return logits.masked_fill(logits < kth, -math.inf)


def process(logits: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """``logits [R, T, V]`` after the processors, each row with its own settings: divided by its
    temperature where it is positive, then top-p, then top-k (Dream's order)."""
    if rows.hot:
        scale = torch.where(rows.temperature > 0, rows.temperature, 1.0).to(logits.device, logits.dtype)
        logits = logits / scale[:, None, None]
    if bool((rows.top_p < 1.0).any()):
        logits = top_p_filter(logits, rows.top_p)
    if bool((rows.top_k > 0).any()):
        logits = top_k_filter(logits, rows.top_k)
    return logits


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token at each position whose cumulative probability first exceeds ``uniform`` (a draw
    from ``probs [..., V]`` with one uniform per position)."""
    cumulative = probs.cumsum(dim=-1)
    target = uniform.to(cumulative.device, cumulative.dtype)[..., None] * cumulative[..., -1:]
    return torch.searchsorted(cumulative, target).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def _processed(logits: torch.Tensor, model_probs: torch.Tensor, rows: RowSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """The processed logits and their distribution: each row's own where its settings change it
    (temperature, top-p, top-k), the model's where they do not. Only the rows that change are
    processed: a greedy request pays nothing for the sampled one it shares a forward with."""
    changes = rows.changes
    if not bool(changes.any()):
        return logits, model_probs
    if bool(changes.all()):
        processed = process(logits, rows)
        return processed, torch.softmax(processed, dim=-1)
    at = changes.nonzero().squeeze(1)
    mine = process(logits[at.to(logits.device)], rows.take(at))
    on = at.to(logits.device)
    return logits.index_copy(0, on, mine), model_probs.index_copy(0, on, torch.softmax(mine, dim=-1))


def summarise_logits(
    logits: torch.Tensor,
    confidence: str,
    rows: RowSampling,
    draw: torch.Tensor | None,
    statistics: list[Statistic],
    of_logits: list[Statistic] = (),
    keep_processed: bool = False,
) -> dict[str, torch.Tensor]:
    """Proposal (``token``), ``confidence`` and the requested statistics (``margin``: top-1
    minus top-2 probability; ``entropy``, Dream's definition) per position, from ``logits
    [R, T, V]`` (impossible tokens already at -inf). Each row's settings (``rows``) and ``draw
    [R, T]`` (the positions' uniforms) decide the samples; ``nan`` flags positions whose logits
    were NaN.

    Args:
        logits: ``[R, T, V]`` the forward's logits.
        confidence: where the confidence is read (``model`` or ``sampling``, see above).
        rows: each row's temperature, top-p and top-k.
        draw: ``[R, T]`` the positions' uniforms for the token samples (None: no row samples).
        statistics: statistics of the distribution the confidence is read from.
        of_logits: statistics of the processed logits.
        keep_processed: the processed logits come back too, as ``processed``, where the cache
            policy keeps them (``CachePolicy.keeps_processed``: a decoder's self-conditioning input; not a summary).
    """
    model_probs = torch.softmax(logits, dim=-1)
    processed_logits, probs = _processed(logits, model_probs, rows)
    best, token = probs.max(dim=-1)
    if rows.hot:  # only the rows that sample draw (a greedy row beside them costs nothing more)
        at = (rows.temperature > 0).nonzero().squeeze(1).to(logits.device)
        token = token.index_copy(0, at, inverse_cdf(probs[at], draw[at]))
    read = probs if confidence == "sampling" else model_probs
    confidence_of = best if (read is probs and not rows.hot) else read.gather(-1, token[..., None]).squeeze(-1)
    out = {
        "token": token,
        "confidence": confidence_of,
        "nan": torch.isnan(model_probs[..., 0]).float(),
    }  # NaN logits make the whole softmax NaN
    for statistic in statistics:  # the distribution's own statistics (margin, entropy: :mod:`statistics`)
        out[statistic.name] = statistic.compute(read)
    for statistic in of_logits:
        out[statistic.name] = statistic.compute(processed_logits)
    if keep_processed:
        out["processed"] = processed_logits
    return out
