"""Shared fixtures: tiny models built in code, one torch thread (2 threads under load are slower)."""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import pytest
import torch

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.denoiser import BidirectionalDenoiser, DenoiserConfig
from dlmsearch.search.driver import DecodeRequest, SearchDecoder

torch.set_num_threads(1)


def free_port() -> int:
    """A loopback port nobody listens on now (servers and torchrun rendezvous in tests)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The experiment scripts (training, tiers) are tested too: they import as modules from here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

VOCAB = 24
MASK_ID = 23


def tiny_denoiser(
    vocab: int = VOCAB,
    mask_id: int = MASK_ID,
    max_len: int = 96,
    seed: int = 0,
    sharpness: float = 6.0,
    grid_side: int = 0,
) -> BidirectionalDenoiser:
    """A random 2-layer denoiser whose confidences spread over (0, 1): its head is scaled up so
    that thresholds, triggers and lookahead all see a mix of confident and unsure positions.
    The mask logit is pushed far down, as a trained model's is."""
    torch.manual_seed(seed)
    model = BidirectionalDenoiser(
        DenoiserConfig(
            vocab_size=vocab, max_len=max_len, d_model=32, n_layers=2, n_heads=2, d_ff=64, grid_side=grid_side
        )
    )
    with torch.no_grad():
        model.head.weight.mul_(sharpness)
        model.head.bias[mask_id] = -30.0
    return model.eval()


def cached_adapter() -> ModelAdapter:
    """A tiny native transformer (it can cache keys and values), for checks that need engine.cache."""
    from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig

    config = TransformerConfig(
        vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32, max_length=64
    )
    return ModelAdapter(module=BidirectionalTransformer(config), mask_id=MASK_ID, vocab_size=VOCAB)


@pytest.fixture(scope="session")
def adapter() -> ModelAdapter:
    return ModelAdapter(module=tiny_denoiser(), mask_id=MASK_ID, vocab_size=VOCAB)


def make_requests(
    prompt_lengths: list[int], gen_length: int, seed: int = 0, fixed: int = 0, mask_id: int = MASK_ID
) -> list[DecodeRequest]:
    """Requests with random prompts of the given lengths (ids below ``mask_id``, the model's mask:
    the tiny models put it last); ``fixed`` random pre-filled generation cells."""
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for uid, length in enumerate(prompt_lengths):
        prompt = torch.randint(0, mask_id, (length,), generator=generator)
        generation = torch.full((gen_length,), mask_id)
        if fixed:
            cells = torch.randperm(gen_length, generator=generator)[:fixed]
            generation[cells] = torch.randint(0, mask_id, (fixed,), generator=generator)
        requests.append(DecodeRequest(uid=uid, prompt=prompt, generation=generation))
    return requests


class NoRepeatVerifier:
    """A task rule for the tiny models: no token twice in a row. Partial outputs that break it
    are inconsistent; complete ones that keep it are accepted; the answer is the first token."""

    checks_partial = True

    def consistent(self, sample: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        both = ~masked[:, 1:] & ~masked[:, :-1]
        return ~(both & (tokens[:, 1:] == tokens[:, :-1])).any(dim=1)

    def accepts(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.consistent(sample, tokens, torch.zeros_like(tokens, dtype=torch.bool))

    def answers(self, sample: torch.Tensor, tokens: torch.Tensor) -> list[str | None]:
        return [str(int(row[0])) for row in tokens]


def text_decoder(preset: str, *overrides: str, gen_length: int = 16) -> SearchDecoder:
    """A preset composed for left-to-right text (frontier at the block midpoint)."""
    cfg = compose([f"+decoder={preset}", "decoding=text", f"task.gen_length={gen_length}", *overrides])
    return build(cfg, "decoder")


@attrs.frozen
class TextCheckpoint:
    """A tiny random checkpoint of a text family, built with the family's own code, plus its tokenizer."""

    directory: Path
    sharded: Path  # the same weights in two shards
    upstream: torch.nn.Module
    mask_id: int
    vocab_size: int
    stop_ids: list[int]


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TextCheckpoint]:
    """Tiny LLaDA and Dream checkpoints with the real vocabularies and special ids (built once)."""
    from tiny_checkpoints import build_dream, build_llada, upstream_missing_reason
    from tiny_tokenizer import write_tokenizer

    reason = upstream_missing_reason()
    if reason:
        pytest.skip(reason)
    specs = {}
    for family, build_checkpoint in (("llada", build_llada), ("dream", build_dream)):
        cfg = compose([f"model={family}", "model.path=unused"]).model
        root = tmp_path_factory.mktemp(f"tiny_{family}")
        upstream = build_checkpoint(root / "model")
        build_checkpoint(root / "sharded", shards=2)
        write_tokenizer(root / "model", family)
        specs[family] = TextCheckpoint(
            root / "model", root / "sharded", upstream, cfg.mask_id, cfg.vocab_size, list(cfg.stop_ids)
        )
    return specs
