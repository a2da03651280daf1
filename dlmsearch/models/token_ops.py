"""The per-token halves of a transformer block, and their compiled form with static-shape buckets.

Everything in a block except attention acts on each token alone: RMSNorm, the q/k/v projections
and the rotation before attention; the output projection, the residuals, the second norm and
the gated MLP after it. Written as plain functions of ``[tokens, ...]`` tensors and the layer's
weights, one function serves every layer, eager or compiled (``engine.compile=true``). Compiled,
the token count is padded up to one of four buckets per octave, so a decode compiles a handful of
graphs (one per bucket) instead of one per step, and the padding cannot change a real token's result:
no operation here mixes tokens. Attention stays eager (SDPA is already one fused kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}
SMALLEST_BUCKET = 16
RECOMPILE_LIMIT = 64  # one graph per bucket and dtype: far more than a decode meets


def identity(x: torch.Tensor) -> torch.Tensor:
    """A block's ``reduce`` without tensor parallelism: its partial sums are already whole."""
    return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm computed in float32, scaled in the input dtype (as both families do)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, in_float32: bool) -> torch.Tensor:
    """Rotary embedding: LLaDA rotates in float32 and casts back, Dream in the model dtype. Tables
    narrower than the head (partial rotary: LLaDA2) rotate its first dimensions and pass the rest."""
    width = cos.shape[-1]
    if width < x.shape[-1]:
        return torch.cat([rotate(x[..., :width], cos, sin, in_float32), x[..., width:]], dim=-1)
    if in_float32:
        return (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


def attention_inputs(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: torch.Tensor,
    eps: float,
    wq: torch.Tensor,
    bq: torch.Tensor | None,
    wk: torch.Tensor,
    bk: torch.Tensor | None,
    wv: torch.Tensor,
    bv: torch.Tensor | None,
    heads: int,
    kv_heads: int,
    in_float32: bool,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [tokens, hidden]`` and its rotary ``cos, sin [tokens, 1, head_dim]`` to rotated
    queries and keys and the values, ``[tokens, heads, head_dim]`` each. ``q_norm``/``k_norm``
    (Qwen3-style models: SDAR, LLaDA2): an RMSNorm of each head's query and key before rotation.

    Args:
        x: ``[tokens, hidden]`` the stream entering the block.
        cos: ``[tokens, 1, rotary_dim]`` the rotary cosines of each token's position.
        sin: ``[tokens, 1, rotary_dim]`` the rotary sines.
        norm: ``[hidden]`` the attention norm's weight.
        eps: the RMSNorm epsilon (also the query/key norms').
        wq: ``[heads * head_dim, hidden]`` the query projection.
        bq: ``[heads * head_dim]`` its bias, or None.
        wk: ``[kv_heads * head_dim, hidden]`` the key projection.
        bk: ``[kv_heads * head_dim]`` its bias, or None.
        wv: ``[kv_heads * head_dim, hidden]`` the value projection.
        bv: ``[kv_heads * head_dim]`` its bias, or None.
        heads: query heads.
        kv_heads: key/value heads (fewer than ``heads``: grouped-query attention).
        in_float32: rotate in float32 and cast back (LLaDA) rather than in the model dtype (Dream).
        q_norm: ``[head_dim]`` the per-head query norm's weight, or None.
        k_norm: ``[head_dim]`` the per-head key norm's weight (given with ``q_norm``).
    """
    tokens = x.shape[0]
    h = rms_norm(x, norm, eps)
    q = F.linear(h, wq, bq).view(tokens, heads, -1)
    k = F.linear(h, wk, bk).view(tokens, kv_heads, -1)
    v = F.linear(h, wv, bv).view(tokens, kv_heads, -1)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    return rotate(q, cos, sin, in_float32), rotate(k, cos, sin, in_float32), v


def block_output(
    x: torch.Tensor,
    attended: torch.Tensor,
    wo: torch.Tensor,
    norm: torch.Tensor,
    eps: float,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    activation: str,
    reduce: Callable[[torch.Tensor], torch.Tensor] = identity,
) -> torch.Tensor:
    """The block's output for ``x [tokens, hidden]`` given its attention ``[tokens, hidden]``.

    Its last six parameters are :func:`mlp`'s, repeated on purpose (the one pair ``duplicates``
    reports here): the per-token functions take plain tensors, the graph inputs torch.compile
    buckets by (``engine.compile``), not a record of them.

    Args:
        x: ``[tokens, hidden]`` the stream entering the block (the first residual).
        attended: ``[tokens, heads * head_dim]`` the attention's output, heads concatenated.
        wo: ``[hidden, heads * head_dim]`` the output projection.
        norm: ``[hidden]`` the MLP norm's weight.
        eps: the RMSNorm epsilon.
        gate: ``[intermediate, hidden]`` the MLP's gate projection.
        up: ``[intermediate, hidden]`` its up projection.
        down: ``[hidden, intermediate]`` its down projection.
        activation: the gate's activation, a key of ``ACTIVATIONS``.
        reduce: sums a projection's partial sums over the tensor-parallel ranks before each residual
            (:mod:`~dlmsearch.models.tensor_parallel`; :func:`identity` in one process).
    """
    x = x + reduce(F.linear(attended, wo))
    return x + reduce(mlp(x, norm, eps, gate, up, down, activation))


def mlp(
    x: torch.Tensor,
    norm: torch.Tensor,
    eps: float,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    activation: str,
) -> torch.Tensor:
    """The gated MLP's output (before its residual) for ``x [tokens, hidden]``, the stream after attention.

    Args:
        x: ``[tokens, hidden]`` (or ``[rows, n, hidden]``) the stream after attention.
        norm: ``[hidden]`` the MLP norm's weight.
        eps: the RMSNorm epsilon.
        gate: ``[intermediate, hidden]`` the gate projection.
        up: ``[intermediate, hidden]`` the up projection.
        down: ``[hidden, intermediate]`` the down projection.
        activation: the gate's activation, a key of ``ACTIVATIONS``.
    """
    h = rms_norm(x, norm, eps)
    return F.linear(ACTIVATIONS[activation](F.linear(h, gate)) * F.linear(h, up), down)


def routed_experts(
    h: torch.Tensor,
    router: torch.Tensor,
    expert_bias: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    groups: int,
    top_groups: int,
    scaling: float,
    activation: str,
    first_expert: int = 0,
) -> torch.Tensor:
    """The routed experts' output for ``h [tokens, hidden]`` (LLaDA2.x / Ling MoE, DeepSeek-V3's
    routing): sigmoid scores of ``router [E, hidden]`` in float32; the ``top_groups`` groups (of
    ``E / groups`` experts) with the largest sum of their two best biased scores; in them the
    ``top_k`` best biased scores pick the experts; the weights are their unbiased scores, normalised
    (``top_k > 1``) and times ``scaling``. Experts (``gate``, ``up`` ``[E, I, hidden]``, ``down``
    ``[E, hidden, I]``) run once each on the tokens routed to them (a loop over experts, none over
    tokens); each token's ``top_k`` outputs are weighted and summed in routing order. Ties: the lower
    expert (stable sorts), where the reference's ``topk`` order is unspecified.

    Args:
        h: ``[tokens, hidden]`` the normed stream after attention.
        router: ``[E, hidden]`` the router's weights.
        expert_bias: ``[E]`` the bias added to the scores for choosing (not for weighting).
        gate: ``[E, I, hidden]`` each expert's gate projection.
        up: ``[E, I, hidden]`` each expert's up projection.
        down: ``[E, hidden, I]`` each expert's down projection.
        top_k: experts per token.
        groups: expert groups (``E`` divisible by it).
        top_groups: groups a token's experts may come from.
        scaling: the factor on the routing weights (``routed_scaling_factor``).
        activation: the gate's activation, a key of ``ACTIVATIONS``.
        first_expert: the global index of ``gate[0]`` (expert parallelism: this rank holds experts
            ``first_expert .. first_expert + len(gate) - 1``; the others' outputs are zeros here and
            are added by the tensor-parallel all-reduce).
    """
    tokens = h.shape[0]
    experts = router.shape[0]
    held = range(first_expert, first_expert + gate.shape[0])
    scores = torch.sigmoid(F.linear(h.float(), router.float()))
    biased = scores + expert_bias.float()
    best_two = (
        torch.sort(biased.view(tokens, groups, -1), dim=-1, descending=True, stable=True).values[..., :2].sum(dim=-1)
    )
    chosen_groups = torch.sort(best_two, dim=-1, descending=True, stable=True).indices[:, :top_groups]
    allowed = torch.zeros(tokens, groups, dtype=torch.bool, device=h.device).scatter_(1, chosen_groups, True)
    allowed = allowed[:, :, None].expand(tokens, groups, experts // groups).reshape(tokens, experts)
    choice = torch.sort(biased.masked_fill(~allowed, -math.inf), dim=-1, descending=True, stable=True).indices[
        :, :top_k
    ]
    weight = scores.gather(1, choice)
    if top_k > 1:
        weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
    weight = weight * scaling
    flat = choice.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=experts).tolist()
    out = (h.new_empty if len(held) == experts else h.new_zeros)(tokens * top_k, h.shape[1])
    act = ACTIVATIONS[activation]
    start = 0
    for expert, count in enumerate(counts):
        if count and expert in held:
            rows = order[start : start + count]
            x = h[rows // top_k]
            local = expert - first_expert
            out[rows] = F.linear(act(F.linear(x, gate[local])) * F.linear(x, up[local]), down[local])
        start += count
    return (out.view(tokens, top_k, -1).to(weight.dtype) * weight[..., None]).sum(dim=1).to(h.dtype)


def moe_block_output(
    x: torch.Tensor,
    attended: torch.Tensor,
    wo: torch.Tensor,
    norm: torch.Tensor,
    eps: float,
    shared_gate: torch.Tensor,
    shared_up: torch.Tensor,
    shared_down: torch.Tensor,
    activation: str,
    routed: dict,
    reduce: Callable[[torch.Tensor], torch.Tensor] = identity,
) -> torch.Tensor:
    """:func:`block_output` of a mixture-of-experts block: the shared experts (a gated MLP, possibly
    of width 0) plus the routed experts (:func:`routed_experts` with ``routed``'s weights and settings).

    Args:
        x: ``[tokens, hidden]`` the stream entering the block (the first residual).
        attended: ``[tokens, heads * head_dim]`` the attention's output, heads concatenated.
        wo: ``[hidden, heads * head_dim]`` the output projection.
        norm: ``[hidden]`` the MLP norm's weight.
        eps: the RMSNorm epsilon.
        shared_gate: ``[shared * I, hidden]`` the shared experts' gate projection.
        shared_up: ``[shared * I, hidden]`` their up projection.
        shared_down: ``[hidden, shared * I]`` their down projection.
        activation: the gate's activation, a key of ``ACTIVATIONS`` (shared and routed experts alike).
        routed: :func:`routed_experts`' other arguments (``router``, ``expert_bias``, ``gate``, ``up``,
            ``down``, ``top_k``, ``groups``, ``top_groups``, ``scaling``, ``first_expert``).
        reduce: sums the partial sums over the tensor-parallel ranks (:func:`block_output`'s); under
            tensor parallelism the routed part is this rank's experts' only, summed with the shared part.
    """
    x = x + reduce(F.linear(attended, wo))
    h = rms_norm(x, norm, eps)
    shared = F.linear(ACTIVATIONS[activation](F.linear(h, shared_gate)) * F.linear(h, shared_up), shared_down)
    return x + reduce(routed_experts(h, activation=activation, **routed) + shared)  # the reference's order of additions


def attend(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, grouped: bool
) -> torch.Tensor:
    """Scaled dot-product attention; on CPU its reductions run in float64 and round back.

    Why: the sums over keys (softmax and the value mix) are reassociated by how many keys a call
    holds and where they sit, so a row's float32 output moved by ~1e-7 with the left padding of a
    batch or the number of lookahead lanes of a cached call; a near-tie between confidences or
    branch scores then decided differently batched and alone. Summed in float64, those orders
    differ below float32's rounding, so a row's values do not depend on what it is batched with
    (measured: 0 of 31-43 evaluations differ, against 13-19 in float32, tests/test_text_batching.py).
    On CUDA the fused float32/bfloat16 kernels run as they are, and so does training (gradients
    on): batch invariance is a property of decoding, and float64 would slow the backward pass.
    """
    if queries.device.type != "cpu" or queries.dtype == torch.float64 or torch.is_grad_enabled():
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, enable_gqa=grouped)
    wide = F.scaled_dot_product_attention(
        queries.double(), keys.double(), values.double(), attn_mask=mask, enable_gqa=grouped
    )
    return wide.to(queries.dtype)


def bucket(tokens: int) -> int:
    """The static token count a compiled call runs at: four buckets per octave (the next multiple
    of a quarter of the power of two at or below ``tokens``; at least 16), so at most a quarter
    more tokens than asked (powers of two padded 576 tokens to 1024 and cost 1.6x at the 1b shape
    on CPU)."""
    step = max(SMALLEST_BUCKET, (1 << (max(tokens, 1).bit_length() - 1)) // 4)
    return max(SMALLEST_BUCKET, -(-tokens // step) * step)


class Bucketed:
    """``function`` compiled with static shapes; its first ``per_token`` arguments are padded
    with zeros to the bucket of their token count and its outputs cut back."""

    def __init__(self, function: Callable, per_token: int) -> None:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self.compiled = torch.compile(function, dynamic=False)
        self.per_token = per_token
        self.buckets: set[int] = set()  # the token counts compiled so far (what a test can check)
        self.token_counts: set[int] = set()  # the token counts asked for

    def __call__(self, *args):
        tokens = args[0].shape[0]
        size = bucket(tokens)
        self.buckets.add(size)
        self.token_counts.add(tokens)
        padded = [
            a if size == tokens else F.pad(a, (0, 0) * (a.dim() - 1) + (0, size - tokens))
            for a in args[: self.per_token]
        ]
        out = self.compiled(*padded, *args[self.per_token :])
        return tuple(o[:tokens] for o in out) if isinstance(out, tuple) else out[:tokens]
