"""What distinguishes LLaDA, Dream and SDAR: how ``config.json`` reads, what the weights are called,
and what the special tokens are called in the tokenizer.

Each family maps its checkpoint onto :class:`~dlmsearch.models.transformer.TransformerConfig`
and the native parameter names. Anything the native transformer does not implement fails here
with the offending key, instead of loading into a silently different model. The token names
let :func:`dlmsearch.models.loading.checkpoint_ids` find the mask and stop ids in a tokenizer
whose config files do not name them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import attrs
import torch

from dlmsearch.models.transformer import MixtureOfExperts, TransformerConfig


class UnsupportedCheckpoint(ValueError):
    """A checkpoint that the native implementation cannot represent exactly."""


@attrs.frozen
class Family:
    """A model family: the ``model_type`` values it answers to, its config and its names."""

    name: str
    model_types: tuple[str, ...]
    read_config: ConfigReader  # config.json -> TransformerConfig, and back (its ``written``)
    renames: tuple[tuple[str, str], ...]  # (regex on the checkpoint name, native replacement)
    shift_logits: bool  # AR-initialised: position i's logits predict token i + 1
    mask_tokens: tuple[str, ...] = ()  # the mask token's name in the family's tokenizers
    stop_tokens: tuple[str, ...] = ()  # tokens that end an answer (EOS, end of turn), in the family's tokenizers
    block_diffusion: bool = False  # trained block-causally: decodes block by block against an exact block cache
    regroup: Callable[[dict[str, torch.Tensor], TransformerConfig], dict[str, torch.Tensor]] | None = (
        None  # after renaming: split fused, stack per-expert tensors
    )

    def native_name(self, name: str) -> str | None:
        """The native parameter name for a checkpoint name, or None where it has none."""
        for pattern, replacement in self.renames:
            if re.fullmatch(pattern, name):
                return re.sub(pattern, replacement, name)
        return None


def _require(config: dict[str, Any], family: str, expected: dict[str, Any]) -> None:
    for key, allowed in expected.items():
        value = config.get(key, allowed[0])
        if value not in allowed:
            raise UnsupportedCheckpoint(
                f"{family} config.json has {key}={value!r}; the native implementation supports {allowed!r} "
                f"(LLaDA-8B / Dream-7B architectures); try model.impl=remote"
            )


_REQUIRED = object()  # a Key without a default: config.json must have it


@attrs.frozen
class Key:
    """Where one :class:`TransformerConfig` field stands in ``config.json`` (as transformers' ``attribute_map``).

    The last name is read as ``config.get(name, default)``, or ``config[name]`` where there is no
    default, then passed through ``convert``; any earlier names come first, the first one that is
    set (truthy) winning: ``Key.of("embedding_size", "vocab_size")`` reads
    ``config.get("embedding_size") or config["vocab_size"]``.
    """

    names: tuple[str, ...]
    default: Any = _REQUIRED
    convert: Callable[[Any], Any] | None = None

    @classmethod
    def of(cls, *names: str, default: Any = _REQUIRED, convert: Callable[[Any], Any] | None = None) -> Key:
        return cls(names, default, convert)

    def read(self, config: dict[str, Any]) -> Any:
        *first, last = self.names
        for name in first:
            if config.get(name):
                return config[name]
        value = config[last] if self.default is _REQUIRED else config.get(last, self.default)
        return value if self.convert is None else self.convert(value)


@attrs.frozen(eq=False)
class ConfigReader:
    """A family's ``config.json`` -> :class:`TransformerConfig`: what it must say (``requires``, checked
    first), one table of field -> :class:`Key` (or a constant), and ``special``: the fields the
    family computes rather than reads (with their own errors), which take the table's place."""

    family: str  # the family's name in error messages
    requires: dict[str, tuple[Any, ...]]  # key -> the values the native implementation supports (the first: absent)
    keys: dict[str, Key | Any]
    special: Callable[[dict[str, Any]], dict[str, Any]] = lambda config: {}  # none: every field is in the table

    def __call__(self, config: dict[str, Any]) -> TransformerConfig:
        _require(config, self.family, self.requires)
        special = self.special(config)
        table = {field: key for field, key in self.keys.items() if field not in special}
        read = {field: key.read(config) if isinstance(key, Key) else key for field, key in table.items()}
        return TransformerConfig(**read, **special)

    def written(self, config: TransformerConfig) -> dict[str, Any]:
        """The reader turned around, for a checkpoint writer: each required key at its supported
        value, each :class:`Key`'s field of ``config`` under the Key's first name. What the family
        computes (``special``) or fixes (a constant) is the writer's own to say."""
        required = {key: allowed[0] for key, allowed in self.requires.items()}
        fields = {key.names[0]: getattr(config, field) for field, key in self.keys.items() if isinstance(key, Key)}
        return {**required, **fields}


def _llada_special(config: dict[str, Any]) -> dict[str, Any]:
    """Multi-query attention (one k/v head) and an MLP width given as a ratio of ``d_model``."""
    mlp = config.get("mlp_hidden_size") or config.get("mlp_ratio", 4) * config["d_model"]
    return {"intermediate_size": mlp, **({"num_kv_heads": 1} if config.get("multi_query_attention") else {})}


_llada_config = ConfigReader(
    "LLaDA",
    requires={
        "block_type": ("llama",),
        "layer_norm_type": ("rms",),
        "rope": (True,),
        "alibi": (False,),
        "attention_layer_norm": (False,),
        "include_bias": (False,),
        "input_emb_norm": (False,),
        "scale_logits": (False,),
        "block_group_size": (1,),
        "activation_type": ("silu", "gelu", "relu"),
    },
    keys={
        "vocab_size": Key.of("embedding_size", "vocab_size"),
        "hidden_size": Key.of("d_model"),
        "num_layers": Key.of("n_layers"),
        "num_heads": Key.of("n_heads"),
        "num_kv_heads": Key.of("n_kv_heads", "n_heads"),
        "max_length": Key.of("max_sequence_length", default=1024),
        "rope_theta": Key.of("rope_theta", default=10000.0, convert=float),
        "rms_norm_eps": Key.of("rms_norm_eps", default=1e-5, convert=float),
        "qkv_bias": Key.of("include_qkv_bias", default=False, convert=bool),
        "activation": Key.of("activation_type", default="silu"),
        "tie_embeddings": Key.of("weight_tying", default=True, convert=bool),
        "rope_in_float32": Key.of("rope_full_precision", default=True, convert=bool),
    },
    special=_llada_special,
)

# Qwen2's names, as Dream's config.json has them (SDAR and LLaDA2 start from this table)
_DREAM_KEYS: dict[str, Key | Any] = {
    "vocab_size": Key.of("vocab_size"),
    "hidden_size": Key.of("hidden_size"),
    "num_layers": Key.of("num_hidden_layers"),
    "num_heads": Key.of("num_attention_heads"),
    "num_kv_heads": Key.of("num_key_value_heads", "num_attention_heads"),
    "intermediate_size": Key.of("intermediate_size"),
    "max_length": Key.of("max_position_embeddings", default=32768),
    "rope_theta": Key.of("rope_theta", default=10000.0, convert=float),
    "rms_norm_eps": Key.of("rms_norm_eps", default=1e-6, convert=float),
    "qkv_bias": True,
    "activation": Key.of("hidden_act", default="silu"),
    "tie_embeddings": Key.of("tie_word_embeddings", default=False, convert=bool),
    "rope_in_float32": False,
}

_dream_config = ConfigReader(
    "Dream", requires={"rope_scaling": (None,), "hidden_act": ("silu", "gelu", "relu")}, keys=_DREAM_KEYS
)


def _head_dim(config: dict[str, Any]) -> int:
    """An explicit ``head_dim`` (Qwen3), else hidden / heads."""
    heads = config["num_attention_heads"]
    return config.get("head_dim") or config["hidden_size"] // heads


SDAR_DEFAULT_BLOCK = 4  # SDAR's and TraDo's published block size, where config.json names none


def _sdar_special(config: dict[str, Any]) -> dict[str, Any]:
    """The block size: config.json's ``block_size`` (dlmsearch's own checkpoints write it), else SDAR's 4."""
    head_dim = _head_dim(config)
    block = config.get("block_size") or SDAR_DEFAULT_BLOCK
    if not isinstance(block, int) or block < 1:
        raise UnsupportedCheckpoint(f"SDAR config.json has block_size={block!r}; it must be a positive integer")
    return {"head_dim": head_dim, "block_size": block}


# SDAR / TraDo (Qwen3's architecture, trained block-causally): GQA, q/k RMSNorm over each head,
# an explicit ``head_dim``, no biases, untied head unless ``tie_word_embeddings``.
_SDAR_KEYS: dict[str, Key | Any] = {**_DREAM_KEYS, "qkv_bias": False, "activation": "silu", "qk_norm": True}
_sdar_config = ConfigReader(
    "SDAR",
    requires={
        "rope_scaling": (None,),
        "hidden_act": ("silu",),
        "attention_bias": (False,),
        "use_sliding_window": (False,),
    },
    keys=_SDAR_KEYS,
    special=_sdar_special,
)


def _renames(model: dict[str, str], layer: str, per_layer: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A family's renames (checkpoint pattern -> native replacement): the model-wide names, then each
    layer's, under the checkpoint's ``layer`` prefix (whose group, the layer's number, is ``\\1``; a
    per-layer rule's own groups count from ``\\2``) and the native ``blocks.\\1.``."""
    return (*model.items(), *((layer + pattern, r"blocks.\1." + native) for pattern, native in per_layer.items()))


LLADA = Family(
    name="llada",
    model_types=("llada",),
    read_config=_llada_config,
    renames=_renames(
        {
            r"model\.transformer\.wte\.weight": "embed.weight",
            r"model\.transformer\.ln_f\.weight": "norm.weight",
            r"model\.transformer\.ff_out\.weight": "head.weight",
        },
        r"model\.transformer\.blocks\.(\d+)\.",
        {
            r"(q_proj|k_proj|v_proj|up_proj)\.(weight|bias)": r"\2.\3",
            r"attn_norm\.weight": "attn_norm.weight",
            r"attn_out\.weight": "o_proj.weight",
            r"ff_norm\.weight": "mlp_norm.weight",
            r"ff_proj\.weight": "gate_proj.weight",
            r"ff_out\.weight": "down_proj.weight",
        },
    ),
    shift_logits=False,
    mask_tokens=("<|mdm_mask|>",),
    stop_tokens=("<|endoftext|>", "<|eot_id|>"),  # EOS (fills the tail), EOT (ends an Instruct turn)
)

_QWEN_MODEL = {
    r"model\.embed_tokens\.weight": "embed.weight",
    r"model\.norm\.weight": "norm.weight",
    r"lm_head\.weight": "head.weight",
}
_QWEN_LAYER = r"model\.layers\.(\d+)\."  # Qwen's, Ling's: Dream, SDAR and LLaDA2 name their layers so
_QWEN_PER_LAYER = {
    r"self_attn\.(q_proj|k_proj|v_proj|o_proj)\.(weight|bias)": r"\2.\3",
    r"mlp\.(gate_proj|up_proj|down_proj)\.weight": r"\2.weight",
    r"input_layernorm\.weight": "attn_norm.weight",
    r"post_attention_layernorm\.weight": "mlp_norm.weight",
}
DREAM = Family(
    name="dream",
    model_types=("Dream", "dream"),
    read_config=_dream_config,
    renames=_renames(_QWEN_MODEL, _QWEN_LAYER, _QWEN_PER_LAYER),
    shift_logits=True,
    mask_tokens=("<|mask|>",),
    stop_tokens=("<|endoftext|>", "<|im_end|>"),  # EOS (and pad), end of an Instruct turn
)

SDAR = Family(
    name="sdar",
    model_types=("sdar",),
    read_config=_sdar_config,
    renames=_renames(
        _QWEN_MODEL, _QWEN_LAYER, {**_QWEN_PER_LAYER, r"self_attn\.(q_norm|k_norm)\.weight": r"\2.weight"}
    ),
    shift_logits=False,
    mask_tokens=("<|MASK|>",),
    stop_tokens=("<|endoftext|>", "<|im_end|>"),  # EOS, end of an Instruct turn
    block_diffusion=True,
)

LLADA2_DEFAULT_BLOCK = 32  # LLaDA2.0 / 2.1's block (its generate's block_length), where config.json names none


def _llada2_moe(config: dict[str, Any]) -> MixtureOfExperts | None:
    """Grouped top-k routing over sigmoid-scored experts plus shared experts, the first
    ``first_k_dense_replace`` layers dense (None: a dense model)."""
    experts = config.get("num_experts")
    if not experts:
        return None
    needed = ("num_experts_per_tok", "n_group", "topk_group", "moe_intermediate_size")
    missing = [key for key in needed if not config.get(key)]
    if missing:
        raise UnsupportedCheckpoint(
            f"LLaDA2 config.json has num_experts={experts} but no {', '.join(missing)}: the routed experts cannot be built"
        )
    if experts % config["n_group"]:
        raise UnsupportedCheckpoint(
            f"LLaDA2 config.json: num_experts={experts} is not a multiple of n_group={config['n_group']}"
        )
    return MixtureOfExperts(
        num_experts=experts,
        top_k=config["num_experts_per_tok"],
        groups=config["n_group"],
        top_groups=config["topk_group"],
        scaling=float(config.get("routed_scaling_factor", 1.0)),
        intermediate_size=config["moe_intermediate_size"],
        shared_experts=config.get("num_shared_experts") or 0,
        dense_layers=config.get("first_k_dense_replace", 0),
    )


def _llada2_special(config: dict[str, Any]) -> dict[str, Any]:
    """LLaDA2.0 / 2.1 (``llada2_moe``, Ling's MoE trained block-causally): fused q/k/v (split by
    :func:`_llada2_regroup`), partial rotary, the experts of :func:`_llada2_moe`, a dense MLP width
    of 0 where the config names none (every layer MoE), LLaDA2's block where it names none."""
    head_dim = _head_dim(config)
    return {
        "head_dim": head_dim,
        "moe": _llada2_moe(config),
        "block_size": config.get("block_size") or LLADA2_DEFAULT_BLOCK,
        "intermediate_size": config.get("intermediate_size") or 0,
        "rotary_dim": int(head_dim * float(config.get("partial_rotary_factor", 1.0))),
    }


_llada2_config = ConfigReader(
    "LLaDA2",
    requires={
        "rope_scaling": (None,),
        "hidden_act": ("silu",),
        "use_qkv_bias": (False,),
        "use_bias": (False,),
        "norm_head": (False,),
        "use_qk_norm": (True,),
        "use_sliding_window": (False,),
    },
    keys={**_SDAR_KEYS, "rms_norm_eps": Key.of("rms_norm_eps", default=1e-5, convert=float)},
    special=_llada2_special,
)


def _llada2_regroup(state: dict[str, torch.Tensor], config: TransformerConfig) -> dict[str, torch.Tensor]:
    """Split each fused ``query_key_value`` into q/k/v and stack each MoE layer's experts."""
    out = {name: t for name, t in state.items() if ".qkv." not in name and ".experts." not in name}
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    for name, tensor in state.items():
        if ".qkv." in name:
            prefix = name.split(".qkv.")[0]
            out[f"{prefix}.q_proj.weight"], out[f"{prefix}.k_proj.weight"], out[f"{prefix}.v_proj.weight"] = (
                tensor.split([q, kv, kv])
            )
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, tensor in state.items():
        match = re.fullmatch(r"(blocks\.\d+)\.experts\.(\d+)\.(gate|up|down)", name)
        if match:
            experts.setdefault((match[1], match[3]), {})[int(match[2])] = tensor
    for (prefix, part), tensors in experts.items():
        out[f"{prefix}.expert_{part}"] = torch.stack([tensors[i] for i in sorted(tensors)])
    return out


LLADA2 = Family(
    name="llada2",
    model_types=("llada2_moe",),
    read_config=_llada2_config,
    renames=_renames(
        {
            r"model\.word_embeddings\.weight": "embed.weight",
            r"model\.norm\.weight": "norm.weight",
            r"lm_head\.weight": "head.weight",
        },
        _QWEN_LAYER,
        {
            r"attention\.query_key_value\.weight": "qkv.weight",
            r"attention\.dense\.weight": "o_proj.weight",
            r"attention\.query_layernorm\.weight": "q_norm.weight",
            r"attention\.key_layernorm\.weight": "k_norm.weight",
            r"input_layernorm\.weight": "attn_norm.weight",
            r"post_attention_layernorm\.weight": "mlp_norm.weight",
            r"mlp\.(gate_proj|up_proj|down_proj)\.weight": r"\2.weight",  # a dense layer
            r"mlp\.shared_experts\.(gate_proj|up_proj|down_proj)\.weight": r"\2.weight",
            r"mlp\.gate\.weight": "router",
            r"mlp\.gate\.expert_bias": "expert_bias",
            r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight": r"experts.\2.\3",
        },
    ),
    shift_logits=False,
    mask_tokens=("<|mask|>",),
    stop_tokens=("<|endoftext|>", "<|role_end|>"),
    block_diffusion=True,
    regroup=_llada2_regroup,
)

FAMILIES = {f.name: f for f in (LLADA, DREAM, SDAR, LLADA2)}


def family_of(config: dict[str, Any], where: str) -> Family:
    """The family a ``config.json`` belongs to, or one error naming what it is instead."""
    model_type = config.get("model_type")
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    raise UnsupportedCheckpoint(
        f"{where}: model_type={model_type!r} (architectures {config.get('architectures')}) is not a supported family; "
        f"supported model_type values: {', '.join(t for f in FAMILIES.values() for t in f.model_types)}"
    )
