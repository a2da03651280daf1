"""Tiny native models shaped like the text families (LLaDA, Dream), shared by the batching, session,
cache, compile and GPU tests: a 64-token vocabulary whose last id is the mask, generations of
``GEN`` tokens in blocks of ``BLOCK``. A helper module, not a test module: tests import it as
``family_models`` (``tests/`` is on ``sys.path`` under pytest, as for ``tiny_checkpoints``). Its
constants differ from conftest's tiny denoiser's (``VOCAB`` 24), hence a module of their own."""

from __future__ import annotations

import torch
from torch import nn

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig
from dlmsearch.search.decode.intake import DecodeRequest

VOCAB, MASK_ID, GEN, BLOCK = 64, 63, 16, 8


def tiny_family_model(family: str, seed: int = 0) -> BidirectionalTransformer:
    """A random native model shaped like the family (Dream: GQA, q/k/v bias, rotation in model dtype),
    with sharper attention and head so that confidences spread over (0.3, 0.9)."""
    torch.manual_seed(seed)
    dream = family == "dream"
    config = TransformerConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2 if dream else 4,
        intermediate_size=64,
        max_length=128,
        rope_theta=1e6 if dream else 5e5,
        qkv_bias=dream,
        rope_in_float32=not dream,
    )
    model = BidirectionalTransformer(config)
    with torch.no_grad():
        model.head.weight.mul_(8.0)
        for block in model.blocks:
            block.q_proj.weight.mul_(8.0)
            block.k_proj.weight.mul_(8.0)
    return model.eval()


class IgnoresPadding(nn.Module):
    """Like the families' remote code: the padding mask is dropped."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner(input_ids)


def adapter_for(family: str, honours_padding: bool) -> ModelAdapter:
    model = tiny_family_model(family)
    module = model if honours_padding else IgnoresPadding(model)
    return ModelAdapter(
        module=module,
        mask_id=MASK_ID,
        vocab_size=VOCAB,
        shift_logits=family == "dream",
        honours_padding=honours_padding,
    )


def requests_for(lengths: list[int], seed: int) -> list[DecodeRequest]:
    generator = torch.Generator().manual_seed(seed)
    return [
        DecodeRequest(
            uid=uid, prompt=torch.randint(0, MASK_ID, (n,), generator=generator), generation=torch.full((GEN,), MASK_ID)
        )
        for uid, n in enumerate(lengths)
    ]
