"""A random-weight LLaDA-shaped model that decodes like a trained one (no download).

The native :class:`BidirectionalTransformer` with LLaDA's vocabulary (126464), mask id (126336),
RoPE theta 5e5 and untied head, built on the meta device and materialised where it runs (an 8B
model is allocated once, on the GPU, in bf16), with the weights :func:`initialise` describes.
The ``sdar_*`` and ``llada2_*`` sizes are block-diffusion models shaped like SDAR / TraDo
(Qwen3-4B's width: GQA, q/k norm, head_dim 128, blocks of 4) and LLaDA2.0-mini (20 layers, 256
routed experts, top-8 in 4 of 8 groups, one shared expert, the first layer dense, partial rotary,
blocks of 32), with LLaDA's vocabulary and mask id so that every section reads the same ids.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
from torch import nn

from dlmsearch.models.transformer import BidirectionalTransformer, MixtureOfExperts, TransformerConfig

MASK_ID = 126336
VOCAB = 126464
PROMPT_ID_LIMIT = 126000  # random prompt ids stay below the special tokens
THRESHOLD = 0.9  # Fast-dLLM's tau

SIZES = {
    "tiny": dict(hidden_size=256, num_layers=4, num_heads=8, intermediate_size=768),
    "1b": dict(hidden_size=2048, num_layers=16, num_heads=16, intermediate_size=5632),
    "8b": dict(hidden_size=4096, num_layers=32, num_heads=32, intermediate_size=12288),  # LLaDA-8B
    # Dream-shaped (Qwen2: GQA, q/k/v bias, rotation in the model dtype, logits shifted right by one)
    "dream_tiny": dict(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=768, dream=True),
    "dream_7b": dict(
        hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4, intermediate_size=18944, dream=True
    ),  # Dream-v0-7B
    # block diffusion (flat settings; model_config builds the rest)
    "sdar_tiny": dict(
        hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32, intermediate_size=768, block_size=4
    ),
    "sdar_4b": dict(
        hidden_size=2560,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=9728,
        block_size=4,
    ),
    "llada2_tiny": dict(
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
        intermediate_size=768,
        block_size=8,
        experts=16,
        top_k=4,
        groups=4,
        top_groups=2,
        expert_size=128,
        shared_experts=1,
        dense_layers=1,
    ),
    "llada2_mini": dict(
        hidden_size=2048,
        num_layers=20,
        num_heads=16,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=5120,
        block_size=32,
        experts=256,
        top_k=8,
        groups=8,
        top_groups=4,
        expert_size=512,
        shared_experts=1,
        dense_layers=1,
    ),
}
BLOCK_SIZES = tuple(name for name, shape in SIZES.items() if "block_size" in shape)
DREAM_SIZES = tuple(name for name, shape in SIZES.items() if shape.get("dream"))

# Random weights (see ``initialise``).
INIT_STD = 0.02
QK_COMPONENT_STD = 2.56  # query/key component std: attention logits std ~6.5, sharp and position-dependent
LOGIT_STD = 16.0  # head output std: top-1 probabilities spread over (0, 1), tau = 0.9 commits ~3 tokens/step
CONSTANT_VALUE = 0.05  # a constant residual channel that carries the mask token's logit far down
MASK_LOGIT_WEIGHT = -1.0e4


def model_config(size: str) -> TransformerConfig:
    shape = dict(SIZES[size])
    moe = None
    if "experts" in shape:
        moe = MixtureOfExperts(
            num_experts=shape.pop("experts"),
            top_k=shape.pop("top_k"),
            groups=shape.pop("groups"),
            top_groups=shape.pop("top_groups"),
            scaling=2.5,
            intermediate_size=shape.pop("expert_size"),
            shared_experts=shape.pop("shared_experts"),
            dense_layers=shape.pop("dense_layers"),
        )
    block = "block_size" in shape
    dream = shape.pop("dream", False)
    return TransformerConfig(
        vocab_size=VOCAB,
        num_kv_heads=shape.pop("num_kv_heads", shape["num_heads"]),
        max_length=4096,
        rope_theta=1e6 if block or dream else 5e5,
        tie_embeddings=False,
        qk_norm=block,
        qkv_bias=dream,
        rope_in_float32=not (block or dream),
        rotary_dim=shape["head_dim"] // 2 if moe is not None else None,
        moe=moe,
        **shape,
    )


def build_model(size: str, device: str, dtype: torch.dtype, seed: int = 0) -> BidirectionalTransformer:
    """The model on ``device`` in ``dtype``: constructed on the meta device (no memory), then
    allocated once where it runs (``device="meta"`` stops before that) and initialised in place."""
    with torch.device("meta"):
        model = BidirectionalTransformer(model_config(size))
    model = model.to(dtype=dtype)
    if device == "meta":
        return model
    model.to_empty(device=device)
    initialise(model, seed)
    return model.eval()


@torch.no_grad()
def initialise(model: BidirectionalTransformer, seed: int, mask_id: int = MASK_ID) -> None:
    """N(0, 0.02) weights and unit norms, with three adjustments that make a random model decode
    like a trained one (the same ideas as ``tests/tiny_checkpoints.py``):

    * query and key projections scaled so their components have std ``QK_COMPONENT_STD`` at any
      width (with q/k norm: the norms' weights set to it): masked positions hold the same
      embedding and differ only through (RoPE) attention, which must be sharp for their
      confidences to differ;
    * the head scaled so that logits have std ``LOGIT_STD``: over a 126k vocabulary the top-1
      probability then spreads over (0, 1) and threshold decoding commits several tokens per step;
    * a constant residual channel (last dimension: the same value in every embedding, never
      written by a block, read by the head for the mask token only) that puts the mask token's
      logit hundreds below the rest, so that the mask is never proposed, not even by the
      reference loop (which does not exclude it).

    ``mask_id`` is LLaDA's unless the model has another vocabulary (a random LLaDA over a
    shipped tokenizer).
    """
    config = model.config
    width = config.hidden_size
    device = model.embed.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    for param in model.parameters():
        if param.dim() == 1:
            param.fill_(1.0)
        else:
            param.normal_(0.0, INIT_STD, generator=generator)
    qk_gain = QK_COMPONENT_STD / (INIT_STD * math.sqrt(width))
    j = width - 1
    model.embed.weight[:, j] = CONSTANT_VALUE
    for block in model.blocks:
        if block.q_norm is not None:  # the norm undoes any projection scale: its weight sets the component std
            block.q_norm.weight.fill_(QK_COMPONENT_STD)
            block.k_norm.weight.fill_(QK_COMPONENT_STD)
        else:
            block.q_proj.weight.mul_(qk_gain)
            block.k_proj.weight.mul_(qk_gain)
        block.o_proj.weight[j] = 0.0
        block.down_proj.weight[j] = 0.0
        if block.moe is not None:
            block.expert_down[:, j] = 0.0
    head = model.head.weight
    head.mul_(LOGIT_STD / (INIT_STD * math.sqrt(width)))
    head[:, j] = 0.0  # the constant channel feeds the mask logit only
    head[mask_id] = 0.0
    head[mask_id, j] = MASK_LOGIT_WEIGHT
    model.norm.weight[j] = 1.0 / CONSTANT_VALUE  # mask logit about -1e4 / rms of the last hidden state


class ReferenceView(nn.Module):
    """Our module as the reference loop wants a model: ``model(x).logits`` and ``model.device``.
    Both loops then run the very same weights and forward; only the loops differ."""

    def __init__(self, inner: BidirectionalTransformer) -> None:
        super().__init__()
        self.inner = inner

    @property
    def device(self) -> torch.device:
        return self.inner.embed.weight.device

    def forward(self, input_ids: torch.Tensor, **_: Any) -> types.SimpleNamespace:
        return types.SimpleNamespace(logits=self.inner(input_ids))


def confidence_profile(
    module: BidirectionalTransformer, device: str, prompt: int = 64, masks: int = 64
) -> dict[str, float]:
    """Top-1 probabilities at the masked positions of one random prompt (does the model behave?)."""
    generator = torch.Generator().manual_seed(123)
    x = torch.cat([torch.randint(0, PROMPT_ID_LIMIT, (prompt,), generator=generator), torch.full((masks,), MASK_ID)])[
        None
    ].to(device)
    with torch.no_grad():
        logits = module(x, logits_from=prompt)[0].float()
    top = torch.softmax(logits, dim=-1).max(dim=-1).values
    return {
        "median_top1": round(top.median().item(), 4),
        "share_above_0.9": round((top > 0.9).float().mean().item(), 4),
        "share_below_0.3": round((top < 0.3).float().mean().item(), 4),
        "distinct_argmax": int(logits.argmax(-1).unique().numel()),
        "mask_logit_margin": round((logits.max(-1).values - logits[:, MASK_ID]).min().item(), 1),
    }
