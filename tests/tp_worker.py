"""Tiny sharp checkpoints of every family and a torchrun worker that decodes them (tensor parallelism).

A helper, not a test module: ``tests/test_tensor_parallel.py`` and ``experiments/tp_logit_table.py``
write a checkpoint with :func:`write_checkpoint` and run this file under
``python -m torch.distributed.run --nproc-per-node N tests/tp_worker.py SPEC OUT`` with
``tensor_parallel`` = N (or 1 in one process, the reference). Rank 0 writes to ``OUT`` (torch.save):
the logits of a fixed forward, every decode's tokens and counters, and the all-reduce bytes per
forward. SPEC (JSON): ``family``, ``directory``, ``tensor_parallel``, ``decodes`` (a list of
``[preset, cache, [overrides...]]``), ``gen``, ``block``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

VOCAB, MASK, EOS, EOT = 64, 63, 61, 62
FAMILIES = ("llada", "dream", "sdar", "llada2", "diffusion_gemma", "diffusion_gemma_moe")


def _native(family: str):
    """A random native model of ``family``'s architecture, sharpened (head, q/k) so confidences spread.
    Dream's is multi-query (one key/value head, with biases): two ranks each hold that head whole."""
    from dlmsearch.models.families import LLADA2
    from dlmsearch.models.transformer import BidirectionalTransformer, TransformerConfig

    torch.manual_seed(0)
    common = {"vocab_size": VOCAB, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "max_length": 128}
    if family == "llada2":
        config = LLADA2.read_config(LLADA2_CONFIG)
    elif family == "sdar":
        config = TransformerConfig(
            **common, num_kv_heads=2, head_dim=12, intermediate_size=64, rms_norm_eps=1e-6, qk_norm=True,
            rope_in_float32=False, block_size=4,
        )  # fmt: skip
    else:
        dream = family == "dream"
        config = TransformerConfig(
            **common, num_kv_heads=1 if dream else 4, intermediate_size=64, rope_theta=1e6 if dream else 5e5,
            qkv_bias=dream, rope_in_float32=not dream,
        )  # fmt: skip
    model = BidirectionalTransformer(config)
    with torch.no_grad():
        model.head.weight.mul_(8.0)
        model.head.weight[MASK] = 0.0
        for block in model.blocks:
            block.q_proj.weight.mul_(3.0)
            block.k_proj.weight.mul_(3.0)
            if block.moe is not None:
                block.router.normal_(0, 1 / math.sqrt(32))
                block.expert_bias.normal_(0, 0.1)
                for part in (block.expert_gate, block.expert_up, block.expert_down):
                    part.normal_(0, 1 / math.sqrt(part.shape[-1]))
    return model.eval()


LLADA2_CONFIG = {
    "model_type": "llada2_moe",
    "architectures": ["LLaDA2MoeModelLM"],
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 128,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "use_bias": False,
    "use_qkv_bias": False,
    "use_qk_norm": True,
    "num_experts": 8,
    "num_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "moe_intermediate_size": 16,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
    "partial_rotary_factor": 0.5,
    "block_size": 8,
    "mask_token_id": MASK,
    "eos_token_id": EOS,
    "pad_token_id": EOS,
}


def _dream_config(config) -> dict:
    return {
        "model_type": "Dream",
        "architectures": ["DreamModel"],
        "vocab_size": VOCAB,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_length,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "mask_token_id": MASK,
        "eos_token_id": EOS,
        "pad_token_id": EOS,
    }


def _llada2_state(model) -> dict[str, torch.Tensor]:
    """LLaDA2's checkpoint names: fused query_key_value, one tensor per expert."""
    from dlmsearch.models.families import LLADA2
    from dlmsearch.models.llada_checkpoint import family_name

    state = {}
    for name, tensor in model.state_dict().items():
        layer = name.split(".")[1] if name.startswith("blocks.") else None
        prefix = f"model.layers.{layer}."
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            continue
        if name.endswith("q_proj.weight"):
            block = model.blocks[int(layer)]
            fused = torch.cat([block.q_proj.weight, block.k_proj.weight, block.v_proj.weight])
            state[prefix + "attention.query_key_value.weight"] = fused
        elif name.rsplit(".", 1)[1] in ("expert_gate", "expert_up", "expert_down"):
            part = name.rsplit("expert_", 1)[1]
            for index, expert in enumerate(tensor):
                state[prefix + f"mlp.experts.{index}.{part}_proj.weight"] = expert
        else:
            state[family_name(name, LLADA2)] = tensor
    return state


def write_checkpoint(family: str, directory: Path) -> Path:
    """A tiny sharp checkpoint of ``family`` (see :data:`FAMILIES`) in ``directory``."""
    from dlmsearch.models.families import DREAM
    from dlmsearch.models.llada_checkpoint import save_as, save_llada
    from dlmsearch.models.llada_checkpoint import write_checkpoint as write_files
    from dlmsearch.models.sdar_checkpoint import save_sdar

    directory = Path(directory)
    if family.startswith("diffusion_gemma"):
        sys.path.insert(0, str(Path(__file__).parent))
        from diffusion_gemma_models import tiny_diffusion_gemma

        tiny_diffusion_gemma(directory, moe=family.endswith("moe"), sharpness=2.0)
        return directory
    model = _native(family)
    if family == "llada":
        save_llada(directory, model, mask_id=MASK, eos_id=EOS, eot_id=EOT)
    elif family == "dream":
        save_as(directory, model, DREAM, _dream_config(model.config), eos_id=EOS, eot_id=EOT)
    elif family == "sdar":
        save_sdar(directory, model, mask_id=MASK, eos_id=EOS, eot_id=EOT)
    else:
        generation = json.dumps({"eos_token_id": [EOS], "pad_token_id": EOS})
        write_files(
            directory,
            _llada2_state(model),
            {"config.json": json.dumps(LLADA2_CONFIG), "generation_config.json": generation},
        )
    return directory


def load(family: str, directory: str, tensor_parallel: int):
    if family.startswith("diffusion_gemma"):
        from dlmsearch.models.diffusion_gemma import load_diffusion_gemma

        return load_diffusion_gemma(directory, device="cpu", dtype="float32", tensor_parallel=tensor_parallel)
    from dlmsearch.models.loading import load_text_model

    return load_text_model(
        directory, family if family != "dream" else "dream", device="cpu", dtype="float32",
        tensor_parallel=tensor_parallel, fallback_ids={"mask_id": MASK, "vocab_size": VOCAB, "stop_ids": [EOS]},
    )  # fmt: skip


def requests(adapter, gen: int) -> list:
    from dlmsearch.search.decode.intake import DecodeRequest

    generator = torch.Generator().manual_seed(3)
    return [
        DecodeRequest(
            uid=uid,
            prompt=torch.randint(3, 60, (n,), generator=generator),
            generation=torch.full((gen,), adapter.capabilities.open_id),
            seed=11 + uid,
        )
        for uid, n in enumerate((5, 9, 7))
    ]


def forward_logits(adapter, family: str) -> torch.Tensor:
    """The float32 logits of one fixed forward (a native model's canvas; DiffusionGemma's decoder on an encoded prompt)."""
    tokens = torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        if not family.startswith("diffusion_gemma"):
            return adapter.module(tokens).float()
        from dlmsearch.search.engine.encoder_prefix import EncoderPrefixes

        prefixes = EncoderPrefixes()
        prefixes.reset(2)
        for slot in range(2):
            adapter.encode(prefixes, slot, tokens[slot, :4], torch.arange(4), 3)
        canvas = tokens[:, 4 : 4 + adapter.canvas_length]
        positions = torch.arange(4, 4 + canvas.shape[1]).expand(2, -1)
        return adapter.denoise(canvas, positions, prefixes, torch.arange(2), (None, torch.zeros(2, dtype=torch.bool)))


def local_parameter_bytes(module: torch.nn.Module) -> int:
    """The bytes of parameters this rank holds: each storage once (tied weights share one), a DTensor by its local shard."""
    from torch.distributed.tensor import DTensor

    seen, total = set(), 0
    for _, parameter in module.named_parameters(remove_duplicate=False):
        local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
        key = local.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += local.untyped_storage().nbytes()
    return total


def run_one(spec: dict) -> dict:
    """One family's checks on this rank: the logits of a fixed forward, the all-reduce traffic of
    that forward, the parameter bytes held, and every decode's tokens and counters."""
    from dlmsearch.config import build, compose
    from dlmsearch.models.tensor_parallel import local_reduce
    from dlmsearch.search.engine.rollout import RolloutEngine

    adapter = load(spec["family"], spec["directory"], spec["tensor_parallel"])
    reduce = local_reduce(adapter.module)
    sent, calls = (reduce.bytes, reduce.calls) if reduce is not None else (0, 0)  # the group's counter is shared
    logits = forward_logits(adapter, spec["family"])
    held = local_parameter_bytes(adapter.module)
    bytes_per_forward = reduce.bytes - sent if reduce is not None else 0
    reduces_per_forward = reduce.calls - calls if reduce is not None else 0
    decodes = []
    block = spec["block"] if not spec["family"].startswith("diffusion_gemma") else adapter.canvas_length
    for preset, cache, overrides in spec["decodes"]:
        cfg = compose([f"+decoder={preset}", "decoding=text", f"task.gen_length={spec['gen']}", *overrides])
        decoder = build(cfg, "decoder")
        engine = RolloutEngine(adapter=adapter, cache=cache)
        results = decoder.decode(engine, requests(adapter, spec["gen"]), block)
        decodes.append(
            {
                "case": [preset, cache, overrides],
                "tokens": [r.tokens.tolist() for r in results],
                "counters": [(r.steps, r.row_forwards, r.token_forwards) for r in results],
            }
        )
    return {
        "logits": logits,
        "decodes": decodes,
        "bytes_per_forward": bytes_per_forward,
        "reduces_per_forward": reduces_per_forward,
        "tokens_per_forward": 24,
        "parameter_bytes": held,
    }


def main(spec_path: str, out_path: str) -> None:
    """Every family the spec file lists (one process start for all: each costs seconds), family -> result on rank 0."""
    import os

    torch.set_num_threads(1)
    found = {spec["family"]: run_one(spec) for spec in json.loads(Path(spec_path).read_text())}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(found, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
