"""The block-diffusion families' reference loops, each run in the transformers it needs: a test
helper executed as a subprocess.

* SDAR (``../shared/upstream/sdar``, Apache-2.0): ``block_diffusion_generate``; its modeling file needs
  transformers 4.52.x (4.57 and 5.x dropped ``LossKwargs``).
* LLaDA2.0 (``../shared/upstream/llada2``, Apache-2.0): ``LLaDA2MoeModelLM.generate``; transformers 4.57.6.
* LLaDA2.1 (the same repository): ``LLaDA21Sampler.sample`` (``llada21/sampler.py``, token-to-token
  editing) over its own copy of the model (``llada21/models``); the checkpoint is LLaDA2.0's.

dlmsearch's own environment has transformers 5, so the parity tests run this file with
``PYTHONPATH`` led by a directory holding the family's transformers (:data:`TRANSFORMERS`, installed
by ``scripts/setup.sh`` in dev mode) and read its JSON answer. Nothing here is imported by
dlmsearch; the reference code is loaded from ``../shared``, never copied, and never edited.

    python tests/block_reference.py SPEC.json OUT.json

The spec names the family, a checkpoint to build (``build``: the family's own model class with the
deterministic sharp weights of ``tiny_checkpoints._adjust_weights``, the q/k norms at
:data:`QK_NORM_GAIN`; written with its own parameter names) and requests to decode one at a time.
Each multinomial draw per position is replaced by dlmsearch's draw for that sample, model call and
position (the inverse CDF of the same probabilities at the counter-based uniform); ``torch.topk``
is made stable (ties: lower index), as dlmsearch breaks them (in LLaDA2's routing too).

Shims (in the subprocess only, never to the files): SDAR imports
``flash_attn.ops.triton.layer_norm.rms_norm_fn`` at the top, so a stand-in module gives plain
RMSNorm (CPUs have no flash-attn); LLaDA2's ``generate`` builds its additive block mask in bfloat16,
which SDPA refuses beside float32 queries, so ``scaled_dot_product_attention`` casts a floating
mask to the queries' dtype (the mask holds 0 and -inf, exact in both); the venv's ``kernels`` package
(required by transformers 5, built for a newer huggingface_hub than the pinned copies) is hidden.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

UPSTREAM = Path(
    os.environ.get("DLMSEARCH_BLOCK_UPSTREAM") or Path(__file__).resolve().parents[2] / "shared" / "upstream"
)
PIPELINES = UPSTREAM / "llada2" / "dllm" / "pipelines"
REFERENCE = {"sdar": UPSTREAM / "sdar", "llada2": PIPELINES / "llada2", "llada21": PIPELINES / "llada21"}
NEEDED = {
    "sdar": ("generate.py", "model/modeling_sdar.py"),
    "llada2": ("models/modeling_llada2_moe.py", "models/configuration_llada2_moe.py"),
    "llada21": ("sampler.py", "models/modeling_llada21_moe.py", "../../core/samplers/base.py"),
}
VERSIONS = {"sdar": "4.52.4", "llada2": "4.57.6", "llada21": "4.57.6"}
TRANSFORMERS = {
    family: Path(__file__).resolve().parents[1] / ".venv" / "reference" / f"transformers-{v}"
    for family, v in VERSIONS.items()
}
QK_NORM_GAIN = (
    2.0  # q/k RMSNorm weights: sharp, position-dependent attention (the projections' gain is normalised away)
)


def missing_reason(family: str) -> str | None:
    """Why the family's reference cannot run here, or None."""
    absent = [name for name in NEEDED[family] if not (REFERENCE[family] / name).is_file()]
    if absent:
        return f"{family}'s reference code not found at {REFERENCE[family]} (lacks {', '.join(absent)}; CI has ../shared/upstream)"
    if not (TRANSFORMERS[family] / "transformers").is_dir():
        return f"transformers {VERSIONS[family]} for {family}'s modeling file not found at {TRANSFORMERS[family]} (bash scripts/setup.sh installs it)"
    return None


def _stand_ins() -> None:
    """``flash_attn.ops.triton.layer_norm.rms_norm_fn`` as plain RMSNorm (float32 statistics, as SDAR's
    commented-out path); SDPA with a floating mask cast to the queries' dtype; no ``kernels``."""
    import torch

    # The venv's ``kernels`` (transformers 5 requires it) needs a newer huggingface_hub than the pinned
    # copies carry; hidden, the pinned transformers' probe (find_spec) sees none and never imports it
    # (it only fetches GPU kernels from the Hub)
    sys.modules["kernels"] = None

    def rms_norm_fn(x, weight, bias=None, eps=1e-6, **_):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(dtype)

    names = ["flash_attn", "flash_attn.ops", "flash_attn.ops.triton", "flash_attn.ops.triton.layer_norm"]
    for name in names:
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # transformers' availability probes read it
    sys.modules["flash_attn.ops.triton.layer_norm"].rms_norm_fn = rms_norm_fn
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def cast_mask(query, key, value, attn_mask=None, *args, **kwargs):
        if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.dtype != query.dtype:
            attn_mask = attn_mask.to(query.dtype)
        return sdpa(query, key, value, attn_mask, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = cast_mask


def _load(name: str, path: Path, package: bool = False):
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py" if package else path, submodule_search_locations=[str(path)] if package else None
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _sharpen(model, options: dict, residual_writers: list[str], embedding: str) -> None:
    """``tiny_checkpoints._adjust_weights``, then the q/k norms at :data:`QK_NORM_GAIN`."""
    import torch
    from tiny_checkpoints import _adjust_weights

    _adjust_weights(
        model,
        seed=options["seed"],
        embedding=embedding,
        head="lm_head.weight",
        residual_writers=residual_writers,
        mask_id=options["mask_id"],
        sharpness=options["sharpness"],
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight", "query_layernorm.weight", "key_layernorm.weight")):
                param.fill_(QK_NORM_GAIN)


def _model_class(family: str):
    if family == "sdar":
        package = _load("dlmsearch_upstream_sdar_model", REFERENCE["sdar"] / "model", package=True)
        return package.SDARConfig, package.SDARForCausalLM
    package = _load(f"dlmsearch_upstream_{family}_models", REFERENCE[family] / "models", package=True)
    return package.LLaDA2MoeConfig, package.LLaDA2MoeModelLM


def build(family: str, directory: Path, options: dict) -> None:
    """A tiny checkpoint from the family's own classes, with sharp deterministic weights."""
    import torch
    from safetensors.torch import save_file

    config_class, model_class = _model_class(family)
    fields = {k: v for k, v in options.items() if k not in ("seed", "sharpness", "mask_id", "eos_id", "block_size")}
    extra = {"fuse_cross_entropy": False} if family == "sdar" else {}
    config = config_class(
        **fields,
        **extra,
        mask_token_id=options["mask_id"],
        eos_token_id=options["eos_id"],
        pad_token_id=options["eos_id"],
    )
    config._attn_implementation = "sdpa"
    model = model_class(config).eval()
    params = dict(model.named_parameters())
    writers = [
        name
        for name in params
        if name.endswith(("self_attn.o_proj.weight", "attention.dense.weight", "down_proj.weight"))
    ]
    _sharpen(
        model, options, writers, "model.embed_tokens.weight" if family == "sdar" else "model.word_embeddings.weight"
    )
    generator = torch.Generator().manual_seed(options["seed"] + 1)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("expert_bias"):  # exercise the routing bias (zeros at initialisation)
                buffer.copy_(0.05 * torch.randn(buffer.shape, generator=generator))
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith("inv_freq")}
    save_file(state, str(directory / "model.safetensors"))
    model_type, architecture = (
        ("sdar", "SDARForCausalLM") if family == "sdar" else ("llada2_moe", "LLaDA2MoeModelLM")
    )  # LLaDA2.1: the same
    written = {
        **config.to_dict(),
        "model_type": model_type,
        "architectures": [architecture],
        "block_size": options["block_size"],
    }
    (directory / "config.json").write_text(json.dumps(written, indent=2))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": options["eos_id"]}))


def run(family: str, directory: Path, requests: list[dict], seed: int) -> list[dict]:
    """Each request decoded alone by the family's reference loop, with dlmsearch's draws."""
    import torch
    from safetensors.torch import load_file

    from dlmsearch.search.engine.summaries import inverse_cdf
    from dlmsearch.search.records.randomness import Stream, hashed_uniform

    config_class, model_class = _model_class(family)
    config = config_class.from_pretrained(str(directory))
    config._attn_implementation = "sdpa"
    model = model_class(config).eval()
    missing, unexpected = model.load_state_dict(load_file(str(directory / "model.safetensors")), strict=False)
    assert not unexpected and all(name.endswith("inv_freq") for name in missing), (missing[:5], unexpected[:5])
    generate = (
        _load("dlmsearch_upstream_sdar_generate", REFERENCE["sdar"] / "generate.py") if family == "sdar" else None
    )
    topk, multinomial_of_torch = torch.topk, torch.multinomial

    def stable_topk(values, k, dim=-1, largest=True, sorted=True):
        order = torch.sort(values, dim=dim, descending=largest, stable=True)
        return torch.return_types.topk(
            (order.values.narrow(dim, 0, int(k)).contiguous(), order.indices.narrow(dim, 0, int(k)).contiguous())
        )

    results = []
    for request in requests:
        state = {"calls": 0, "positions": None}

        def counted(forward):
            def call(*args, **kwargs):
                state["calls"] += 1
                state["positions"] = kwargs["position_ids"][0]
                return forward(*args, **kwargs)

            return call

        def multinomial(probs, num_samples):
            positions = state["positions"][-probs.shape[0] :]  # LLaDA2 samples the block's last columns of its forward
            keys = [
                torch.tensor(seed),
                torch.tensor(request["uid"]),
                torch.tensor(state["calls"] - 1),
                torch.tensor(0),
                positions,
                torch.tensor(Stream.TOKEN_SAMPLE),
            ]
            return inverse_cdf(probs, hashed_uniform(keys))[:, None]

        torch.multinomial, torch.topk = multinomial, stable_topk
        prompt = torch.tensor([request["prompt"]])
        try:
            if family == "sdar":

                class Counted:
                    """The model, counting its forwards and remembering the positions of the latest."""

                    device = model.device
                    __call__ = staticmethod(counted(model))

                    def eval(self):
                        return self

                out = generate.block_diffusion_generate(
                    Counted(),
                    {"input_ids": prompt},
                    request["mask_id"],
                    gen_length=request["gen_length"],
                    block_length=request["block_length"],
                    denoising_steps=request["steps"],
                    temperature=request["temperature"],
                    top_k=request.get("top_k", 0),
                    top_p=request.get("top_p", 1.0),
                    remasking_strategy=request["remasking"],
                    confidence_threshold=request["threshold"],
                    stopping_criteria_idx=request.get("stop"),
                )[0, prompt.shape[1] :]
            elif family == "llada21":
                sys.path.insert(0, str(UPSTREAM / "llada2"))  # its sampler imports dllm.core.samplers
                from dllm.pipelines.llada21.sampler import LLaDA21Sampler

                model.forward = counted(model.forward)
                sampler = LLaDA21Sampler(
                    model=model,
                    tokenizer=types.SimpleNamespace(mask_token_id=request["mask_id"], eos_token_id=request["eos_id"]),
                )
                out = sampler.sample(
                    [prompt[0]],
                    max_new_tokens=request["gen_length"],
                    block_size=request["block_length"],
                    temperature=request["temperature"],
                    top_p=request.get("top_p"),
                    top_k=request.get("top_k"),
                    threshold=request["threshold"],
                    editing_threshold=request["editing_threshold"],
                    max_post_steps=request["max_post_steps"],
                )[0, prompt.shape[1] :]
                del model.forward
            else:
                model.forward = counted(model.forward)
                out = model.generate(
                    prompt,
                    temperature=request["temperature"],
                    block_length=request["block_length"],
                    steps=request["steps"],
                    gen_length=request["gen_length"],
                    top_p=request.get("top_p"),
                    top_k=request.get("top_k"),
                    minimal_topk=request.get("minimal_topk", 1),
                    threshold=request["threshold"],
                    eos_id=request["eos_id"],
                    mask_id=request["mask_id"],
                )[0]
                del model.forward
        finally:
            torch.topk, torch.multinomial = topk, multinomial_of_torch
        results.append({"uid": request["uid"], "tokens": out.tolist(), "calls": state["calls"]})
    return results


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_checkpoints
    _stand_ins()
    import torch

    torch.set_num_threads(1)
    family, directory = spec["family"], Path(spec["directory"])
    if spec.get("build"):
        build(family, directory, spec["build"])
    answer = {
        "transformers": __import__("transformers").__version__,
        "results": run(family, directory, spec.get("requests", []), spec.get("seed", 0)),
    }
    Path(sys.argv[2]).write_text(json.dumps(answer))


if __name__ == "__main__":
    main()
