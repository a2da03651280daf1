"""One rank's memory under tensor parallelism over ``N`` ranks (expert parallelism for the routed experts).

* **split by N**: attention q/k/v/o (by heads: q and o column/row-wise over query heads, k and v
  over key/value heads), dense MLPs, shared experts, DiffusionGemma's self-conditioning MLP;
* **routed experts**: each rank holds ``num_experts / N`` whole experts;
* **replicated**: token embeddings, the vocabulary head, every norm, the routers, a vision tower;
* **KV cache per rank**: ``layers x 2 x batch x cached positions x kv_heads/N x head_dim x
  dtype bytes`` (DiffusionGemma: per layer, its own heads and head_dim; a sliding layer caches at
  most ``sliding_window - 1`` positions, as transformers' ``DynamicSlidingWindowLayer`` keeps).

``N`` must divide the query heads and the routed experts. Key/value heads: ``N`` divides them, or
(fewer key/value heads than ranks) they divide ``N`` and each rank holds one whole key/value
head, ``N / kv_heads`` ranks sharing it, as vLLM does; the table says so under it. Anything else is an
:class:`~dlmsearch.estimate.architecture.EstimateError` naming the count ``N`` fails.
"""

from __future__ import annotations

import attrs

from dlmsearch.estimate.architecture import Architecture, EstimateError

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


@attrs.frozen
class RankMemory:
    """One rank's bytes at one parallel degree."""

    ranks: int
    weights: int
    replicated: int
    kv_cache: int
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache


def kv_heads_per_rank(kv_heads: int, ranks: int, where: str) -> int:
    """Key/value heads one rank holds: ``kv_heads / ranks``, or 1 (replicated) where ``ranks`` is a
    multiple of ``kv_heads``; else an :class:`EstimateError`."""
    if kv_heads % ranks == 0:
        return kv_heads // ranks
    if ranks % kv_heads == 0:
        return 1
    raise EstimateError(
        f"{where}: N={ranks} does not divide num_key_value_heads={kv_heads} (nor is it a multiple of it)"
    )


def rank_memory(
    arch: Architecture, ranks: int, dtype: str, batch: int, length: int, cache: str = "prefix"
) -> RankMemory:
    """One rank's weights, replicated weights and KV cache at ``ranks``-way parallelism.

    Args:
        arch: the model.
        ranks: N, the tensor (and expert) parallel degree.
        dtype: ``bfloat16`` or ``float32`` (weights and cache).
        batch: rows decoded together.
        length: tokens per row, prompt included.
        cache: ``prefix`` (keys and values of every position are kept) or ``none``.
    """
    if ranks < 1:
        raise EstimateError(f"{arch.name}: N={ranks}: the parallel degree must be at least 1")
    heads = {a.heads for a in arch.attention}
    for count in sorted(heads):
        if count % ranks:
            raise EstimateError(f"{arch.name}: N={ranks} does not divide num_attention_heads={count}")
    if arch.num_experts and arch.num_experts % ranks:
        raise EstimateError(f"{arch.name}: N={ranks} does not divide num_experts={arch.num_experts}")
    size = DTYPE_BYTES[dtype]
    split = arch.mlp / ranks + arch.experts / ranks
    kv_bytes, notes = 0, set()
    for a in arch.attention:
        held = kv_heads_per_rank(a.kv_heads, ranks, arch.name)
        if held * ranks > a.kv_heads:
            notes.add(
                f"N={ranks}: layers with {a.kv_heads} key/value heads hold one whole head per rank "
                f"({ranks // a.kv_heads} ranks share each; its k/v weights and cache are not split further)"
            )
        split += a.query_params() / ranks + a.kv_params(held)
        positions = length if a.window is None else min(length, a.window)
        kv_bytes += 2 * batch * positions * held * a.head_dim * size if cache == "prefix" else 0
    replicated = arch.replicated * size
    return RankMemory(ranks, round(split * size) + replicated, replicated, kv_bytes, tuple(sorted(notes)))
