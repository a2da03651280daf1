"""The one boundary between dlmsearch and a model: token ids in, float32 logits out.

Only the adapter knows a model family's quirks: its mask id, whether logits must be shifted
right by one position (AR-initialised models such as Dream predict token ``i`` at ``i - 1``),
how it takes a padding mask, and its device and dtype. Everything else reads ``mask_id`` from
here (configs interpolate ``${model.mask_id}``).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import nn

from dlmsearch.search.sampling import Sampling
from dlmsearch.validation import check_choice, check_type


@attrs.define(eq=False)
class ModelAdapter:
    """Wraps any ``module(input_ids, attention_mask=...)`` returning logits or an object with ``.logits``."""

    module: nn.Module
    mask_id: int = attrs.field(validator=check_type(int))
    vocab_size: int = attrs.field(validator=check_type(int))
    shift_logits: bool = attrs.field(default=False, validator=check_type(bool))
    device: str = attrs.field(default="cpu", validator=check_type(str))
    dtype: str = attrs.field(default="float32", validator=check_choice("float32", "bfloat16", "float16"))
    max_length: int | None = attrs.field(default=None, validator=check_type(int, optional=True))
    honours_padding: bool = attrs.field(default=True, validator=check_type(bool))  # False: rows are forwarded unpadded, grouped by prompt length
    suppressed_ids: list[int] = attrs.field(factory=list)  # never proposed (LLaDA's logits_eos_inf)
    deferred_ids: list[int] = attrs.field(factory=list)  # proposed with confidence 0, so committed last (confidence_eos_eot_inf)
    stop_ids: list[int] = attrs.field(factory=list)  # tokens that end an answer (EOS first: the tail is filled with it)
    generation_defaults: Sampling = attrs.field(factory=Sampling)  # the checkpoint's generation_config.json (temperature, top-p, top-k)

    def __attrs_post_init__(self) -> None:
        checked = (("model.mask_id=", [self.mask_id]), ("suppressed token id ", self.suppressed_ids), ("deferred token id ", self.deferred_ids), ("stop token id ", self.stop_ids))
        for name, ids in checked:
            outside = [i for i in ids if not 0 <= i < self.vocab_size]
            if outside:
                raise ValueError(f"{name}{outside[0]} is outside the vocabulary [0, {self.vocab_size})")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"model.device={self.device} but no CUDA device is available; use model.device=cpu")
        self.module = self.module.to(device=self.device, dtype=getattr(torch, self.dtype)).eval()

    @property
    def never_proposed(self) -> list[int]:
        """Token ids whose logits are set to -inf before proposing: the mask, and any suppressed ids."""
        return [self.mask_id, *self.suppressed_ids]

    def check_length(self, length: int, what: str) -> None:
        """Fail before decoding when a canvas cannot fit the model."""
        if self.max_length is not None and length > self.max_length:
            raise ValueError(f"{what} is {length} tokens, longer than the model's maximum length of {self.max_length}")

    @property
    def caches(self) -> bool:
        """Whether the module can run a window of columns against cached keys and values."""
        return getattr(self.module, "supports_kv_cache", False)

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor, attention_mask: torch.Tensor, keep_from: int = 0) -> torch.Tensor:
        """Float32 logits ``[rows, length - keep_from, vocab_size]`` for the columns from ``keep_from`` on."""
        return self.window_logits(tokens, attention_mask, keep_from, tokens.shape[1])[0]

    @torch.no_grad()
    def window_logits(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, low: int, high: int, past: list | None = None
    ) -> tuple[torch.Tensor, list | None]:
        """Float32 logits ``[rows, high - low, vocab_size]`` of columns ``low:high``, and the
        module's keys and values where it gives them.

        Without ``past`` the whole canvas is forwarded (bidirectional attention needs it);
        modules that take ``logits_from`` (the native text models) apply their vocabulary head
        only where asked, which saves most of the work for long prompts. With ``past`` (a KV
        cache of the whole canvas) only the window itself is forwarded. A shifted model's
        column reads its left neighbour's logits, so the window starts one column earlier.
        The padding mask is passed only when some row is padded, so models that ignore or
        reject it still run unpadded batches.
        """
        tokens = tokens.to(self.device)
        mask = None if bool(attention_mask.all()) else attention_mask.to(self.device)
        start = max(low - 1, 0) if self.shift_logits else low
        kv = None
        if past is not None:
            raw, kv = self.module.run(tokens[:, start:high], mask, 0, past, start)
        elif self.caches:
            raw, kv = self.module.run(tokens, mask, start)
        else:
            output: Any = self.module(tokens, attention_mask=mask)
            raw = getattr(output, "logits", output)
            if raw.shape[:2] != tokens.shape or raw.shape[-1] < self.vocab_size:
                raise ValueError(
                    f"model returned logits of shape {tuple(raw.shape)} for tokens {tuple(tokens.shape)}; "
                    f"expected [rows, length, >= {self.vocab_size}]"
                )
            raw = raw[:, start:]
        raw = raw[:, : high - start, : self.vocab_size].float()
        if self.shift_logits:
            raw = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)[:, low - start :]
        return raw, kv

    @property
    def lays_out_rows(self) -> bool:
        """Whether the module takes an explicit attention mask and positions (WINO's shadow block)."""
        return getattr(self.module, "takes_attention", False) and not self.shift_logits

    @torch.no_grad()
    def shadow_logits(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, low: int, high: int, block_start: torch.Tensor, block_length: int,
        past: list | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list | None]:
        """Logits of columns ``low:high`` and of a *shadow* of each row's block in the same forward
        (WINO): ``block_length`` mask tokens appended at the positions of the block's columns
        ``block_start[r] + j``. Canvas queries see the canvas only (the canvas logits are the plain
        forward's); shadow query ``j`` sees every shadow slot and the canvas except its own mirror
        column, so it predicts the token there from everything else. With ``past`` (a prefix
        cache: ``high`` is the canvas's end) only the window and the shadow are forwarded, against
        the cached columns before ``low``. Returns the canvas logits, the shadow's, and the
        canvas's keys and values (a full forward's, for refreshing a cache)."""
        if not self.lays_out_rows:
            raise ValueError(f"{type(self.module).__name__} cannot run a shadow block (it takes no explicit attention mask, or its logits are shifted)")
        rows, width = tokens.shape
        device = self.device
        real = attention_mask.to(device).bool()
        positions = (real.long().cumsum(dim=1) - 1).clamp(min=0)
        mirror = block_start.to(device)[:, None] + torch.arange(block_length, device=device)[None, :]  # [R, B] canvas columns
        first = low if past is not None else 0  # the first column forwarded
        if past is not None and high != width:
            raise ValueError("a shadow block runs against a prefix cache only (the window reaches the canvas's end)")
        queries = width - first + block_length
        attention = torch.zeros(rows, queries, width + block_length, dtype=torch.bool, device=device)
        attention[:, : width - first, :width] = real[:, None, :]
        attention[:, width - first :, :width] = real[:, None, :] & (torch.arange(width, device=device)[None, None, :] != mirror[:, :, None])
        attention[:, width - first :, width:] = True
        extended = torch.cat([tokens.to(device)[:, first:], torch.full((rows, block_length), self.mask_id, device=device)], dim=1)
        query_positions = torch.cat([positions[:, first:], positions.gather(1, mirror)], dim=1)
        module = self.module
        kv = None
        if hasattr(module, "run"):
            raw, fresh = module.run(extended, None, low - first, past, first, attention=attention, positions=query_positions)
            canvas, shadow = raw[:, : high - low], raw[:, width - low :]
            kv = None if past is not None else [(k[:, :, :width], v[:, :, :width]) for k, v in fresh]
        else:
            raw = module(extended, attention=attention, positions=query_positions)
            canvas, shadow = raw[:, low:high], raw[:, width:]
        return canvas[..., : self.vocab_size].float(), shadow[..., : self.vocab_size].float(), kv
