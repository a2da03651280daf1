"""Shared fixtures: tiny models built in code, one torch thread (2 threads under load are slower).

Test modules never import each other: a fake or helper used by more than one of them lives here
(tests import it as ``conftest``: pytest puts ``tests/`` on ``sys.path``), or in a helper module
of its own where its names would clash with these (``family_models``: the 64-token family models)."""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import pytest
import torch

from dlmsearch.config import build, compose
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.denoiser import BidirectionalDenoiser, DenoiserConfig
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.decode.results import DecodeResult
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.search.engine.rollout import RolloutEngine

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
    checks_complete = True

    def consistent(self, sample: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        both = ~masked[:, 1:] & ~masked[:, :-1]
        return ~(both & (tokens[:, 1:] == tokens[:, :-1])).any(dim=1)

    def accepts(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.consistent(sample, tokens, torch.zeros_like(tokens, dtype=torch.bool))

    def violations(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens[:, 1:] == tokens[:, :-1]).sum(dim=1).float()

    def answers(self, sample: torch.Tensor, tokens: torch.Tensor) -> list[str | None]:
        return [str(int(row[0])) for row in tokens]


def text_decoder(preset: str, *overrides: str, gen_length: int = 16) -> SearchDecoder:
    """A preset composed for left-to-right text (frontier at the block midpoint)."""
    cfg = compose([f"+decoder={preset}", "decoding=text", f"task.gen_length={gen_length}", *overrides])
    return build(cfg, "decoder")


class CountingModule(torch.nn.Module):
    """Wraps a model and records every forward call's row count (``calls``: one entry per forward)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[int] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.calls.append(input_ids.shape[0])
        return self.inner(input_ids, attention_mask=attention_mask)


class FixedLogits(torch.nn.Module):
    """Returns the same designed logits for any input of its length."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", logits)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.table.expand(input_ids.shape[0], -1, -1).clone()  # fresh, as a real forward is


def plan_on(engine: RolloutEngine, preset: str = "llada") -> None:
    """Plan ``preset`` on ``engine``: where every engine x model x cache refusal is raised (plan.RULES)."""
    text_decoder(preset).plan(engine, 16, 8, None)


def record(result: DecodeResult) -> tuple:
    """Everything a decode result says about one sample, comparable with ``==`` (sessions, caches)."""
    parts = (result.tokens, result.commit_call, result.commit_depth, result.commit_branch, result.revisions)
    return (*(p.tolist() for p in parts), result.steps, result.row_forwards, result.token_forwards, result.population)


def renumbered(requests: list[DecodeRequest], offset: int) -> list[DecodeRequest]:
    return [attrs.evolve(r, uid=r.uid + offset) for r in requests]


_TOPK = torch.topk  # the real one, for stable_topk where a test patches torch.topk with it


def stable_topk(values: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """``torch.topk`` with ties taken in column order (the lowest first), as dlmsearch breaks them."""
    if not largest:
        return _TOPK(values, k, dim=dim, largest=largest, sorted=sorted)
    order = torch.sort(values, dim=dim, descending=True, stable=True)
    return torch.return_types.topk((order.values.narrow(dim, 0, k), order.indices.narrow(dim, 0, k)))


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


PARITY_PROMPT_LENGTHS = [5, 11, 8]


def mixed_batch(spec: TextCheckpoint, gen_length: int, seed: int = 0) -> list[DecodeRequest]:
    """Three requests with random prompts of 5, 11 and 8 tokens, for the parity tests' tiny checkpoints."""
    generator = torch.Generator().manual_seed(seed)
    return [
        DecodeRequest(
            uid=uid,
            prompt=torch.randint(0, 1000, (length,), generator=generator),
            generation=torch.full((gen_length,), spec.mask_id),
        )
        for uid, length in enumerate(PARITY_PROMPT_LENGTHS)
    ]


def engine_for(spec: TextCheckpoint, family: str, cache: str = "none") -> RolloutEngine:
    """An engine on the tiny checkpoint, loaded as a run loads it (float32, CPU)."""
    from dlmsearch.models.loading import load_text_model

    adapter = load_text_model(
        str(spec.directory), family, spec.mask_id, spec.vocab_size, spec.stop_ids, device="cpu", dtype="float32"
    )
    return RolloutEngine(adapter=adapter, cache=cache)


# LLaDA2.0: a tiny MoE (8 routed experts in 4 groups, top-2 of the best 2 groups, one shared expert, the first
# layer dense, partial rotary, q/k norm), blocks of 8; its generate stops after the block holding an EOS
# (always) and returns the generation cut at gen_length and after the first EOS. Mask and EOS ids: the block
# parity tests' (999, 998).
TINY_LLADA2 = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "use_bias": False,
    "use_qkv_bias": False,
    "use_qk_norm": True,
    "num_experts": 8,
    "num_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
    "partial_rotary_factor": 0.5,
    "embedding_dropout": 0.0,
    "attention_dropout": 0.0,
    "output_dropout": 0.0,
    "block_size": 8,
    "seed": 5,
    "sharpness": 5.0,
    "mask_id": 999,
    "eos_id": 998,
}


def admit_step_evict(session, first: list[DecodeRequest], later: list[DecodeRequest]) -> tuple[dict, int | None]:
    """Churn a session as a server would: admit ``first``, step twice, admit ``later`` (uids from 100),
    step, evict the last of ``first`` still running, run to the end. The finished results by uid, and
    the evicted uid (None where none was left to evict)."""
    session.admit(first)
    finished = {r.uid: r for r in session.step() + session.step()}
    session.admit(later)
    finished.update({r.uid: r for r in session.step()})
    running = [uid for uid in session.uids if uid < 100]
    victim = running[-1] if running else None
    session.evict([victim])
    finished.update({r.uid: r for r in session.run()})
    assert victim not in finished
    return finished, victim
