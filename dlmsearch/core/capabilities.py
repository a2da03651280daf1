"""What a model can do, declared once: the record the engine, the plan and the driver read
instead of probing the module.

A module states its features in one class attribute, ``features`` (:class:`ModuleFeatures`; a
module without one, such as a checkpoint's own remote code, has none of them); the adapter
combines them with the checkpoint's ids into :class:`ModelCapabilities`.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class ModuleFeatures:
    """What a model body's forward offers beyond ``module(input_ids, attention_mask=...)``."""

    kv_cache: bool = False  # run() returns keys and values; run_cached() forwards columns against stored ones
    explicit_attention: bool = False  # takes an explicit attention mask and positions (WINO's shadow block)
    logits_from: bool = False  # applies its vocabulary head only from a given column on
    compiles: bool = False  # compile_blocks(): its per-token work under torch.compile
    layerwise: bool = (
        False  # its blocks' weights can run the layerwise forward (models/layerwise.py: adaptive KV caches)
    )


NO_FEATURES = ModuleFeatures()


def open_marker(mask_id: int | None, vocab_size: int) -> int:
    """The id a decode writes at an open position (``Canvas.masked``): the model's mask token, or,
    for a model without one, one past the vocabulary, which the model never reads (the adapter fills
    those positions itself before every call: ``ModelAdapter.materialise``)."""
    return vocab_size if mask_id is None else mask_id


@attrs.frozen
class ModelCapabilities:
    """A loaded model's vocabulary, ids and the decoding machinery it supports."""

    name: str  # the module's class, for messages
    vocab_size: int
    mask_id: int | None  # the mask token (None: the model has none; it fills open positions otherwise)
    stop_ids: tuple[int, ...]  # tokens that end an answer (EOS first)
    max_length: int | None
    cache_policies: tuple[str, ...]  # the cache= policies it can run
    shadow: bool  # WINO's shadow block in the same forward (explicit attention, unshifted logits)
    shift_logits: bool  # logits at column i predict token i + 1 (AR-initialised: Dream)
    honours_padding: bool  # False: rows are forwarded unpadded, grouped by prompt length
    compiles: bool  # engine.compile=true
    attention_block: int | None = (
        None  # block diffusion (SDAR, LLaDA2.x): block-causal attention over blocks of this size
    )
    layerwise: bool = (
        False  # the layerwise cache policies (dllm_cache, d2cache, elastic, dkv): a native full-attention model
    )
    # "mask": positions to fill hold the mask token; "uniform": they hold uniform random ids that every step
    # re-decides (DiffusionGemma, no mask token)
    noise: str = "mask"
    canvas_length: int | None = None  # a uniform-noise model's canvas: it denoises this many columns at a time
    # an encoder-decoder model (DiffusionGemma): its decoder reads a prefix its encoder wrote, so it runs the
    # encoder-prefix cache (cache=auto, and cache=none) and no other
    encoder: bool = False
    # the settings of the model's own step where it has one (DiffusionGemma: UniformNoiseSteps' fields from its
    # generation config), as (field, value) pairs: what replaces a preset's rule that fills masks
    step_settings: tuple[tuple[str, Any], ...] = ()
    media_ids: tuple[
        int, ...
    ] = ()  # ids that stand for image or audio inputs, which dlmsearch does not feed (text only)
    # processes the model is sharded over (model.tensor_parallel; 1: whole in this one): the plan refuses
    # what cannot run sharded (a layerwise cache's per-layer choices, engine.compile's graphs)
    tensor_parallel: int = 1

    @property
    def open_id(self) -> int:
        """The id a decode writes at an open position (:func:`open_marker`)."""
        return open_marker(self.mask_id, self.vocab_size)
