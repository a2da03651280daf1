"""The per-position statistics a component may ask the engine for, each with its provider.

A commit rule or a candidate generator declares the statistics it reads (``statistics``); the
engine computes only those. Each statistic names what it is computed from:

* ``distribution`` — the distribution the confidence is read from (``margin``, ``entropy``): a
  function of it, evaluated inside the call while the vocabulary-sized tensors exist;
* ``draws`` — the position's seeded uniform (``uniform``: random orders, ``alg_temp``);
* ``history`` — the slot's previous step's distributions (``kl``: KLASS);
* ``shadow`` — WINO's shadow block in the same forward (``verify``);
* ``logits`` — the processed logits tokens are drawn from (``tempered_entropy``: DiffusionGemma's
  entropy, torch's ``Categorical(logits=...)``), evaluated inside the call like ``distribution``;
* ``canvas`` — the slot's memory of the canvas it denoises (``repeats``: how many steps in a row
  the draft has not changed, the stopping rule's stability), kept by a uniform-noise model's call.

A new statistic of the distribution is one function and one line in ``REGISTRY`` (and the field of
:class:`~dlmsearch.search.records.state.Evaluation` that carries it).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch


def margin(read: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 probability."""
    top2 = read.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def entropy(read: torch.Tensor) -> torch.Tensor:
    """``-sum p log(p + 1e-10)``: Dream's definition."""
    return -(read * torch.log(read + 1e-10)).sum(dim=-1)


def draft(read: torch.Tensor) -> torch.Tensor:
    """The most likely token (first on ties, as ``torch.argmax``), as a float (ids are exact below 2**24)."""
    return read.argmax(dim=-1).float()


def draft_confidence(read: torch.Tensor) -> torch.Tensor:
    """The probability of the draft (:func:`draft`, the largest): what a finished uniform-noise
    canvas records for the tokens it holds, so ``log_probability`` ranks the output's own tokens."""
    return read.max(dim=-1).values


def runner_up(read: torch.Tensor) -> torch.Tensor:
    """The second most likely token, as a float (a tree search's joint moves try it beside the first)."""
    return read.topk(2, dim=-1).indices[..., 1].float()


def runner_up_confidence(read: torch.Tensor) -> torch.Tensor:
    """The second most likely token's probability, read as ``confidence`` is."""
    return read.topk(2, dim=-1).values[..., 1]


def tempered_entropy(processed: torch.Tensor) -> torch.Tensor:
    """The entropy of ``softmax(processed)`` exactly as ``torch.distributions.Categorical(logits=processed)``
    computes it (DiffusionGemma's EB-Sampler and stopping rule read this one, not Dream's)."""
    normalised = processed - processed.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(normalised, dim=-1)
    return -(normalised.clamp(min=torch.finfo(normalised.dtype).min) * probs).sum(dim=-1)


@attrs.frozen
class Statistic:
    name: str
    source: str = attrs.field(
        validator=attrs.validators.in_(("distribution", "draws", "history", "shadow", "logits", "canvas"))
    )
    compute: Callable[[torch.Tensor], torch.Tensor] | None = (
        None  # a distribution statistic: ``[R, T, V]`` probabilities to ``[R, T]``
    )


REGISTRY: dict[str, Statistic] = {
    s.name: s
    for s in (
        Statistic("margin", "distribution", margin),
        Statistic("entropy", "distribution", entropy),
        Statistic("uniform", "draws"),
        Statistic("kl", "history"),
        Statistic("verify", "shadow"),
        Statistic("draft", "distribution", draft),
        Statistic("draft_confidence", "distribution", draft_confidence),
        Statistic("runner_up", "distribution", runner_up),
        Statistic("runner_up_confidence", "distribution", runner_up_confidence),
        Statistic("tempered_entropy", "logits", tempered_entropy),
        Statistic("repeats", "canvas"),
    )
}


def check(statistics: frozenset[str]) -> None:
    """Fail on a statistic no provider computes."""
    unknown = set(statistics) - set(REGISTRY)
    if unknown:
        raise ValueError(f"unknown statistics {sorted(unknown)}; available: {', '.join(REGISTRY)}")


def of_distribution(statistics: frozenset[str]) -> list[Statistic]:
    """The requested statistics computed from the distribution, in the registry's order."""
    return [s for name, s in REGISTRY.items() if name in statistics and s.source == "distribution"]


def of_logits(statistics: frozenset[str]) -> list[Statistic]:
    """The requested statistics computed from the processed logits, in the registry's order."""
    return [s for name, s in REGISTRY.items() if name in statistics and s.source == "logits"]


def from_source(statistics: frozenset[str], source: str) -> frozenset[str]:
    """The requested statistics that ``source`` provides (the engine asks each provider for its own)."""
    return frozenset(name for name in statistics if REGISTRY[name].source == source)
