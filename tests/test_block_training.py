"""Block-diffusion SFT (``experiments/train_countdown_block.py``): the ``[clean | noisy]`` forward
gives every noisy block the context decoding gives it, and q/k norm is part of the native model."""

from __future__ import annotations

import torch
from train_countdown_block import block_ids, block_sft_loss, clean_noisy_layout

from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig

VOCAB, MASK = 32, 31


def tiny(qk_norm: bool = True) -> BidirectionalTransformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_length=64,
        qk_norm=qk_norm,
    )
    return BidirectionalTransformer(config).eval()


def test_blocks_count_from_the_first_prompt_token() -> None:
    attention = torch.tensor([[False, False, True, True, True, True, True, True]])
    assert block_ids(attention, 4).tolist() == [[-1, -1, 0, 0, 0, 0, 1, 1]]


def test_each_noisy_block_sees_what_decoding_shows_it() -> None:
    """The noisy copy's block k, from the one training forward, equals a forward of the canvas
    decoding has at block k: the clean blocks before it, then block k noisy, block-causal."""
    model, b = tiny(), 4
    generator = torch.Generator().manual_seed(3)
    clean = torch.randint(0, MASK, (2, 14), generator=generator)
    attention = torch.ones(2, 14, dtype=torch.bool)
    attention[1, :3] = False  # a shorter prompt, left-padded
    noisy = torch.where(torch.rand(2, 14, generator=generator) < 0.5, MASK, clean)
    layout, positions = clean_noisy_layout(attention, b)
    with torch.no_grad():
        together, _ = model.run(torch.cat([clean, noisy], dim=1), None, 0, attention=layout, positions=positions)
    for row in range(2):
        real = attention[row].nonzero().squeeze(1)
        blocks = block_ids(attention[row : row + 1], b)[0]
        for k in range(int(blocks.max()) + 1):
            upto = real[blocks[real] <= k]
            canvas = torch.where(blocks[upto] == k, noisy[row, upto], clean[row, upto])[None]
            seen = blocks[upto]
            causal = seen[None, :, None] >= seen[None, None, :]
            with torch.no_grad():
                alone, _ = model.run(canvas, None, 0, attention=causal, positions=torch.arange(len(upto))[None])
            columns = 14 + upto[seen == k]
            assert torch.allclose(together[row, columns], alone[0, seen == k], atol=1e-5), (row, k)


def test_the_loss_trains_response_tokens_only_and_qk_norm_has_weights() -> None:
    model = tiny()
    assert {"blocks.0.q_norm.weight", "blocks.0.k_norm.weight"} <= set(dict(model.named_parameters()))
    assert "blocks.0.q_norm.weight" not in dict(tiny(qk_norm=False).named_parameters())
    tokens = torch.randint(0, MASK, (3, 12), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(tokens, dtype=torch.bool)
    loss, plain = block_sft_loss(
        model.train(),
        tokens,
        attention,
        8,
        4,
        torch.Generator().manual_seed(2),
        torch.full(tokens.shape, 0.99),
        mask_id=MASK,
    )
    loss.backward()
    assert torch.isfinite(loss) and plain > 0
    assert model.blocks[0].q_norm.weight.grad is not None and bool(model.blocks[0].q_norm.weight.grad.abs().sum() > 0)


def test_a_shorter_noisy_copy_gives_the_same_response_logits() -> None:
    """Leaving the noisy copies of prompt-only blocks out changes no response column's logits."""
    model, b = tiny(), 4
    generator = torch.Generator().manual_seed(5)
    clean = torch.randint(0, MASK, (2, 14), generator=generator)
    attention = torch.ones(2, 14, dtype=torch.bool)
    attention[1, :2] = False
    noisy = torch.where(torch.rand(2, 14, generator=generator) < 0.5, MASK, clean)
    start = 9
    cut = start - b + 1
    with torch.no_grad():
        full, _ = model.run(torch.cat([clean, noisy], 1), None, 14 + start, *clean_noisy_layout(attention, b))
        short, _ = model.run(
            torch.cat([clean, noisy[:, cut:]], 1), None, 14 + start - cut, *clean_noisy_layout(attention, b, cut)
        )
    assert torch.allclose(full, short, atol=1e-5)
