"""Tiny random-weight LLaDA and Dream checkpoints, built with the families' own upstream code.

Helper module for the parity tests (not a test file). The reference implementations live
read-only in ``../shared/upstream/fast-dllm`` (Fast-dLLM at a pinned commit, see its README):
they are imported from there by ``tests/upstream.py`` (which the engine benchmark uses too),
never copied into this repository. Where that directory is absent
(a user checkout), tests marked :data:`requires_upstream` are skipped with the reason.

What this module provides:

* :func:`build_llada`, :func:`build_dream`: construct the upstream ``LLaDAModelLM`` /
  ``DreamModel`` directly from their config classes (no ``from_pretrained``), in float32, with
  deterministic random weights adjusted as described in :func:`_adjust_weights` (the mask token
  has probability exactly 0; confidences spread over (0, 1)), and write a Hugging Face style
  model directory: ``config.json`` (``model_type``, ``architectures``, ``auto_map`` and every
  config field), ``generation_config.json`` and safetensors weights named exactly as the
  upstream ``state_dict()`` (one ``model.safetensors``, or ``model-0000i-of-0000N.safetensors``
  shards plus ``model.safetensors.index.json``).
* :func:`llada_generate`, :func:`llada_generate_cached`: upstream ``llada/generate.py`` loops.
* :func:`dream_generate`: upstream ``DreamGenerationMixin.diffusion_generate``.
* :func:`upstream_logits`: the upstream forward's float32 logits (Dream: unshifted).
* :func:`load_upstream`: an upstream model rebuilt from a directory written here.

Shims for transformers 5.x (the upstream files were written for 4.x). All of them are applied
here, to the privately loaded copies of the upstream modules or to the objects built from them;
nothing in ``../shared`` is edited and no global transformers state is changed:

* LLaDA: transformers 5 pops generation parameters (``use_cache`` among them) from config
  kwargs, so ``LLaDAConfig`` ends up without ``use_cache`` and ``LLaDAModelLM.forward`` fails on
  ``self.config.use_cache``; the builder sets ``config.use_cache = False`` on the constructed
  config (the value LLaDA's own ``config.json`` carries). ``from_pretrained`` (which fails on
  ``all_tied_weights_keys``) is not used: the model is constructed from its config class.
* LLaDA: importing ``configuration_llada`` / ``modeling_llada`` registers ``"llada"`` with
  ``AutoConfig`` / ``AutoModel``; the registries are restored after the import so that the rest of
  the test session sees the same transformers as without this module.
* LLaDA (speed, not 5.x): ``modeling_llada.scaled_dot_product_attention`` is decorated with
  ``@torch.compile()``; on CPU it recompiles for every new sequence length (3-20 s each). The
  module global is replaced by the very same upstream function without the compile wrapper
  (``_torchdynamo_orig_callable``): one call to ``F.scaled_dot_product_attention``.
* Dream: transformers 5 dropped ``ROPE_INIT_FUNCTIONS["default"]`` (``KeyError: 'default'`` when
  ``DreamRotaryEmbedding`` is built); ``modeling_dream.ROPE_INIT_FUNCTIONS`` (the module's own
  global) becomes a copy of the transformers dict plus ``"default"``, transformers 4.x's
  ``_compute_default_rope_parameters`` formula.
* Dream: transformers 5's ``GenerationConfig.update`` calls ``self.validate(user_set_attributes=...)``
  but ``DreamGenerationConfig.validate(self, is_init=False)`` (a no-op) does not take that
  keyword; it is replaced by a no-op that accepts any arguments.
* Dream: ``diffusion_generate`` without a ``generation_config`` builds one with
  ``DreamGenerationConfig.from_model_config(model.config)``; transformers 5's version compares
  every attribute with a plain ``GenerationConfig()``, which has no ``eps``/``steps``/``alg``
  (``AttributeError``). ``DreamGenerationConfig.from_model_config`` is given transformers 4.x's
  behaviour for a non-composite config: ``from_dict`` of the model config's non-None entries, so
  the mask/pad/bos/eos ids come from the model config and everything else from the defaults.

Surprises in the upstream code worth knowing when comparing against it:

* LLaDA ignores ``attention_mask`` (its attention is called with ``attn_mask=None``).
* Dream ignores ``position_ids``: ``DreamBaseModel.forward`` overwrites them with
  ``arange(seq_len)``, so the ``tok_idx`` that ``diffusion_generate`` computes for left-padded
  rows (and passes positionally as ``position_ids``) has no effect; a left-padded row's tokens sit
  at positions shifted by the padding. Padding is honoured only through the attention mask: a
  ``[B, 1, L, L]`` boolean (query and key both real), or the string ``"full"`` (= no mask).
* Dream's logits are shifted by the loop, not the model: ``diffusion_generate`` uses
  ``cat([logits[:, :1], logits[:, :-1]])``, so position i is predicted from hidden state i - 1.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from upstream import (
    _dream_package,
    _is_dream,
    _llada_modules,
    dream_generate,
    llada_generate,
    llada_generate_cached,
    load_upstream,
    upstream_logits,
    upstream_missing_reason,
)

from dlmsearch.models.llada_checkpoint import llada_config
from dlmsearch.models.transformer import TransformerConfig

LLADA_SHARPNESS = 8.0
"""Output-head scale of :func:`build_llada` (see :func:`_adjust_weights`)."""
DREAM_SHARPNESS = 8.0
"""Output-head scale of :func:`build_dream` (see :func:`_adjust_weights`)."""
MASK_LOGIT_WEIGHT = -1.0e4
"""Head weight from the constant residual dimension to the mask token's logit."""
CONSTANT_DIM_VALUE = 1.0
"""Value of the constant residual dimension in every token embedding."""
QK_GAIN = 2.0
"""Extra factor on the query and key projections (weights and biases): sharper, position-dependent
attention, so that the masked positions' hidden states (and confidences) differ."""

requires_upstream = pytest.mark.skipif(
    upstream_missing_reason() is not None, reason=upstream_missing_reason() or "upstream reference code present"
)

# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


def _adjust_weights(
    model: torch.nn.Module,
    *,
    seed: int,
    embedding: str,
    head: str,
    residual_writers: list[str],
    mask_id: int,
    sharpness: float,
) -> None:
    """Deterministic random weights that make parity tests exact and thresholds meaningful.

    1. Every weight is drawn afresh from ``torch.Generator().manual_seed(seed)`` in
       ``named_parameters()`` order: embeddings N(0, 1), linear weights N(0, 1/fan_in), linear
       biases (Dream's q/k/v) N(0, 0.1^2); norm weights are 1. Query and key projections are
       then multiplied by :data:`QK_GAIN` (2): the masked positions all hold the same mask
       embedding and differ only through attention, which must be sharp and position-dependent
       (RoPE) for their confidences to differ.
    2. **The mask token has probability exactly 0.** The last hidden dimension ``j`` is a
       constant channel: the embedding column ``j`` is :data:`CONSTANT_DIM_VALUE` for every token
       and row ``j`` of every projection writing into the residual stream (``residual_writers``:
       LLaDA ``attn_out``/``ff_out``, Dream ``o_proj``/``down_proj``; none has a bias) is zero, so
       the stream's dim ``j`` is that positive constant at every position and layer, and stays
       positive after the final RMSNorm (weight 1). The head row of ``mask_id`` is zero except
       column ``j`` = :data:`MASK_LOGIT_WEIGHT` (-1e4), so the mask logit is about -1e4 / rms,
       -5000 to -7000 (thousands below every other logit, |logit| < ~50): its softmax probability underflows to exactly 0.0 in
       float32 and in float64 (LLaDA's ``generate`` takes the softmax in float64), and it is
       never the argmax -- as in a trained model, which never predicts the mask.
    3. **Confidences spread over (0, 1).** Random init gives near-uniform distributions over a
       126-152k vocabulary (top-1 probability ~1e-5). The head (except the mask row) is
       multiplied by ``sharpness`` (:data:`LLADA_SHARPNESS`, :data:`DREAM_SHARPNESS`: 8); with
       N(0, 1/d) rows and a unit-RMS final hidden state the logits' standard deviation is about
       ``sharpness``, above sqrt(2 ln V) ~ 4.9, where the top-1 probability varies widely. Measured
       over a random 20-token prompt + 16 masks (5 seeds x 3 prompts, 240 masked positions):
       LLaDA median top-1 0.57, 11% below 0.3, 18% above 0.9; Dream 0.50, 13% below 0.3, 19%
       above 0.9; in most single prompts both ends occur. The top-1/top-2 logit gap at those
       positions was at least 0.007 (no near-ties).
    """
    generator = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in params.items():
            leaf = name.rsplit(".", 1)[-1]
            if name == embedding:
                param.copy_(torch.randn(param.shape, generator=generator))
            elif leaf == "weight" and param.dim() == 1:  # RMSNorm weights (LLaDA's ln_f included)
                param.fill_(1.0)
            elif leaf == "weight" and param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[1]))
            elif leaf == "bias":
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
            else:
                raise AssertionError(f"unexpected parameter {name} {tuple(param.shape)}")
            if name.rsplit(".", 2)[-2] in ("q_proj", "k_proj"):
                param.mul_(QK_GAIN)
        j = params[embedding].shape[1] - 1
        params[embedding][:, j] = CONSTANT_DIM_VALUE
        for name in residual_writers:
            params[name][j, :] = 0.0
            bias = params.get(name[: -len("weight")] + "bias")
            if bias is not None:
                bias[j] = 0.0
        weight = params[head]
        weight.mul_(sharpness)
        weight[mask_id] = 0.0
        weight[mask_id, j] = MASK_LOGIT_WEIGHT


# ---------------------------------------------------------------------------------------------
# Writing checkpoints
# ---------------------------------------------------------------------------------------------


def _shard_groups(names: list[str], sizes: list[int], shards: int) -> list[list[str]]:
    """Split ``names`` (in order) into ``shards`` non-empty groups of about equal bytes."""
    if not 1 <= shards <= len(names):
        raise ValueError(f"shards={shards} must be between 1 and the number of tensors ({len(names)})")
    total = sum(sizes)
    groups: list[list[str]] = [[]]
    written = 0
    for index, (name, size) in enumerate(zip(names, sizes)):
        still_needed = shards - len(groups)
        remaining = len(names) - index
        if (
            groups[-1]
            and still_needed > 0
            and (remaining <= still_needed or written + size > total * len(groups) / shards)
        ):
            groups.append([])
        groups[-1].append(name)
        written += size
    return groups


def _write_weights(directory: Path, state: dict[str, torch.Tensor], shards: int) -> None:
    from safetensors.torch import save_file

    state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
    for stale in [*directory.glob("model*.safetensors"), directory / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)  # a rebuild with another shard count must not leave old files
    if shards == 1:
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(state)
    groups = _shard_groups(names, [state[n].numel() * state[n].element_size() for n in names], shards)
    weight_map: dict[str, str] = {}
    for number, group in enumerate(groups, start=1):
        filename = f"model-{number:05d}-of-{shards:05d}.safetensors"
        save_file({name: state[name] for name in group}, str(directory / filename), metadata={"format": "pt"})
        weight_map.update({name: filename for name in group})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _check_ids(vocab_size: int, **ids: int) -> None:
    for name, token in ids.items():
        if not 0 <= token < vocab_size:
            raise ValueError(f"{name}={token} is outside the vocabulary of {vocab_size}")


def _write_checkpoint(
    directory: Path, model: torch.nn.Module, shards: int, config: dict[str, Any], generation: dict[str, Any]
) -> None:
    """``config.json``, ``generation_config.json`` and the weights of a float32 checkpoint."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    version = {"transformers_version": _transformers_version()}
    _write_json(directory / "config.json", {**config, "torch_dtype": "float32", **version})
    _write_json(directory / "generation_config.json", {"_from_model_config": True, **generation, **version})
    _write_weights(directory, model.state_dict(), shards)


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------


def llada_config_dict(
    *,
    vocab_size: int = 126464,
    mask_id: int = 126336,
    eos_id: int = 126081,
    d_model: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    max_sequence_length: int = 512,
) -> dict[str, Any]:
    """Every field of upstream LLaDA's ``ModelConfig``, set like LLaDA-8B's, scaled down.

    The values are the package's checkpoint config writer's
    (:func:`dlmsearch.models.llada_checkpoint.llada_config`, which the shipped Countdown model is
    saved with) for a LLaDA-8B-shaped native config (llama blocks, SiLU, RoPE theta 5e5, no
    biases, untied head, MLP width ``2 * d_model``); checked here against upstream's dataclass:
    the writer must give every ``ModelConfig`` field, and nothing else but ``config.json``'s
    bookkeeping keys (dropped from the returned fields).
    """
    package, _ = _llada_modules()
    fields = {f.name for f in dataclasses.fields(package.configuration_llada.ModelConfig)}
    native = TransformerConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=n_heads,
        intermediate_size=2 * d_model,
        max_length=max_sequence_length,
        rope_theta=500000.0,
        tie_embeddings=False,
    )
    written = llada_config(native, mask_id=mask_id, eos_id=eos_id, pad_id=eos_id)
    unknown = set(written) - fields - {"model_type", "architectures", "use_cache", "torch_dtype"}
    missing = fields - set(written)
    assert not unknown and not missing, (
        f"llada_config writes fields LLaDA's ModelConfig lacks {unknown}, and lacks {missing}"
    )
    return {key: value for key, value in written.items() if key in fields}


def build_llada(
    directory: Path,
    *,
    vocab_size: int = 126464,
    mask_id: int = 126336,
    eos_id: int = 126081,
    eot_id: int = 126348,
    d_model: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    max_sequence_length: int = 512,
    seed: int = 0,
    shards: int = 1,
    sharpness: float = LLADA_SHARPNESS,
) -> torch.nn.Module:
    """A tiny upstream ``LLaDAModelLM`` (float32, eval mode), also written into ``directory``.

    The architecture is LLaDA-8B's (llama blocks, RMSNorm, SiLU gated MLP, RoPE theta 5e5, no
    biases, untied head, real vocabulary and special ids) at ``d_model`` x ``n_layers``; weights
    as in :func:`_adjust_weights`. ``directory`` receives ``config.json`` (all ``ModelConfig``
    fields plus ``model_type: "llada"``, ``architectures``, ``auto_map``, ``use_cache``),
    ``generation_config.json`` (``eos_token_id: [eos_id, eot_id]``; LLaDA's config has no EOT
    field) and the weights (``shards`` safetensors files). The returned model is the one whose
    weights were written.
    """
    _check_ids(vocab_size, mask_id=mask_id, eos_id=eos_id, eot_id=eot_id)
    package, _ = _llada_modules()
    fields = llada_config_dict(
        vocab_size=vocab_size,
        mask_id=mask_id,
        eos_id=eos_id,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        max_sequence_length=max_sequence_length,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = package.configuration_llada.LLaDAConfig(use_cache=False, **fields)
        config.use_cache = False  # transformers 5 drops the ``use_cache`` kwarg (a generation parameter)
        model = package.modeling_llada.LLaDAModelLM(config, init_params=False)
    model = model.to(torch.float32).eval()
    blocks = [f"model.transformer.blocks.{i}." for i in range(n_layers)]
    _adjust_weights(
        model,
        seed=seed,
        embedding="model.transformer.wte.weight",
        head="model.transformer.ff_out.weight",
        residual_writers=[b + "attn_out.weight" for b in blocks] + [b + "ff_out.weight" for b in blocks],
        mask_id=mask_id,
        sharpness=sharpness,
    )
    _write_checkpoint(
        directory,
        model,
        shards,
        {
            **fields,
            "model_type": "llada",
            "architectures": ["LLaDAModelLM"],
            "auto_map": {
                "AutoConfig": "configuration_llada.LLaDAConfig",
                "AutoModel": "modeling_llada.LLaDAModelLM",
                "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
            },
            "use_cache": False,
        },
        {"eos_token_id": [eos_id, eot_id], "pad_token_id": eos_id},
    )
    return model


def dream_config_dict(
    *,
    vocab_size: int = 152064,
    mask_id: int = 151666,
    eos_id: int = 151643,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    rope_theta: float = 1e6,
) -> dict[str, Any]:
    """The fields of Dream-7B's ``config.json`` (less bookkeeping keys), scaled down."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "use_cache": False,
        "tie_word_embeddings": False,
        "rope_theta": float(rope_theta),
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": num_hidden_layers,
        "attention_dropout": 0.0,
        "mask_token_id": mask_id,
        "pad_token_id": eos_id,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
    }


def build_dream(
    directory: Path,
    *,
    vocab_size: int = 152064,
    mask_id: int = 151666,
    eos_id: int = 151643,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    rope_theta: float = 1e6,
    seed: int = 0,
    shards: int = 1,
    sharpness: float = DREAM_SHARPNESS,
) -> torch.nn.Module:
    """A tiny upstream ``DreamModel`` (float32, eval mode), also written into ``directory``.

    Dream-7B's architecture (Qwen2-style: q/k/v biases, GQA, RMSNorm eps 1e-6, SiLU gated MLP,
    RoPE theta 1e6, untied head, real vocabulary; BOS = EOS = pad) at the given sizes; weights
    as in :func:`_adjust_weights`. Attention is the SDPA path the upstream code hardcodes.
    ``directory`` receives ``config.json`` (``model_type: "Dream"``, ``architectures``,
    ``auto_map``, the special ids), ``generation_config.json`` and the weights (``shards``
    safetensors files).
    """
    _check_ids(vocab_size, mask_id=mask_id, eos_id=eos_id)
    package = _dream_package()
    fields = dream_config_dict(
        vocab_size=vocab_size,
        mask_id=mask_id,
        eos_id=eos_id,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = package.configuration_dream.DreamConfig(**fields)
        model = package.modeling_dream.DreamModel(config)
    model = model.to(torch.float32).eval()
    layers = [f"model.layers.{i}." for i in range(num_hidden_layers)]
    _adjust_weights(
        model,
        seed=seed,
        embedding="model.embed_tokens.weight",
        head="lm_head.weight",
        residual_writers=[l + "self_attn.o_proj.weight" for l in layers] + [l + "mlp.down_proj.weight" for l in layers],
        mask_id=mask_id,
        sharpness=sharpness,
    )
    _write_checkpoint(
        directory,
        model,
        shards,
        {
            **fields,
            "model_type": "Dream",
            "architectures": ["DreamModel"],
            "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        },
        {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id},
    )
    return model


# ---------------------------------------------------------------------------------------------
# Self-check
# ---------------------------------------------------------------------------------------------


def confidence_spread(
    model: torch.nn.Module, *, mask_id: int, prompt_length: int = 20, masks: int = 16, seed: int = 0
) -> dict[str, float]:
    """Top-1 probabilities at the masked positions of a random prompt + ``masks`` masks (Dream's
    logits shifted as its loop shifts them), and checks of the mask-probability-0 property."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 1000, (prompt_length,), generator=generator)
    x = torch.cat([prompt, torch.full((masks,), mask_id)])[None]
    logits = upstream_logits(model, x)
    if _is_dream(model):
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    for dtype in (torch.float32, torch.float64):
        assert torch.all(torch.softmax(logits.to(dtype), -1)[..., mask_id] == 0), f"mask token has mass in {dtype}"
    assert not torch.any(logits.argmax(-1) == mask_id)
    top = torch.softmax(logits[0, prompt_length:], -1).max(-1).values
    margin = (logits.max(-1).values - logits[..., mask_id]).min().item()
    top2 = logits[0, prompt_length:].topk(2, -1).values
    return {
        "min": top.min().item(),
        "median": top.median().item(),
        "max": top.max().item(),
        "below_0.3": int((top < 0.3).sum()),
        "above_0.9": int((top > 0.9).sum()),
        "mask_logit_margin": margin,
        "min_top1_top2_gap": (top2[:, 0] - top2[:, 1]).min().item(),
    }


def _self_check() -> None:
    import tempfile
    import time

    torch.set_num_threads(1)
    reason = upstream_missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for family, build, mask_id in (("llada", build_llada, 126336), ("dream", build_dream, 151666)):
            start = time.perf_counter()
            (_llada_modules if family == "llada" else _dream_package)()
            imported = time.perf_counter() - start
            start = time.perf_counter()
            model = build(root / family)
            built = time.perf_counter() - start
            start = time.perf_counter()
            build(root / f"{family}-sharded", shards=3)
            sharded = time.perf_counter() - start
            print(
                f"{family}: import {imported:.2f}s, build+save {built:.2f}s, sharded(3) build+save {sharded:.2f}s, "
                f"files {sorted(p.name for p in (root / family).iterdir())}"
            )
            index = json.loads((root / f"{family}-sharded" / "model.safetensors.index.json").read_text())
            print(
                f"  shards: {sorted(set(index['weight_map'].values()))}, total_size {index['metadata']['total_size']}"
            )
            reloaded = load_upstream(root / f"{family}-sharded")
            ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(1))
            assert torch.equal(upstream_logits(reloaded, ids), upstream_logits(model, ids)), "sharded reload differs"
            spread = confidence_spread(model, mask_id=mask_id)
            print("  confidence spread: " + ", ".join(f"{k} {v:.4g}" for k, v in spread.items()))
            prompt = torch.randint(0, 1000, (20,), generator=torch.Generator().manual_seed(2))
            if family == "llada":
                runs = [
                    (
                        "generate steps16 block8",
                        lambda: llada_generate(model, prompt, steps=16, gen_length=16, block_length=8),
                    ),
                    (
                        "generate threshold0.5",
                        lambda: llada_generate(model, prompt, steps=16, gen_length=16, block_length=8, threshold=0.5),
                    ),
                    (
                        "prefix cache",
                        lambda: llada_generate_cached(
                            model, prompt, cache="prefix", steps=16, gen_length=16, block_length=8
                        ),
                    ),
                    (
                        "dual cache",
                        lambda: llada_generate_cached(
                            model, prompt, cache="dual", steps=16, gen_length=16, block_length=8
                        ),
                    ),
                    (
                        "dual cache threshold0.5",
                        lambda: llada_generate_cached(
                            model, prompt, cache="dual", steps=16, gen_length=16, block_length=8, threshold=0.5
                        ),
                    ),
                ]
            else:
                runs = [
                    (alg, functools.partial(dream_generate, model, prompt, steps=16, gen_length=16, alg=alg))
                    for alg in ("maskgit_plus", "topk_margin", "entropy")
                ]
            for label, run in runs:
                start = time.perf_counter()
                tokens, calls = run()
                elapsed = time.perf_counter() - start
                assert tokens.shape == (16,) and tokens.dtype == torch.long and not torch.any(tokens == mask_id)
                if family == "dream":
                    assert calls == 16, calls
                print(f"  {label}: {elapsed:.2f}s, calls {calls}, tokens {tokens.tolist()}")
            again = build_llada(root / "again") if family == "llada" else build_dream(root / "again")
            assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values())), (
                "not deterministic"
            )
    print("self-check passed")


if __name__ == "__main__":
    _self_check()
