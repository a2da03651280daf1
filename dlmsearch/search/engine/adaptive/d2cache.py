"""d2Cache (Jiang et al., arXiv 2509.23094; code Kamichanw/d2Cache ``72feb60``): ``cache=d2cache``.

Only keys and values are kept; after a slot's first forward (every column) only the selected
columns go through the layers, at every layer, against every stored key. The selection for the
next forward, from this one:

1. masked columns: with ``M`` the masked generation columns and ``k = current_k``, the smallest
   end ``e`` with ``|M ∩ [0, e]| >= k`` (the last column if none), rounded up to its block's end;
   the candidates ``M ∩ [b_s, e]`` are scored ``c_i * rho_i`` (``c``: the confidence cache,
   ``rho``: the certainty density, :func:`certainty_density`), the window's
   get ``+ max score``, and the top ``k`` are taken (ties: the lower column). A shifted model
   (Dream) forwards each one's left neighbour instead (its query yields the column's logits);
2. every column committed since the last forward (its input changed from the mask);
3. the attention rollout's nucleus: with ``A_l`` the head-mean attention (rows of columns not
   forwarded: identity rows), ``R <- rownorm(A_l + I) R`` over the layers from ``R = I``, and
   ``g_j = sum_i R_ij``; of the columns not yet selected (prompt included), the longest
   descending prefix of ``g``'s normalised shares with cumulative share ``<= rollout_p`` (at
   least one);
4. ``inflate > 0``: gaps of at most ``inflate`` columns between selected ones are filled.

Logits of columns not forwarded are not read (they read as the mask with confidence 0).

Departures, each to make a row's selection its own: the in-window bonus is the row's own maximum
(the reference takes the batch's), and no row is topped up to its batch's largest selection (the
reference pads with more columns, so a row's forward set depends on its batch-mates). The
confidence cache: ``confidence=step0`` (default, what the reference computes: it is never updated
after the first forward, ``d2cache.py:202`` writes into a copy) or ``last_queried`` (what the paper
states: a masked column's last confidence computed while it was forwarded).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from dlmsearch.models.layer_store import Fields, LayerStore
from dlmsearch.models.layerwise import LayerPass, cells
from dlmsearch.search.engine.adaptive.layer_rules import LayerCall, LayerwisePolicy, RecomputeRule, committed_since
from dlmsearch.validation import check_choice, number


def certainty_density(decoded: torch.Tensor, sigma: float) -> torch.Tensor:
    """``[rows, n]`` the Gaussian-weighted (``sigma``) sum of the decoded indicator around each column,
    extended by ``n`` decoded columns on the left and ``n`` copies of its last column on the right,
    over the kernel's sum on offsets ``[-3n, 3n)`` (d2Cache's ``certainty_density``, which convolves
    by FFT over a period of ``6n``: its normaliser is that constant, not each column's own extent)."""
    rows, n = decoded.shape
    device = decoded.device
    extended = torch.cat(
        [
            torch.ones(rows, n, dtype=torch.float64, device=device),
            decoded.double(),
            decoded[:, -1:].double().expand(rows, n),
        ],
        dim=1,
    )
    gaussian = lambda d: torch.exp(-(d**2) / (2 * sigma**2))
    offset = (
        torch.arange(n, device=device, dtype=torch.float64)[:, None]
        + n
        - torch.arange(3 * n, device=device, dtype=torch.float64)[None, :]
    )
    normaliser = gaussian(torch.arange(-3 * n, 3 * n, device=device, dtype=torch.float64)).sum().clamp_min(1e-8)
    return (extended @ gaussian(offset).T) / normaliser


def nucleus(scores: torch.Tensor, top_p: float, allowed: torch.Tensor) -> torch.Tensor:
    """``[rows, columns]`` the allowed columns whose normalised scores, in descending order (ties:
    the lower column), keep the cumulative share ``<= top_p``, and at least the first."""
    scores = torch.where(allowed, scores, 0.0)
    share = scores / (scores.sum(dim=1, keepdim=True) + 1e-9)
    ordered, order = torch.sort(share, dim=1, descending=True, stable=True)
    keep = (torch.cumsum(ordered, dim=1) <= top_p) | (torch.arange(share.shape[1], device=share.device) < 1)[None, :]
    keep &= allowed.gather(1, order)
    return torch.zeros_like(allowed).scatter_(1, order, keep)


def inflate(chosen: torch.Tensor, width: int) -> torch.Tensor:
    """``chosen`` with every gap of at most ``width`` columns between two chosen columns filled."""
    columns = chosen.shape[1]
    at = torch.arange(columns, device=chosen.device).expand_as(chosen)
    following = torch.flip(torch.cummin(torch.flip(torch.where(chosen, at, columns), dims=[1]), dim=1).values, dims=[1])
    preceding = torch.cummax(torch.where(chosen, at, -1), dim=1).values
    return chosen | (((following - at) + (at - preceding) <= width) & (preceding >= 0) & (following < columns))


@attrs.define(eq=False)
class _Rule(RecomputeRule):
    policy: D2Cache = attrs.field(kw_only=True)
    needs_weights: ClassVar[bool] = True
    first: torch.Tensor = attrs.field(init=False)  # [rows] the slot's first forward: every column
    chosen: torch.Tensor = attrs.field(init=False)
    rollout: torch.Tensor | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        call, fields = self.call, self.fields
        self.first = fields["stepped"] == 0
        self.chosen = torch.where(self.first[:, None], call.real, self._selection() & call.real)

    def _selection(self) -> torch.Tensor:
        """The columns this forward computes, from the slot's last forward (see the module's docstring)."""
        call, policy, fields = self.call, self.policy, self.fields
        g = call.gen_start
        remaining = call.masked[:, g:]
        n = remaining.shape[1]
        block = int((call.end - call.start).max())
        meets = torch.cumsum(remaining.long(), dim=1) >= policy.current_k
        least_end = torch.where(meets.any(dim=1), meets.long().argmax(dim=1), n - 1)
        search_end = (least_end // block + 1) * block - 1
        column = torch.arange(n, device=remaining.device)[None, :]
        candidates = remaining & (column >= (call.start - g)[:, None]) & (column <= search_end[:, None])
        scores = fields["confidence"][:, g:] * certainty_density(~remaining, policy.sigma)
        in_window = call.window[:, g:]
        scores = scores + torch.where(in_window, scores.max(dim=1, keepdim=True).values, 0.0)
        order = torch.sort(torch.where(candidates, scores, -torch.inf), dim=1, descending=True, stable=True).indices[
            :, : min(policy.current_k, n)
        ]
        picked = torch.zeros_like(remaining).scatter_(1, order, True) & candidates
        masked = torch.cat([torch.zeros_like(call.masked[:, :g]), picked], dim=1)
        chosen = call.queries_of(masked) | committed_since(fields, call)
        chosen |= nucleus(fields["importance"], policy.rollout_p, call.real & ~chosen)
        return inflate(chosen, policy.inflate) if policy.inflate > 0 else chosen

    def select(self, layer: int, probed: torch.Tensor | None) -> torch.Tensor:
        return self.chosen

    def layer_output(self, computed: LayerPass) -> torch.Tensor:
        """The default stream, and the attention rollout extended by this layer's mean attention
        (d2Cache's importance, read in ``finish``).
        """
        x, index, valid, weights = computed.x, computed.index, computed.valid, computed.weights
        out = super().layer_output(computed)
        assert weights is not None
        rows, width = self.call.real.shape
        eye = torch.eye(width, dtype=torch.float64, device=x.device).expand(rows, width, width)
        effective = eye.clone()
        effective[cells(index, valid)] = weights.double().mean(dim=1)[valid]
        residual = effective + eye
        residual = residual / residual.sum(dim=-1, keepdim=True)
        self.rollout = residual if self.rollout is None else residual @ self.rollout
        self.extra_bytes = self.rollout.numel() * self.rollout.element_size()
        return out

    def final(self, x: torch.Tensor, logits_of) -> None:
        """Confidences (top-1 probability) of the forwarded generation columns, for the confidence cache."""
        call = self.call
        taking = self.first if self.policy.confidence == "step0" else torch.ones_like(self.first)
        if not bool(taking.any()):  # the step-0 cache is already filled: no head to run
            return
        row, column = (self.last & taking[:, None]).nonzero(as_tuple=True)
        probability = torch.softmax(logits_of(x[row, column][None])[0].double(), dim=-1).max(dim=-1).values
        predicted = column + 1 if call.shift else column  # a shifted model's query c yields column c + 1's logits
        keep = (predicted < call.width) & (predicted >= call.gen_start)
        confidence = torch.zeros(call.rows, call.width, dtype=torch.float64, device=x.device)
        computed = torch.zeros_like(call.real)
        confidence[row[keep], predicted[keep]] = probability[keep]
        computed[row[keep], predicted[keep]] = True
        stored = self.fields["confidence"]
        if self.policy.confidence == "step0":
            update = computed & self.first[:, None]
        else:
            update = computed & call.masked
        self.fields["confidence"] = torch.where(update, confidence, stored)

    def finish(self, logits: torch.Tensor, read: torch.Tensor) -> None:
        assert self.rollout is not None
        self.fields["importance"] = self.rollout.sum(dim=1)
        self.fields["seen"] = self.call.tokens.clone()
        self.fields["stepped"] = self.fields["stepped"] + 1


@attrs.frozen
class D2Cache(LayerwisePolicy):
    """d2Cache: certainty-density selection of masked columns, the just committed ones and the
    attention rollout's nucleus forwarded; no periodic refresh."""

    name: ClassVar[str] = "d2cache"
    # configs/gen_args.py and configs/cache/d2cache.yaml: the same for LLaDA-Instruct and Dream-Instruct on GSM8K
    family_defaults: ClassVar[dict[str, dict[str, object]]] = {
        "llada": {"current_k": 32, "sigma": 10.0, "rollout_p": 0.1, "inflate": 0},
        "dream": {"current_k": 32, "sigma": 10.0, "rollout_p": 0.1, "inflate": 0},
    }
    current_k: int = number(int, 1, default=32)
    sigma: float = number(float, 0.0, open_low=True, default=10.0)
    rollout_p: float = number(float, 0.0, 1.0, default=0.1)
    inflate: int = number(int, 0, default=0)
    confidence: str = attrs.field(default="step0", validator=check_choice("step0", "last_queried"))

    def prepare(self, store: LayerStore, call: LayerCall, dtype: torch.dtype, device: torch.device | str) -> None:
        super().prepare(store, call, dtype, device)
        store.ensure("confidence", (call.width,), torch.float64, device, column_axis=1)
        store.ensure("importance", (call.width,), torch.float64, device, column_axis=1)
        store.ensure("seen", (call.width,), torch.long, device, column_axis=1)
        store.ensure("stepped", (), torch.long, device)

    def rule(self, fields: Fields, call: LayerCall) -> RecomputeRule:
        return _Rule(fields, call, policy=self)
