"""A tiny text-only DiffusionGemma built from transformers' own classes (issue 37's parity groundwork).

A helper module, not a test module: tests import it as ``diffusion_gemma_models`` (``tests/`` is on
``sys.path`` under pytest). :func:`tiny_diffusion_gemma` constructs a
``DiffusionGemmaForBlockDiffusion`` (transformers 5.25,
``transformers/models/diffusion_gemma/modeling_diffusion_gemma.py``) from
``DiffusionGemmaTextConfig`` / ``DiffusionGemmaConfig`` with deterministic, sharp weights, and writes
it with ``save_pretrained`` when given a directory (pytest's tmp directories only; no checkpoint is
committed). ``tests/diffusion_gemma_reference.py`` runs transformers' ``generate`` on it.

The tiny model (:data:`VOCAB` 96 ids, :data:`CANVAS` 8, hidden 32, 3 layers: sliding, sliding,
full; 4 query heads of 8 dims, 2 key/value heads on sliding layers; the full layer has its own head
dim 16 and 1 key/value head; sliding window 6; ``moe=True``: 4 experts of 16, top 2, else one), and
what of the config matters to a reimplementation:

* **Two passes, one set of weights.** ``DiffusionGemmaModel`` holds an encoder
  (``DiffusionGemmaEncoderModel``: a Gemma-4 text stack plus a vision tower) and a decoder
  (``DiffusionGemmaDecoderModel``). Its ``_tied_weights_keys`` tie every text-layer weight, the
  final norm and the token embedding of the two; ``lm_head`` is tied to the decoder's embedding
  (``tie_word_embeddings=True``; ``False`` unties *everything*, so it is left on). Only the decoder
  has ``self_conditioning`` (pre-norm, gated MLP, post-norm without scale). The vision tower always
  exists (``AutoModel.from_config(vision_config)``); here it is a 1-layer, 16-wide Gemma-4 vision
  config that text-only decoding never runs, and the image/boi/eoi ids are moved into the tiny
  vocabulary's top ids (93-95), which prompts here never use.
* **Every layer runs a dense MLP and an MoE branch side by side** and adds them
  (``DiffusionGemmaEncoderTextLayer.forward``: ``post_feedforward_layernorm_1(mlp)`` +
  ``post_feedforward_layernorm_2(experts)``), so ``num_experts`` cannot be None. ``moe=True``: 4
  experts, top 2 (softmax router over an RMS-normed, ``scale``d input, top-k weights renormalised,
  times ``per_expert_scale``); ``moe=False``: one expert, always chosen with weight 1 (no routing:
  a second dense MLP of ``moe_intermediate_size``).
* **Sliding window.** ``layer_types`` mixes ``sliding_attention`` and ``full_attention`` (the last
  layer is forced to full). ``use_bidirectional_attention="all"`` replaces ``sliding_window`` by
  ``sliding_window // 2 + 1`` in ``DiffusionGemmaTextConfig.__post_init__`` (``to_dict`` writes
  back ``(w - 1) * 2``, so a saved config round-trips) and makes the *encoder's* attention
  non-causal wherever its mask is skipped (``is_causal = use_bidirectional_attention != "all"``);
  ``"vision"`` (the default here) or None leave both alone. Under sdpa, transformers 5.25's
  ``generate`` fails with ``"all"`` (the config's ``is_causal=False`` reaches the attention call as
  a keyword while the layer passes ``is_causal`` itself): only the config side is usable here. The ``DynamicCache`` keeps only the
  last ``sliding_window - 1`` keys/values on sliding layers (``DynamicSlidingWindowLayer``), so the
  decoder's keys there are those plus the canvas. :func:`tiny_diffusion_gemma` takes
  ``sliding_window`` as the config's *resolved* value (what the layers use), i.e. it passes
  ``(sliding_window - 1) * 2`` to the config under ``"all"``.
* **Partial rotary and per-layer heads.** Full layers use ``rope_type="proportional"`` with
  ``partial_rotary_factor=0.25`` and theta 1e6, and their own ``global_head_dim`` /
  ``num_global_key_value_heads`` (``per_layer_config``); sliding layers use default RoPE, theta 1e4.
  Full layers have no ``v_proj``: values are the keys' projection (``value_states = key_states``
  before the norms). Attention ``scaling`` is 1.0 (q and k are RMS-normed per head instead);
  ``v_norm`` has no scale.
* **Final logit soft-capping.** ``DiffusionGemmaForBlockDiffusion.forward`` casts the head's
  output to float32 and returns ``30 * tanh(logits / 30)`` (``final_logit_softcapping``): no
  logit leaves (-30, 30).
* **Embedding scale.** Token embeddings are multiplied by ``sqrt(hidden_size)``
  (``DiffusionGemmaTextScaledWordEmbedding``), the self-conditioning soft embedding
  (``softmax(logits) @ embed_tokens.weight``) too.
* **Special ids.** ``pad_token_id`` :data:`PAD` 0 (also the embedding's ``padding_idx``),
  ``eos_token_id`` :data:`EOS` 1, ``bos_token_id`` :data:`BOS` 2. ``model.generation_config``
  (a ``DiffusionGemmaGenerationConfig``) starts empty: ``generate`` neither stops at EOS nor pads
  unless the ids are given there or as keywords, so the builder sets them on it (``save_pretrained``
  writes them to ``generation_config.json``).

**Sharp logits.** transformers' own initialisation (N(0, 0.02)) gives near-uniform outputs over
the vocabulary whose entropies and argmaxes tie. The builder draws every parameter afresh from
``torch.Generator().manual_seed(seed)`` in ``named_parameters()`` order (tied weights appear once):
matrices and expert tensors N(0, 1/fan_in), the token embedding (= the head) N(0, 1), every 1-D
parameter (norm weights, router ``scale``/``per_expert_scale``) 1, other tensors (the unused vision
position table) N(0, 1). The final norm's weight (shared by encoder and decoder; only the decoder's
output reaches the head) is then ``sharpness`` (default 1): with a unit-RMS hidden state and N(0, 1)
head rows the raw logits' standard deviation is about ``sharpness * sqrt(32)`` ~ 5.7, mostly below
the soft cap, and at the schedule's temperatures (0.4-0.8) per-position entropies spread from ~0 to
~2 nats: an entropy bound of 1e-3 keeps one or two positions per step on average, 0.1 about half
the canvas, 2 nearly all of it (measured by the tests). EOS (and PAD, an ordinary id) come out as
argmax now and then without help.
``eos_gain`` scales the EOS row of the embedding (= its head row), making EOS the argmax more often
(1: untouched).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

VOCAB, CANVAS = 96, 8
PAD, EOS, BOS = 0, 1, 2
IMAGE, BOI, EOI = 95, 93, 94  # inside the tiny vocabulary; text-only prompts never use them
LAYER_TYPES = ("sliding_attention", "sliding_attention", "full_attention")


def _config(*, moe: bool, sliding_window: int, use_bidirectional_attention: str | None, canvas_length: int):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaTextConfig, Gemma4VisionConfig

    window = (sliding_window - 1) * 2 if use_bidirectional_attention == "all" else sliding_window
    text = DiffusionGemmaTextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        global_head_dim=16,
        num_global_key_value_heads=1,
        layer_types=list(LAYER_TYPES),
        sliding_window=window,
        use_bidirectional_attention=use_bidirectional_attention,
        num_experts=4 if moe else 1,
        top_k_experts=2 if moe else 1,
        moe_intermediate_size=16,
        max_position_embeddings=512,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
    )
    assert text.sliding_window == sliding_window, (text.sliding_window, sliding_window)
    vision = Gemma4VisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        position_embedding_size=16,
    )
    config = DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=canvas_length,
        image_token_id=IMAGE,
        boi_token_id=BOI,
        eoi_token_id=EOI,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=BOS,
    )
    config._attn_implementation = "sdpa"
    return config


def _sharpen(model: torch.nn.Module, *, seed: int, sharpness: float, eos_gain: float) -> None:
    """Every parameter drawn afresh (see the module docstring), then the final norm and EOS row."""
    generator = torch.Generator().manual_seed(seed)
    embedding = model.get_input_embeddings().weight
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param is embedding:
                param.copy_(torch.randn(param.shape, generator=generator))
            elif param.dim() == 1:
                param.fill_(1.0)
            elif (name.endswith(".weight") and param.dim() == 2) or "experts." in name:
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[-1]))
            else:
                param.copy_(torch.randn(param.shape, generator=generator))
        model.model.decoder.norm.weight.fill_(sharpness)
        embedding[EOS].mul_(eos_gain)
    for weight in (model.model.encoder.language_model.norm.weight, model.lm_head.weight):
        assert weight.data_ptr() in (model.model.decoder.norm.weight.data_ptr(), embedding.data_ptr()), "untied"


def tiny_diffusion_gemma(
    directory: Path | None = None,
    *,
    moe: bool = False,
    sliding_window: int = 6,
    use_bidirectional_attention: str | None = "vision",
    canvas_length: int = CANVAS,
    sharpness: float = 1.0,
    eos_gain: float = 1.0,
    seed: int = 0,
):
    """A tiny ``DiffusionGemmaForBlockDiffusion`` in float32, eval mode, sdpa attention.

    Args:
        directory: where ``save_pretrained`` writes it (with ``generation_config.json``); None: not written.
        moe: 4 experts, top 2 (True) or a single always-chosen expert (False).
        sliding_window: the sliding layers' window as the layers use it (after the halving that
            ``use_bidirectional_attention="all"`` applies; the cache keeps ``sliding_window - 1``).
        use_bidirectional_attention: the text config's field ("vision", "all" or None).
        canvas_length: the canvas (block) length.
        sharpness: the final norm's weight: the logits' scale before soft-capping.
        eos_gain: multiplies the EOS row of the tied embedding/head.
        seed: the weights' generator seed.
    """
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    config = _config(
        moe=moe,
        sliding_window=sliding_window,
        use_bidirectional_attention=use_bidirectional_attention,
        canvas_length=canvas_length,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # construction draws from the global generator; everything is redrawn below
        model = DiffusionGemmaForBlockDiffusion(config)
    _sharpen(model, seed=seed, sharpness=sharpness, eos_gain=eos_gain)
    model.generation_config = DiffusionGemmaGenerationConfig(eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS)
    model = model.eval()
    if directory is not None:
        model.save_pretrained(directory)
    return model


def load_tiny(directory: Path):
    """The model :func:`tiny_diffusion_gemma` wrote, read back with ``from_pretrained`` (float32, sdpa)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    return DiffusionGemmaForBlockDiffusion.from_pretrained(directory, attn_implementation="sdpa").eval()


def tiny_adapter(model, **kwargs):
    """The adapter over a tiny model as the tests decode it: no mask token, EOS
    the stop id, PAD the padding (``kwargs``: e.g. ``dtype``)."""
    from dlmsearch.models.diffusion_gemma import DiffusionGemmaAdapter

    vocab = model.config.get_text_config().vocab_size
    return DiffusionGemmaAdapter(
        module=model,
        mask_id=None,
        vocab_size=vocab,
        stop_ids=[EOS],
        canvas_length=model.config.canvas_length,
        pad_id=PAD,
        **kwargs,
    )
