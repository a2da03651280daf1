"""SDAR's reference loop, run in the transformers it needs: a test helper executed as a subprocess.

SDAR's modeling file (``../shared/upstream/sdar``, Apache-2.0) needs transformers 4.52.x (4.57 and
5.x dropped ``LossKwargs``); dlmsearch's own environment has transformers 5. So the parity tests
run this file with ``PYTHONPATH`` led by a directory holding transformers 4.52.4
(:data:`REFERENCE_TRANSFORMERS`, installed by ``scripts/setup.sh`` in dev mode) and read its JSON
answer. Nothing here is imported by dlmsearch; the reference code is loaded from ``../shared``,
never copied, and never edited.

    python tests/sdar_reference.py SPEC.json OUT.json

The spec names a checkpoint to build (``build``: SDAR's ``SDARForCausalLM(SDARConfig(...))`` with the
deterministic sharp weights of ``tiny_checkpoints._adjust_weights``, the q/k norms at
:data:`QK_NORM_GAIN`; written with SDAR's own parameter names) and requests to decode one at a time
with ``block_diffusion_generate``. Its one multinomial draw per position is replaced by dlmsearch's
draw for that sample, model call and position (the inverse CDF of the same probabilities at the
counter-based uniform); ``torch.topk`` is made stable (ties: lower index), as dlmsearch breaks them.
Shims (to the loaded copies only): a stand-in module ``flash_attn.ops.triton.layer_norm`` whose
``rms_norm_fn`` is plain RMSNorm (the file imports it at the top; CPUs have no flash-attn).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

REFERENCE = Path(os.environ.get("DLMSEARCH_SDAR_UPSTREAM") or Path(__file__).resolve().parents[2] / "shared" / "upstream" / "sdar")
REFERENCE_TRANSFORMERS = Path(__file__).resolve().parents[1] / ".venv" / "reference" / "transformers-4.52.4"
QK_NORM_GAIN = 2.0  # q/k RMSNorm weights: sharp, position-dependent attention (the projections' gain is normalised away)


def missing_reason() -> str | None:
    """Why the reference cannot run here, or None."""
    if not (REFERENCE / "generate.py").is_file() or not (REFERENCE / "model" / "modeling_sdar.py").is_file():
        return f"SDAR's reference code not found at {REFERENCE} (CI has ../shared/upstream/sdar)"
    if not (REFERENCE_TRANSFORMERS / "transformers").is_dir():
        return f"transformers 4.52.4 for SDAR's modeling file not found at {REFERENCE_TRANSFORMERS} (bash scripts/setup.sh installs it)"
    return None


def _stand_ins() -> None:
    """``flash_attn.ops.triton.layer_norm.rms_norm_fn`` as plain RMSNorm (float32 statistics, as SDAR's commented-out path)."""
    import torch

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


def _load(name: str, path: Path, package: bool = False):
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py" if package else path, submodule_search_locations=[str(path)] if package else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build(directory: Path, options: dict) -> None:
    """A tiny SDAR checkpoint from SDAR's own classes, with sharp deterministic weights."""
    import torch
    from safetensors.torch import save_file

    from tiny_checkpoints import _adjust_weights

    package = _load("dlmsearch_upstream_sdar_model", REFERENCE / "model", package=True)
    fields = {k: v for k, v in options.items() if k not in ("seed", "sharpness", "mask_id", "eos_id")}
    config = package.SDARConfig(**fields, fuse_cross_entropy=False, mask_token_id=options["mask_id"], eos_token_id=options["eos_id"], pad_token_id=options["eos_id"])
    config._attn_implementation = "sdpa"
    model = package.SDARForCausalLM(config).eval()
    layers = range(config.num_hidden_layers)
    _adjust_weights(
        model, seed=options["seed"], embedding="model.embed_tokens.weight", head="lm_head.weight",
        residual_writers=[f"model.layers.{i}.{w}.weight" for i in layers for w in ("self_attn.o_proj", "mlp.down_proj")],
        mask_id=options["mask_id"], sharpness=options["sharpness"],
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.fill_(QK_NORM_GAIN)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    written = {**config.to_dict(), "model_type": "sdar", "architectures": ["SDARForCausalLM"], "block_size": options["block_size"]}
    (directory / "config.json").write_text(json.dumps(written, indent=2))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": options["eos_id"]}))


def run(directory: Path, requests: list[dict], seed: int) -> list[dict]:
    """Each request decoded alone by ``block_diffusion_generate``, with dlmsearch's draws."""
    import torch

    from dlmsearch.search.engine.summaries import inverse_cdf
    from dlmsearch.search.records.randomness import Stream, hashed_uniform

    package = _load("dlmsearch_upstream_sdar_model", REFERENCE / "model", package=True)
    generate = _load("dlmsearch_upstream_sdar_generate", REFERENCE / "generate.py")
    config = package.SDARConfig.from_pretrained(str(directory))
    config._attn_implementation = "sdpa"
    model = package.SDARForCausalLM(config).eval()
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(directory / "model.safetensors")))
    topk, multinomial_of_torch = torch.topk, torch.multinomial

    def stable_topk(values, k, dim=-1, largest=True, sorted=True):
        order = torch.sort(values, dim=dim, descending=largest, stable=True)
        return order.values.narrow(dim, 0, int(k)), order.indices.narrow(dim, 0, int(k))

    results = []
    for request in requests:
        state = {"calls": 0, "positions": None}

        class Counted:
            """The model, counting its forwards and remembering the positions of the latest."""

            device = model.device

            def eval(self):
                return self

            def __call__(self, *args, **kwargs):
                state["calls"] += 1
                state["positions"] = kwargs["position_ids"][0]
                return model(*args, **kwargs)

        def multinomial(probs, num_samples):
            keys = [torch.tensor(seed), torch.tensor(request["uid"]), torch.tensor(state["calls"] - 1), torch.tensor(0), state["positions"], torch.tensor(Stream.TOKEN_SAMPLE)]
            return inverse_cdf(probs, hashed_uniform(keys))[:, None]

        torch.multinomial, torch.topk = multinomial, stable_topk
        try:
            prompt = torch.tensor([request["prompt"]])
            out = generate.block_diffusion_generate(
                Counted(), {"input_ids": prompt}, request["mask_id"], gen_length=request["gen_length"], block_length=request["block_length"],
                denoising_steps=request["steps"], temperature=request["temperature"], top_k=request.get("top_k", 0), top_p=request.get("top_p", 1.0),
                remasking_strategy=request["remasking"], confidence_threshold=request["threshold"], stopping_criteria_idx=request.get("stop"),
            )
        finally:
            torch.topk, torch.multinomial = topk, multinomial_of_torch
        results.append({"uid": request["uid"], "tokens": out[0, prompt.shape[1]:].tolist(), "calls": state["calls"]})
    return results


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_checkpoints
    _stand_ins()
    import torch

    torch.set_num_threads(1)
    directory = Path(spec["directory"])
    if spec.get("build"):
        build(directory, spec["build"])
    answer = {"transformers": __import__("transformers").__version__, "results": run(directory, spec.get("requests", []), spec.get("seed", 0))}
    Path(sys.argv[2]).write_text(json.dumps(answer))


if __name__ == "__main__":
    main()
