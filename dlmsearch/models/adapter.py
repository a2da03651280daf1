"""The one boundary between dlmsearch and a model: token ids in, float32 logits out.

Only the adapter knows a model family's quirks: its mask id, whether logits must be shifted
right by one position (AR-initialised models such as Dream predict token ``i`` at ``i - 1``),
how it takes a padding mask, what it reads at an open position (:meth:`ModelAdapter.materialise`),
and its device and dtype. What the model can do is declared once,
as a frozen :class:`~dlmsearch.core.capabilities.ModelCapabilities` (``capabilities``): the
engine, the decode plan and the driver read that record, never the module. Everything else
reads ``mask_id`` from here (configs interpolate ``${model.mask_id}``; null: the model has no mask token).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch import nn

from dlmsearch.core import attention as pattern
from dlmsearch.core.capabilities import NO_FEATURES, ModelCapabilities, ModuleFeatures
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.kv_storage import CachedRows
from dlmsearch.models.layerwise import LayerRule, layerwise_logits
from dlmsearch.validation import check_choice, check_type

CACHE_POLICIES = ("none", "prefix", "dual")  # what a full-attention module that keeps keys and values can run
BLOCK_CACHE_POLICIES = ("none", "block")  # a block-diffusion module: its finished blocks' keys and values are exact


@attrs.define(eq=False)
class ModelAdapter:
    """Wraps any ``module(input_ids, attention_mask=...)`` returning logits or an object with ``.logits``."""

    module: nn.Module
    mask_id: int | None = attrs.field(validator=check_type(int, optional=True))  # None: no mask token
    vocab_size: int = attrs.field(validator=check_type(int))
    shift_logits: bool = attrs.field(default=False, validator=check_type(bool))
    device: str = attrs.field(default="cpu", validator=check_type(str))
    dtype: str = attrs.field(default="float32", validator=check_choice("float32", "bfloat16", "float16"))
    max_length: int | None = attrs.field(default=None, validator=check_type(int, optional=True))
    honours_padding: bool = attrs.field(
        default=True, validator=check_type(bool)
    )  # False: rows are forwarded unpadded, grouped by prompt length
    suppressed_ids: list[int] = attrs.field(factory=list)  # never proposed (LLaDA's logits_eos_inf)
    deferred_ids: list[int] = attrs.field(
        factory=list
    )  # proposed with confidence 0, so committed last (confidence_eos_eot_inf)
    stop_ids: list[int] = attrs.field(factory=list)  # tokens that end an answer (EOS first: the tail is filled with it)
    generation_defaults: Sampling = attrs.field(
        factory=Sampling
    )  # the checkpoint's generation_config.json (temperature, top-p, top-k)
    attention_block: int | None = attrs.field(
        default=None, validator=check_type(int, optional=True)
    )  # block diffusion: the model's block size
    features: ModuleFeatures = attrs.field(
        init=False, default=NO_FEATURES
    )  # what the module declares (its ``features``)
    capabilities: ModelCapabilities = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._check_ids()
        checked = (
            ("suppressed token id ", self.suppressed_ids),
            ("deferred token id ", self.deferred_ids),
            ("stop token id ", self.stop_ids),
        )
        for name, ids in checked:
            outside = [i for i in ids if not 0 <= i < self.vocab_size]
            if outside:
                raise ValueError(f"{name}{outside[0]} is outside the vocabulary [0, {self.vocab_size})")
        if self.vocab_size > 2**24:  # the engine moves token ids to the host as float32, exact below 2**24
            raise ValueError(f"vocab_size={self.vocab_size} is larger than dlmsearch supports (2**24)")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"model.device={self.device} but no CUDA device is available; use model.device=cpu")
        self.module = self.module.to(device=self.device, dtype=getattr(torch, self.dtype)).eval()
        self.features = getattr(
            type(self.module), "features", NO_FEATURES
        )  # the one place a module's features are read
        self.capabilities = ModelCapabilities(
            name=type(self.module).__name__,
            vocab_size=self.vocab_size,
            mask_id=self.mask_id,
            stop_ids=tuple(self.stop_ids),
            max_length=self.max_length,
            cache_policies=("none",)
            if not self.features.kv_cache
            else BLOCK_CACHE_POLICIES
            if self.attention_block
            else CACHE_POLICIES,
            shadow=self.features.explicit_attention and not self.shift_logits and self.attention_block is None,
            shift_logits=self.shift_logits,
            honours_padding=self.honours_padding,
            compiles=self.features.compiles,
            attention_block=self.attention_block,
            layerwise=self.features.layerwise
            and self.attention_block is None
            and getattr(self.module.config, "moe", None) is None,
            tensor_parallel=getattr(getattr(self.module, "tensor_parallel", None), "size", 1),  # shard_model's group
        )

    def _check_ids(self) -> None:
        """The mask id is a token of the vocabulary: a masked model reads it at every open position."""
        if self.mask_id is None:
            raise ValueError(
                f"model.mask_id is null, but {type(self.module).__name__} reads the mask token at every open position: give its id"
            )
        if not 0 <= self.mask_id < self.vocab_size:
            raise ValueError(f"model.mask_id={self.mask_id} is outside the vocabulary [0, {self.vocab_size})")

    def empty_kv(self, slots: int, width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Zeroed keys and values ``[slots, kv_heads, width, head_dim]`` per layer, for a store that
        is filled by cached forwards alone (the exact block cache)."""
        config = self.module.config
        shape = (slots, config.num_kv_heads, width, config.head_dim)
        make = lambda: torch.zeros(shape, dtype=getattr(torch, self.dtype), device=self.device)
        return [(make(), make()) for _ in range(config.num_layers)]

    @property
    def never_proposed(self) -> list[int]:
        """Token ids whose logits are set to -inf before proposing: the mask, and any suppressed ids."""
        return [self.mask_id, *self.suppressed_ids]

    def materialise(
        self, tokens: torch.Tensor, open_: torch.Tensor, uniform: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """``tokens [R, T]`` with every open position (``open_ [R, T]``, the positions a step may still
        fill) holding what this model reads there: the mask id (``uniform``: the positions' keyed
        draws, for a model that reads noise there; a masked model draws nothing)."""
        return torch.where(open_, self.mask_id, tokens)

    def compile(self) -> None:
        """The module's per-token work under torch.compile (``engine.compile=true``; checked against ``capabilities``)."""
        self.module.compile_blocks()

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor, attention_mask: torch.Tensor, keep_from: int = 0) -> torch.Tensor:
        """Float32 logits ``[rows, length - keep_from, vocab_size]`` for the columns from ``keep_from`` on."""
        return self.window_logits(tokens, attention_mask, keep_from, tokens.shape[1])[0]

    @torch.no_grad()
    def window_logits(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, low: int, high: int
    ) -> tuple[torch.Tensor, list | None]:
        """Float32 logits ``[rows, high - low, vocab_size]`` of columns ``low:high``, and the
        module's keys and values where it gives them.

        The whole canvas is forwarded (bidirectional attention needs it); modules that take
        ``logits_from`` (the native text models) apply their vocabulary head only where asked,
        which saves most of the work for long prompts. A shifted model's column reads its left
        neighbour's logits, so the window starts one column earlier. The padding mask is passed
        only when some row is padded, so models that ignore or reject it still run unpadded batches.
        """
        tokens = tokens.to(self.device)
        mask = None if bool(attention_mask.all()) else attention_mask.to(self.device)
        start = max(low - 1, 0) if self.shift_logits else low
        kv = None
        if self.features.kv_cache:
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

    def _forwarded(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        """The first column a cached forward of columns ``low:high`` computes (one earlier for a shifted model)."""
        return (low - 1).clamp(min=0) if self.shift_logits else low

    @torch.no_grad()
    def cached_logits(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        low: torch.Tensor,
        high: torch.Tensor,
        cached: CachedRows,
    ) -> torch.Tensor:
        """Float32 logits ``[rows, max(high - low), vocab_size]`` of each row's columns
        ``low[r]:high[r]`` (left-aligned; columns past a row's end are padding), forwarding only
        those columns against the cache of the row's slot (``cached.slot``). All rows run as one
        forward whatever their windows. ``cached.in_place [rows]``: the rows whose keys and values
        may be written into their slot's canvas columns (None: each slot's first row, as
        Fast-dLLM's caches do). ``cached.logits_from [rows]`` (unshifted models): logits only of
        columns ``logits_from[r]:high[r]`` (left-aligned): the columns before are forwarded only
        to be written into the cache."""
        storage, slot, in_place, logits_from = cached.storage, cached.slot, cached.in_place, cached.logits_from
        first = self._forwarded(low, high)
        length = int((high - first).max())
        offset = torch.arange(length)
        column = first[:, None] + offset[None, :]
        valid = column < high[:, None]
        positions = pattern.positions(attention_mask)
        if self.attention_block is None:
            cache_visible, fresh_visible = pattern.window_visibility(attention_mask, first, high, length)
        else:  # the exact block cache: only the columns before the forwarded ones are read from it
            cache_visible, fresh_visible = pattern.block_window_visibility(
                attention_mask, first, high, length, self.attention_block
            )
        window = storage.window(slot, torch.where(valid, column, -1), cache_visible, fresh_visible, in_place)
        inside = column.clamp(max=tokens.shape[1] - 1)
        assert logits_from is None or not self.shift_logits, "logits_from is for unshifted models (the block cache)"
        head_from = (
            () if logits_from is None else (logits_from - first,)
        )  # only where asked: a module's run_cached may not take it
        raw = self.module.run_cached(
            tokens.gather(1, inside).to(self.device), positions.gather(1, inside).to(self.device), window, *head_from
        )
        raw = raw[..., : self.vocab_size].float()
        if logits_from is not None:
            return raw[:, : int((high - logits_from).max())]
        if self.shift_logits:  # column c reads query c - 1 (the window's first column its own, at the canvas's start)
            read = ((low[:, None] + offset[None, : int((high - low).max())]) - 1 - first[:, None]).clamp(min=0)
            raw = raw.gather(1, read.to(raw.device)[..., None].expand(-1, -1, raw.shape[-1]))
        return raw[:, : int((high - low).max())]

    @torch.no_grad()
    def layerwise_logits(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        low: torch.Tensor,
        high: torch.Tensor,
        rule: LayerRule,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Float32 logits ``[rows, max(high - low), vocab_size]`` of each row's columns ``low:high``
        (left-aligned) from the layerwise forward of the whole canvas under ``rule`` (an adaptive
        KV cache's per-layer choices), which of them are current, and the columns each row
        recomputed per layer ``[rows, layers]``. A shifted model's column reads its left neighbour's query."""
        first = self._forwarded(low, high)
        raw, read, recomputed = layerwise_logits(
            self.module,
            tokens.to(self.device),
            attention_mask.bool().to(self.device),
            rule,
            first.to(self.device),
            high.to(self.device),
        )
        raw = raw[..., : self.vocab_size].float()
        length = int((high - low).max())
        if self.shift_logits:  # column c reads query c - 1 (the canvas's first column its own)
            read_at = ((low[:, None] + torch.arange(length)[None, :]) - 1 - first[:, None]).clamp(min=0).to(raw.device)
            raw = raw.gather(1, read_at[..., None].expand(-1, -1, raw.shape[-1]))
            read = read.gather(1, read_at)
        return raw[:, :length], read[:, :length].cpu(), recomputed.cpu()

    @torch.no_grad()
    def shadow_logits(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        low: int | torch.Tensor,
        high: int,
        block_start: torch.Tensor,
        block_length: int,
        cached: CachedRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list | None]:
        """Logits of columns ``low:high`` and of a *shadow* of each row's block in the same forward
        (WINO): ``block_length`` mask tokens appended at the positions of the block's columns
        ``block_start[r] + j``. Canvas queries see the canvas only (the canvas logits are the plain
        forward's); shadow query ``j`` sees every shadow slot and the canvas except its own mirror
        column, so it predicts the token there from everything else. With ``cached`` (a prefix
        cache and the rows' slots; ``high`` is the canvas's end) only each row's window
        ``low[r]:`` and the shadow are forwarded, against its cached columns before it; without,
        ``low`` is one column for all rows.

        Args:
            tokens: ``[R, T]`` the rows' canvases.
            attention_mask: ``[R, T]`` which columns are real (not padding).
            low: the first canvas column read (``[R]`` per row, or one for all rows).
            high: the end of the canvas columns read.
            block_start: ``[R]`` each row's block's first column (the shadow's mirror).
            block_length: the block's columns (the shadow's length).
            cached: the rows' cached keys and values (a prefix cache and the rows' slots), or None.

        Returns:
            The canvas logits ``[R, n, V]`` (left-aligned per row), the shadow's ``[R, block_length,
            V]``, and the canvas's keys and values (a full forward's, for refreshing a cache; None
            with ``cached``, or where the module keeps none).
        """
        if not self.capabilities.shadow:
            raise ValueError(
                f"{type(self.module).__name__} cannot run a shadow block (it takes no explicit attention mask, or its logits are shifted)"
            )
        rows, width = tokens.shape
        low = torch.as_tensor(low).expand(rows)
        real = attention_mask.bool()
        positions = pattern.positions(real)
        mirror = block_start[:, None] + torch.arange(block_length)[None, :]  # [R, B] canvas columns
        shadow_positions = positions.gather(1, mirror)
        shadow_tokens = torch.full((rows, block_length), self.mask_id)
        if cached is not None:
            store, slot, in_place = cached.storage, cached.slot, cached.in_place
            length = int((width - low).max())
            column = low[:, None] + torch.arange(length)[None, :]
            valid = column < width
            inside = column.clamp(max=width - 1)
            cache_visible, fresh_visible = pattern.shadow_window_visibility(real, low, mirror, length)
            window = store.window(
                slot,
                torch.cat([torch.where(valid, column, -1), torch.full((rows, block_length), -1)], dim=1),
                cache_visible,
                fresh_visible,
                in_place,
            )
            ids = torch.cat([tokens.gather(1, inside), shadow_tokens], dim=1).to(self.device)
            at = torch.cat([positions.gather(1, inside), shadow_positions], dim=1).to(self.device)
            raw = self.module.run_cached(ids, at, window)[..., : self.vocab_size].float()
            return raw[:, :length], raw[:, length:], None
        start = int(low[0])
        if not bool((low == start).all()):
            raise ValueError("a shadow block without a cache needs one first column for all rows")
        attention, query_positions = pattern.shadow_layout(real, mirror)
        extended = torch.cat([tokens, shadow_tokens], dim=1).to(self.device)
        query_positions = query_positions.to(self.device)
        module = self.module
        if self.features.kv_cache:
            raw, fresh = module.run(
                extended, None, start, attention=attention.to(self.device), positions=query_positions
            )
            canvas_logits, shadow = raw[:, : high - start], raw[:, width - start :]
            kv = [(k[:, :, :width], v[:, :, :width]) for k, v in fresh]
        else:
            raw = module(extended, attention=attention.to(self.device), positions=query_positions)
            canvas_logits, shadow, kv = raw[:, start:high], raw[:, width:], None
        return canvas_logits[..., : self.vocab_size].float(), shadow[..., : self.vocab_size].float(), kv
