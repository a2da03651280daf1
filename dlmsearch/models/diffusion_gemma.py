"""DiffusionGemma (uniform-noise block diffusion) through transformers' own modules.

transformers (>= 5.25) ships the model (``transformers.models.diffusion_gemma``): one set of Gemma-4
weights run as an *encoder* (causal over the prompt and every finished canvas, writing a KV cache)
and as a *decoder* (bidirectional over the current canvas, reading that cache, with a
self-conditioning input). dlmsearch runs both modules as they are; this adapter only decides
what each call sees, so that a row's logits do not depend on its batch:

* **encoder calls** run one slot at a time against the slot's own ``DynamicCache`` (the reference
  loop's calls for one prompt, unchanged), once per finished canvas;
* **decoder calls** stack the rows' cached prefixes left-padded into one read-only prefix and
  pass the 4-D masks themselves (each row sees its own prefix and canvas; on sliding layers the last
  ``sliding_window - 1`` cached columns, as ``DynamicSlidingWindowLayer`` keeps them), with each
  row's own positions;
* attention runs through transformers' ``sdpa_attention_forward`` registered under its own name
  (``AttentionInterface``), with its sums in float64 on CPU, for the reason
  :func:`~dlmsearch.models.token_ops.attend` gives (the keys a batch pads in would reassociate them);
* the routed experts run through transformers' ``batched_mm`` on CPU, registered under its own name
  (``ExpertsInterface``, :func:`exact_experts`): its default ``grouped_mm`` multiplies each expert's
  tokens as one matrix, whose row count is the batch's, and a row's sums moved with it (every
  decoder logit by up to ~2e-5 beside batch-mates), so a sampled draw near a boundary, or an
  entropy near the keep-set's bound, decided differently batched and alone.

There is no mask token. A position the next step may replace is *open*: the call carries which
positions are open, and :meth:`DiffusionGemmaAdapter.materialise` fills each with its keyed uniform
id (``min(floor(u * V), V - 1)``, ``u`` the position's draw on the re-noising stream, float64), so a
row's canvas never depends on its batch. The per-slot stores the two modules need (the encoded
prefixes, the self-conditioning memory) are the engine's
(:mod:`dlmsearch.search.engine.encoder_prefix`); this adapter reads and extends them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from dlmsearch.core import attention as pattern
from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.kv_storage import EncodedPrefixes, PrefixRead
from dlmsearch.models.loading import _json_object

EXACT_ATTENTION = "dlmsearch_exact"  # the name transformers' AttentionInterface knows dlmsearch's attention by
EXACT_EXPERTS = "dlmsearch_exact"  # the name transformers' ExpertsInterface knows dlmsearch's routed experts by


def exact_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
):
    """transformers' sdpa attention with its reductions in float64 on CPU, rounded back (decoding
    only: on CUDA or with gradients it runs as it is).

    Args:
        module: the attention layer (transformers passes it).
        query: ``[batch, heads, queries, head_dim]``.
        key: ``[batch, kv_heads, keys, head_dim]``.
        value: ``[batch, kv_heads, keys, head_dim]``.
        args: the attention mask, then sdpa's other positional arguments.
        kwargs: sdpa's keywords (``scaling``, ``is_causal``, ``sliding_window``, ...).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type != "cpu" or torch.is_grad_enabled():
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)
    mask = args[0] if args else kwargs.pop("attention_mask", None)
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    output, weights = sdpa_attention_forward(
        module, query.double(), key.double(), value.double(), mask, *args[1:], **kwargs
    )
    return output.to(query.dtype), weights


def exact_experts(
    module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' routed experts with each token's products its own on CPU (``batched_mm``: one
    small matrix product per token and expert, whatever else the call holds); decoding only: on
    CUDA or with gradients transformers' default ``grouped_mm`` runs as it is (see the module docstring).

    Args:
        module: the experts layer (transformers passes it).
        hidden_states: ``[tokens, hidden]``.
        top_k_index: ``[tokens, k]`` each token's experts.
        top_k_weights: ``[tokens, k]`` their weights.
    """
    from transformers.integrations.moe import batched_mm_experts_forward, grouped_mm_experts_forward

    if hidden_states.device.type != "cpu" or torch.is_grad_enabled():
        return grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    return batched_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)


def register_exact_experts() -> str:
    """Register :func:`exact_experts` with transformers' ``ExpertsInterface``; its name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(EXACT_EXPERTS, exact_experts)
    return EXACT_EXPERTS


def register_exact_attention() -> str:
    """Register :func:`exact_attention` (and sdpa's masks under the same name) with transformers; its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(EXACT_ATTENTION, exact_attention)
    AttentionMaskInterface.register(EXACT_ATTENTION, sdpa_mask)
    return EXACT_ATTENTION


@attrs.frozen
class _PrefixLayer:
    keys: torch.Tensor
    values: torch.Tensor


def _left_padded(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    """Each row's ``[1, kv_heads, n, dim]`` cached keys (or values), zero-padded on the left to ``width`` and stacked."""
    return torch.cat([F.pad(part, (0, 0, width - part.shape[-2], 0)) for part in parts])


@attrs.frozen
class _StackedPrefix:
    """What the decoder reads from ``cache``: per layer the rows' cached keys and values, left-padded (read only)."""

    layers: list[_PrefixLayer]
    is_compileable: bool = False

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].keys.shape[-2]


@attrs.define(eq=False)
class DiffusionGemmaAdapter(ModelAdapter):
    """A ``DiffusionGemmaForBlockDiffusion`` behind dlmsearch's model boundary (see the module docstring)."""

    canvas_length: int = 0
    pad_id: int = 0

    def __attrs_post_init__(self) -> None:
        self.module.config._attn_implementation = register_exact_attention()
        text = self.module.config.get_text_config()
        text._attn_implementation = EXACT_ATTENTION
        self.module.set_experts_implementation(register_exact_experts())
        super().__attrs_post_init__()
        self.capabilities = attrs.evolve(
            self.capabilities,
            name="DiffusionGemma",
            noise="uniform",
            canvas_length=self.canvas_length,
            media_ids=self._media_ids(),
            cache_policies=("encoder",),
            encoder=True,
            shadow=False,
            layerwise=False,
            step_settings=tuple(step_settings(self.module.generation_config.to_dict()).items()),
        )

    def _check_ids(self) -> None:
        """No mask token: nothing may claim one (open positions hold keyed noise: :meth:`materialise`)."""
        if self.mask_id is not None:
            raise ValueError(f"DiffusionGemma has no mask token: model.mask_id must be null, got {self.mask_id}")

    def _media_ids(self) -> tuple[int, ...]:
        """The ids that stand for image or audio inputs in this vocabulary (Gemma's image, begin- and end-of-image tokens)."""
        config = self.module.config
        names = ("image_token_id", "boi_token_id", "eoi_token_id", "audio_token_id", "boa_token_id", "eoa_token_id")
        found = (getattr(config, name, None) for name in names)
        return tuple(sorted({i for i in found if isinstance(i, int) and 0 <= i < self.vocab_size}))

    @property
    def never_proposed(self) -> list[int]:
        """No mask token: only suppressed ids are never proposed."""
        return list(self.suppressed_ids)

    @property
    def sliding_window(self) -> int | None:
        return getattr(self.module.config.get_text_config(), "sliding_window", None)

    def _layer_types(self) -> list[str]:
        return list(self.module.config.get_text_config().layer_types)

    def materialise(
        self, tokens: torch.Tensor, open_: torch.Tensor, uniform: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """Uniform noise: each open position holds its keyed random id ``min(floor(u * V), V - 1)``
        (``uniform()``: the positions' float64 draws, made only where some position is open)."""
        if not bool(open_.any()):
            return tokens
        ids = torch.floor(uniform() * self.vocab_size).long().clamp(max=self.vocab_size - 1)
        return torch.where(open_, ids, tokens)

    @torch.no_grad()
    def cached_logits(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        low: torch.Tensor,
        high: torch.Tensor,
        cached: PrefixRead,  # type: ignore[override]  (the encoder-prefix cache's read, not key/value storage)
    ) -> torch.Tensor:
        """The decoder's float32 logits ``[rows, L, V]`` of each row's canvas (columns ``low[r]`` on,
        ``L`` the canvas length), against what ``cached`` holds: its slot's encoded prefix and its self-conditioning input."""
        columns = low[:, None] + torch.arange(self.canvas_length)[None, :]
        at = pattern.positions(attention_mask).gather(1, columns)
        return self.denoise(tokens.gather(1, columns), at, cached.prefixes, cached.slot, cached.conditioning)

    @torch.no_grad()
    def encode(
        self, prefixes: EncodedPrefixes, slot: int, tokens: torch.Tensor, positions: torch.Tensor, end: int
    ) -> None:
        """One encoder call for one slot: ``tokens`` (``[n]``, at ``positions``) appended to its cached prefix, which then ends at column ``end``."""
        from transformers import DynamicCache

        cache = prefixes.caches[slot]
        if cache is None:
            cache = DynamicCache(config=self.module.config.get_text_config(decoder=True))
        self.module.model.encoder(
            input_ids=tokens[None].to(self.device), cache=cache, position_ids=positions[None].to(self.device)
        )
        prefixes.caches[slot] = cache
        prefixes.end[slot] = end

    @torch.no_grad()
    def denoise(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        prefixes: EncodedPrefixes,
        slot: torch.Tensor,
        conditioning: tuple[torch.Tensor | None, torch.Tensor],
    ) -> torch.Tensor:
        """One decoder call: float32 logits ``[rows, L, V]`` of the canvases ``tokens [rows, L]`` at
        ``positions [rows, L]``, each against its slot's encoded prefix, with its self-conditioning
        logits (``conditioning``: the logits or None, and ``[rows]`` which rows have them)."""
        caches = [prefixes.caches[s] for s in slot.tolist()]
        if any(c is None for c in caches):
            raise AssertionError("a row's prefix was not encoded before its decoder call")
        rows, length = tokens.shape
        layers, masks = [], {}
        for index, layer_type in enumerate(self._layer_types()):
            parts = [c.layers[index] for c in caches]
            cached = torch.tensor([p.keys.shape[-2] for p in parts])
            width = int(cached.max())
            layers.append(
                _PrefixLayer(
                    _left_padded([p.keys for p in parts], width), _left_padded([p.values for p in parts], width)
                )
            )
            if layer_type not in masks:  # the layers of one type hold the same cached columns
                visible = torch.arange(width + length)[None, :] >= (width - cached)[:, None]
                masks[layer_type] = visible[:, None, None, :].expand(rows, 1, length, width + length).to(self.device)
        logits, has = conditioning
        if logits is not None:
            logits = torch.where(has.to(logits.device)[:, None, None], logits, 0)
        out = self.module(
            decoder_input_ids=tokens.to(self.device),
            cache=_StackedPrefix(layers),
            self_conditioning_logits=logits,
            self_conditioning_mask=None if logits is None or bool(has.all()) else has.to(self.device),
            decoder_attention_mask=masks,
            decoder_position_ids=positions.to(self.device),
        )
        return out.logits[..., : self.vocab_size].float()


def _checkpoint_directory(path: str | None) -> Path:
    """The checkpoint's directory, checked to hold a ``model_type: diffusion_gemma`` config.json."""
    if path in (None, "", "???"):
        raise ValueError(
            "model.path is required: the local directory of the DiffusionGemma checkpoint (the Hub is never contacted)"
        )
    directory = Path(str(path)).expanduser()
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"model.path={directory}: no config.json there (a DiffusionGemma checkpoint directory is expected)"
        )
    model_type = _json_object(config_path).get("model_type")
    if model_type != "diffusion_gemma":
        raise ValueError(
            f"{config_path} has model_type={model_type!r}; model=diffusion_gemma loads model_type 'diffusion_gemma'"
        )
    return directory


def checkpoint_fields(path: str | None) -> dict[str, Any]:
    """What a DiffusionGemma directory declares, for its config (``${diffusion_gemma:KEY}``):
    ``vocab_size``, ``canvas_length``,
    ``stop_ids`` (generation_config.json's ``eos_token_id``, else config.json's) and ``pad_id``."""
    directory = _checkpoint_directory(path)
    config = _json_object(directory / "config.json")
    text = config.get("text_config") or {}
    if config.get("vision_config") and not text:
        raise ValueError(
            f"{directory / 'config.json'} has vision weights but no text_config: dlmsearch decodes DiffusionGemma's "
            "text model, which this checkpoint does not describe"
        )
    generation = _json_object(directory / "generation_config.json")
    vocab = text.get("vocab_size", config.get("vocab_size"))
    eos = generation.get("eos_token_id", text.get("eos_token_id", config.get("eos_token_id")))
    pad = generation.get("pad_token_id", text.get("pad_token_id", config.get("pad_token_id")))
    return {
        "vocab_size": vocab,
        "canvas_length": config.get("canvas_length"),
        "stop_ids": [eos] if isinstance(eos, int) else list(eos or []),
        "pad_id": 0 if pad is None else pad,
    }


def load_diffusion_gemma(
    path: str | None,
    device: str = "auto",
    dtype: str = "auto",
    vocab_size: int | None = None,
    mask_id: int | None = None,
    stop_ids: list[int] | None = None,
    block_length: int | None = None,
    tensor_parallel: int = 1,
) -> DiffusionGemmaAdapter:
    """A local ``model_type: diffusion_gemma`` checkpoint through transformers' own classes (the Hub
    is never contacted): its ids and ``canvas_length`` from its ``config.json`` /
    ``generation_config.json`` (:func:`checkpoint_fields`; a value given here must agree). Text only.

    Args:
        path: the checkpoint's local directory.
        device: ``cpu``, ``cuda``, ... or ``auto``.
        dtype: ``float32``, ``bfloat16`` or ``auto`` (bfloat16 on CUDA).
        vocab_size: the vocabulary (the checkpoint's).
        mask_id: None: DiffusionGemma has no mask token (a given id is refused).
        stop_ids: the ids that end an answer (the checkpoint's EOS).
        block_length: the canvas (the checkpoint's ``canvas_length``).
        tensor_parallel: processes (of torchrun's) the text layers are sharded over
            (:func:`~dlmsearch.models.tensor_parallel.parallelize_diffusion_gemma`); 1: whole in this process.
    """
    import sys

    from transformers import DiffusionGemmaForBlockDiffusion

    from dlmsearch.models.loading import _plain, resolve_device
    from dlmsearch.models.tensor_parallel import join, parallelize_diffusion_gemma

    if mask_id is not None:
        raise ValueError(f"model.mask_id={mask_id}: DiffusionGemma has no mask token (leave model.mask_id null)")
    fields = checkpoint_fields(path)
    given = {"vocab_size": vocab_size, "stop_ids": stop_ids, "canvas_length": block_length}
    for key, value in given.items():
        if value is not None and _plain(value) != fields[key]:
            raise ValueError(f"model.{key}={_plain(value)} but the checkpoint in {path} has {fields[key]}")
    group = join(tensor_parallel)
    device, dtype = resolve_device(device, dtype)
    module = DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(_checkpoint_directory(path)), local_files_only=True, dtype=getattr(torch, dtype), attn_implementation="sdpa"
    )
    if group is not None:
        module = module.to(device)
        for what in parallelize_diffusion_gemma(module, group):
            if group.rank == 0 and int(os.environ.get("RANK", "0")) == 0:
                print(f"model.tensor_parallel={tensor_parallel}: {what} stay replicated", file=sys.stderr)
        module.tensor_parallel = group  # as shard_model marks a native model: the adapter's capabilities read it
    return DiffusionGemmaAdapter(
        module=module,
        mask_id=None,
        vocab_size=fields["vocab_size"],
        device=device,
        dtype=dtype,
        max_length=getattr(module.config.get_text_config(), "max_position_embeddings", None),
        stop_ids=fields["stop_ids"],
        generation_defaults=Sampling(),  # its temperature is a schedule: the decoder's
        canvas_length=fields["canvas_length"],
        pad_id=int(fields["pad_id"]),
    )


# The model's own step (UniformNoiseSteps' fields): where generation_config.json names each, and transformers'
# default where it does not. ``decoder/commit=uniform_noise`` and a preset whose rule fills masks (the plan's
# ``with_model_parts``) both read these, so a checkpoint's decoding settings travel with its weights.
STEP_SETTINGS: dict[str, tuple[str, Any]] = {
    "entropy_bound": ("sampler_config.entropy_bound", 0.1),
    "max_steps": ("max_denoising_steps", 48),
    "t_min": ("t_min", 0.4),
    "t_max": ("t_max", 0.8),
    "stability_threshold": ("stability_threshold", 1),
    "confidence_threshold": ("confidence_threshold", 0.005),
}


def step_settings(generation_config: dict[str, Any]) -> dict[str, Any]:
    """UniformNoiseSteps' settings from a generation config (a dotted key reads a nested one, a dict as
    the JSON file holds it or a dataclass as transformers loads it; a missing or null key takes
    transformers' default, as transformers' "unset")."""
    found: dict[str, Any] = {}
    for field, (key, default) in STEP_SETTINGS.items():
        value: Any = generation_config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
        found[field] = default if value is None else value
    return found


def checkpoint_step_settings(path: str | None) -> dict[str, Any]:
    """:func:`step_settings` of the ``generation_config.json`` in the directory ``path`` (none: the defaults)."""
    file = Path(str(path)).expanduser() / "generation_config.json" if path not in (None, "", "???") else None
    return step_settings(_json_object(file) if file is not None and file.is_file() else {})
