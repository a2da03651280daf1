"""Training the three Countdown formats alike on the three- and four-number mix (issue 39): the
sampler's four-number share, continuing a trained model, and the block model's full-attention
ablation (trained in ``train_countdown_block.py attention=full``, decoded with ``model.full_attention``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from train_countdown import ProblemSampler
from train_countdown_block import block_sft_loss

from dlmsearch.models.loading import load_text_model
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.shipped import package_data
from dlmsearch.training import Checkpointer

VOCAB, MASK = 32, 31
CURRICULUM = {"start_high": 20, "high": 20, "ramp": 0.25, "wide_fraction": 0.0, "wide_high": 100}


def draws(four_fraction: float | None, count: int) -> list:
    cfg = OmegaConf.create(CURRICULUM if four_fraction is None else {**CURRICULUM, "four_fraction": four_fraction})
    sampler = ProblemSampler(cfg, np.random.default_rng(0), set())
    return [sampler.draw(0.5) for _ in range(count)]


def test_no_four_number_share_keeps_the_data_order_of_runs_without_the_key() -> None:
    assert draws(None, 20) == draws(0.0, 20)


def test_the_four_number_share_draws_answers_of_three_steps() -> None:
    drawn = draws(0.5, 120)
    four = [(p, a) for p, a in drawn if len(p.numbers) == 4]
    assert 0.35 < len(four) / len(drawn) < 0.65
    assert all(a.count("=") == 3 for _, a in four)
    assert all(a.count("=") == 2 for p, a in drawn if len(p.numbers) == 3)


def tiny() -> BidirectionalTransformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_length=64,
        qk_norm=True,
        block_size=4,
    )
    return BidirectionalTransformer(config).eval()


@pytest.mark.parametrize("full", [False, True])
def test_full_attention_lets_an_early_block_see_later_blocks(full: bool) -> None:
    """The first response block (all masked) is scored against a later block (never masked): under
    block-causal attention a later token cannot change that loss; under the ablation's full attention it does."""
    model, start = tiny(), 8
    tokens = torch.randint(0, MASK, (2, 16), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(tokens, dtype=torch.bool)
    rate = torch.full(tokens.shape, 1e-9)
    rate[:, start : start + 4] = 1.0  # every token of the first response block masked, none after it
    changed = tokens.clone()
    changed[:, 14] = (changed[:, 14] + 1) % MASK

    def loss(row_tokens: torch.Tensor) -> float:
        with torch.no_grad():
            return block_sft_loss(
                model, row_tokens, attention, start, 4, torch.Generator().manual_seed(2), rate, MASK, full
            )[1]

    assert (loss(tokens) != loss(changed)) == full


def test_start_from_loads_a_trained_model_only_on_a_fresh_run(tmp_path: Path) -> None:
    trained, model = tiny(), tiny()
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(1.0)
    optimizer = torch.optim.AdamW(model.parameters())
    checkpoints = Checkpointer(tmp_path / "run", model, optimizer, torch.Generator(), np.random.default_rng(0))
    with pytest.raises(FileNotFoundError, match="init_from=.*no such model directory"):
        checkpoints.start_from(tmp_path / "missing", lambda d: trained.state_dict())
    checkpoints.start_from(tmp_path, lambda d: trained.state_dict())
    assert torch.equal(model.embed.weight, trained.embed.weight)
    checkpoints.save(3, train_seconds=1.0)
    with torch.no_grad():
        model.embed.weight.zero_()
    checkpoints.start_from(tmp_path, lambda d: trained.state_dict())  # a checkpoint exists: it wins on resume
    assert not torch.equal(model.embed.weight, trained.embed.weight)


def test_a_block_model_decodes_with_full_attention_on_request() -> None:
    path = str(package_data("countdown_block_model"))
    block = load_text_model(path, "sdar", device="cpu", dtype="float32")
    full = load_text_model(path, "sdar", device="cpu", dtype="float32", full_attention=True)
    assert block.attention_block == 4 and full.attention_block is None and full.module.config.block_size is None
    with pytest.raises(ValueError, match="full_attention=true: llada already attends to the whole canvas"):
        load_text_model(str(package_data("countdown_model")), "llada", device="cpu", full_attention=True)
