"""The licensed reference loops (Fast-dLLM's LLaDA and Dream), imported from a local copy.

dlmsearch must decode what these loops decode; the parity tests and the engine benchmark run
them beside dlmsearch on the same weights. A test helper, not part of the package (the wheel does
not carry it): the tests import it as ``upstream`` (pytest puts ``tests/`` on ``sys.path``), the
benchmark (``experiments/bench/sections.py``) adds ``tests/`` to ``sys.path`` itself. The code is never copied: it is imported from
``$DLMSEARCH_UPSTREAM`` (default ``../shared/upstream/fast-dllm`` beside the checkout) under
private module names, with the shims transformers 5.x needs applied to those private copies
(listed in ``tests/tiny_checkpoints.py``). Where the directory is absent,
:func:`upstream_missing_reason` says why and callers skip.

* :func:`llada_generate`, :func:`llada_generate_cached`: upstream ``llada/generate.py`` loops.
* :func:`llada_generate_guided`: LLaDA's ``generate(cfg_scale=...)`` from ``../pc-sampler`` (MIT).
* :func:`dream_generate`: upstream ``DreamGenerationMixin.diffusion_generate``.
* :func:`upstream_logits`: the upstream forward's float32 logits (Dream: unshifted).
* :func:`load_upstream`: an upstream model rebuilt from a LLaDA or Dream model directory.
* :func:`dllm_cache_generate`: dLLM-Cache's LLaDA loop with its hooks on an upstream LLaDA (``../dllm-cache``, Apache-2.0).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import sys
import threading
import warnings
from pathlib import Path

import torch

UPSTREAM: Path = Path(
    os.environ.get("DLMSEARCH_UPSTREAM") or Path(__file__).resolve().parents[2] / "shared" / "upstream" / "fast-dllm"
)

_REQUIRED_FILES = (
    "llada/generate.py",
    "llada/model/__init__.py",
    "llada/model/configuration_llada.py",
    "llada/model/modeling_llada.py",
    "dream/model/__init__.py",
    "dream/model/configuration_dream.py",
    "dream/model/modeling_dream.py",
    "dream/model/generation_utils.py",
)
_REQUIRED_PACKAGES = ("transformers", "einops", "safetensors")

# Distinct package names: both families call their package ``model``.
_LLADA_PACKAGE = "dlmsearch_upstream_llada_model"
_LLADA_GENERATE = "dlmsearch_upstream_llada_generate"
_DREAM_PACKAGE = "dlmsearch_upstream_dream_model"

_lock = threading.RLock()


def upstream_missing_reason() -> str | None:
    """Why the upstream reference code cannot be used here, or None when it can."""
    if not UPSTREAM.is_dir():
        return f"upstream reference code not found at {UPSTREAM} (set DLMSEARCH_UPSTREAM to a Fast-dLLM checkout; CI has ../shared/upstream/fast-dllm)"
    missing = [name for name in _REQUIRED_FILES if not (UPSTREAM / name).is_file()]
    if missing:
        return f"upstream reference code at {UPSTREAM} lacks {', '.join(missing)}"
    absent = [name for name in _REQUIRED_PACKAGES if importlib.util.find_spec(name) is None]
    if absent:
        return f"the upstream reference code needs {', '.join(absent)} (pip install {' '.join(absent)})"
    return None


# ---------------------------------------------------------------------------------------------
# Loading the upstream modules under private names, with the transformers 5.x shims
# ---------------------------------------------------------------------------------------------


def _load_package(name: str, directory: Path):
    """Import ``directory`` (a package with relative imports) as the package ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        raise
    return module


def _load_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@contextlib.contextmanager
def _auto_registries_restored():
    """Undo ``AutoConfig.register`` / ``AutoModel.register`` calls made by upstream imports."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    saved = []
    for mapping in (CONFIG_MAPPING, MODEL_MAPPING):
        extra = getattr(mapping, "_extra_content", None)
        if isinstance(extra, dict):
            saved.append((extra, dict(extra)))
    try:
        yield
    finally:
        for extra, before in saved:
            extra.clear()
            extra.update(before)


def _check_available() -> None:
    reason = upstream_missing_reason()
    if reason is not None:
        raise RuntimeError(reason)


@functools.cache
def _llada_modules():
    """(``llada/model`` package, ``llada/generate.py`` module), loaded once, shimmed."""
    _check_available()
    with _lock, _auto_registries_restored(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package = _load_package(_LLADA_PACKAGE, UPSTREAM / "llada" / "model")
        modeling = package.modeling_llada
        compiled = modeling.scaled_dot_product_attention
        original = getattr(compiled, "_torchdynamo_orig_callable", None) or getattr(compiled, "__wrapped__", None)
        if original is not None:
            modeling.scaled_dot_product_attention = original
        # generate.py does ``from model.modeling_llada import ...``: alias ``model`` while it imports.
        aliases = {
            "model": package,
            "model.modeling_llada": modeling,
            "model.configuration_llada": package.configuration_llada,
        }
        saved = {key: sys.modules.get(key) for key in aliases}
        sys.modules.update(aliases)
        try:
            generate = sys.modules.get(_LLADA_GENERATE) or _load_file(
                _LLADA_GENERATE, UPSTREAM / "llada" / "generate.py"
            )
        finally:
            for key, previous in saved.items():
                if previous is None:
                    sys.modules.pop(key, None)
                else:
                    sys.modules[key] = previous
    return package, generate


def _default_rope_parameters(config, device=None, seq_len=None, **rope_kwargs) -> tuple[torch.Tensor, float]:
    """transformers 4.x ``_compute_default_rope_parameters``: plain RoPE, no scaling."""
    if rope_kwargs:
        base, dim = rope_kwargs["base"], int(rope_kwargs["dim"])
    else:
        base = config.rope_theta
        partial = getattr(config, "partial_rotary_factor", 1.0)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * partial)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq, 1.0


@functools.cache
def _dream_package():
    """The ``dream/model`` package, loaded once, shimmed."""
    _check_available()
    with _lock, _auto_registries_restored(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package = _load_package(_DREAM_PACKAGE, UPSTREAM / "dream" / "model")
    modeling = package.modeling_dream
    if "default" not in modeling.ROPE_INIT_FUNCTIONS:
        modeling.ROPE_INIT_FUNCTIONS = {**modeling.ROPE_INIT_FUNCTIONS, "default": _default_rope_parameters}

    def validate(self, *args, **kwargs) -> None:  # upstream: ``def validate(self, is_init=False): pass``
        return None

    def from_model_config(cls, model_config):
        """transformers 4.x ``GenerationConfig.from_model_config`` for a non-composite config."""
        config_dict = model_config.to_dict() if not isinstance(model_config, dict) else dict(model_config)
        config_dict.pop("_from_model_config", None)
        config_dict = {key: value for key, value in config_dict.items() if value is not None}
        return cls.from_dict(config_dict, return_unused_kwargs=False, _from_model_config=True)

    generation_config_class = package.generation_utils.DreamGenerationConfig
    generation_config_class.validate = validate
    generation_config_class.from_model_config = classmethod(from_model_config)
    return package


# ---------------------------------------------------------------------------------------------
# Rebuilding an upstream model and running the upstream loops
# ---------------------------------------------------------------------------------------------


def load_upstream(directory: Path) -> torch.nn.Module:
    """The upstream model (float32, eval) of a directory written by :func:`build_llada` / :func:`build_dream`.

    Stands in for ``AutoModel.from_pretrained``, which fails under transformers 5.x for both
    families: builds the model from ``config.json`` with the shims above, then loads the
    safetensors weights (sharded or not) strictly.
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    drop = {"model_type", "architectures", "auto_map", "torch_dtype", "transformers_version", "use_cache"}
    fields = {k: v for k, v in config.items() if k not in drop}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if config["model_type"] == "llada":
            package, _ = _llada_modules()
            hf_config = package.configuration_llada.LLaDAConfig(use_cache=False, **fields)
            hf_config.use_cache = False
            model = package.modeling_llada.LLaDAModelLM(hf_config, init_params=False)
        elif config["model_type"] == "Dream":
            package = _dream_package()
            model = package.modeling_dream.DreamModel(package.configuration_dream.DreamConfig(**fields))
        else:
            raise ValueError(f"{directory}: model_type={config['model_type']!r} is neither llada nor Dream")
    index = directory / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    )
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(directory / name)))
    model.load_state_dict(state, strict=True)
    return model.to(torch.float32).eval()


# ---------------------------------------------------------------------------------------------
# Running the upstream loops
# ---------------------------------------------------------------------------------------------


def _prompt_row(model: torch.nn.Module, prompt: torch.Tensor) -> torch.Tensor:
    if prompt.dim() != 1:
        raise ValueError(f"prompt must be 1-D (one prompt), got shape {tuple(prompt.shape)}")
    return prompt.to(device=model.device, dtype=torch.long)[None]


def llada_generate(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    steps: int,
    gen_length: int,
    block_length: int,
    threshold: float | None = None,
    mask_id: int = 126336,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
) -> tuple[torch.Tensor, int]:
    """Upstream ``llada/generate.py`` ``generate()`` on one prompt (``remasking``: low_confidence
    or random); ``threshold=None`` is LLaDA's loop, a threshold Fast-dLLM's parallel decoding.
    Returns (the generated region, 1-D long, ``gen_length`` tokens; number of model calls)."""
    _, generate = _llada_modules()
    row = _prompt_row(model, prompt)
    x, nfe = generate.generate(
        model,
        row,
        steps=steps,
        gen_length=gen_length,
        block_length=block_length,
        temperature=temperature,
        remasking=remasking,
        mask_id=mask_id,
        threshold=threshold,
    )
    return x[0, row.shape[1] :].cpu(), int(nfe)


def llada_generate_module():
    """Fast-dLLM's ``llada/generate.py`` module as loaded here (to substitute its sampling calls in tests)."""
    return _llada_modules()[1]


@functools.cache
def pc_sampler_module():
    """PC-Sampler's ``generate.py`` (MIT; LLaDA's original ``generate()`` with ``cfg_scale``), loaded once.

    It puts its parent directory on ``sys.path`` when imported; that is undone here."""
    path = UPSTREAM.parent / "pc-sampler" / "generate.py"
    if not path.is_file():
        raise RuntimeError(f"PC-Sampler's reference code not found at {path}")
    saved = list(sys.path)
    try:
        return _load_file("dlmsearch_upstream_pc_sampler", path)
    finally:
        sys.path[:] = saved


@functools.cache
def dllm_cache_modules():
    """dLLM-Cache's package ``dllm_cache`` and its ``utils/generate_function.py`` (Apache-2.0), loaded once.

    The package imports itself by its own name, so its directory is on ``sys.path`` while it
    loads; its ``utils`` package is loaded by path under a private name (another ``utils`` may exist)."""
    root = UPSTREAM.parent / "dllm-cache"
    if not (root / "dllm_cache" / "__init__.py").is_file():
        raise RuntimeError(f"dLLM-Cache's reference code not found at {root}")
    saved = list(sys.path)
    sys.path.insert(0, str(root))
    try:
        import dllm_cache

        generate = _load_file("dlmsearch_upstream_dllm_cache_generate", root / "utils" / "generate_function.py")
    finally:
        sys.path[:] = saved
    return dllm_cache, generate


def _without_replace_position(hooked, x, attention_bias=None, layer_past=None, use_cache=False, replace_position=None):
    assert replace_position is None, "Fast-dLLM's own cache is not in use here"
    return hooked(x, attention_bias, layer_past, use_cache)


def dllm_cache_generate(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    steps: int,
    gen_length: int,
    block_length: int,
    prompt_interval: int,
    response_interval: int,
    ratio: float,
    mask_id: int,
) -> torch.Tensor:
    """dLLM-Cache's ``generate()`` on one prompt, its hooks registered on the upstream LLaDA's
    blocks for the call and removed after (the model is shared). The generated region, 1-D long."""
    package, generate = dllm_cache_modules()
    with _lock:
        package.cache.dLLMCache.new_instance(
            prompt_interval_steps=prompt_interval, gen_interval_steps=response_interval, transfer_ratio=ratio
        )
        package.register_cache_LLaDA(model, "model.transformer.blocks")
        for block in (
            model.model.transformer.blocks
        ):  # Fast-dLLM's model passes replace_position (None without its cache), which the hook does not take
            block.forward = functools.partial(_without_replace_position, block.forward)
        try:
            row = _prompt_row(model, prompt)
            out = generate.generate(
                row, None, model, steps=steps, gen_length=gen_length, block_length=block_length, mask_id=mask_id
            )
        finally:
            package.logout_cache_LLaDA(model, "model.transformer.blocks")
    return out[0].cpu()


@functools.cache
def klass_module():
    """KLASS's ``llada_klass.py`` (MIT; its ``stable_confident_decode``), loaded once."""
    path = UPSTREAM.parent / "klass" / "llada_klass.py"
    if not path.is_file():
        raise RuntimeError(f"KLASS's reference code not found at {path}")
    return _load_file("dlmsearch_upstream_klass", path)


def llada_generate_guided(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    steps: int,
    gen_length: int,
    block_length: int,
    cfg_scale: float,
    mask_id: int = 126336,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
) -> tuple[torch.Tensor, int]:
    """LLaDA's original ``generate(cfg_scale=...)`` (as PC-Sampler ships it) on one prompt: the row
    and its prompt-masked copy forwarded together, logits ``un + (s + 1)(cond - un)``. Returns
    (generated region, model calls: ``steps``)."""
    module = pc_sampler_module()
    row = _prompt_row(model, prompt)
    x = module.generate(
        model,
        row,
        steps=steps,
        gen_length=gen_length,
        block_length=block_length,
        temperature=temperature,
        cfg_scale=cfg_scale,
        remasking=remasking,
        mask_id=mask_id,
    )
    return x[0, row.shape[1] :].cpu(), steps


def llada_generate_cached(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    cache: str,
    steps: int,
    gen_length: int,
    block_length: int,
    threshold: float | None = None,
    mask_id: int = 126336,
) -> tuple[torch.Tensor, int]:
    """Fast-dLLM's KV-cache loops on one prompt: ``cache="prefix"`` is
    ``generate_with_prefix_cache``, ``cache="dual"`` is ``generate_with_dual_cache``
    (temperature 0, low-confidence remasking). Returns (generated region, number of model calls)."""
    _, generate = _llada_modules()
    loops = {"prefix": generate.generate_with_prefix_cache, "dual": generate.generate_with_dual_cache}
    if cache not in loops:
        raise ValueError(f"cache={cache!r}: expected 'prefix' or 'dual'")
    row = _prompt_row(model, prompt)
    x, nfe = loops[cache](
        model,
        row,
        steps=steps,
        gen_length=gen_length,
        block_length=block_length,
        temperature=0.0,
        remasking="low_confidence",
        mask_id=mask_id,
        threshold=threshold,
    )
    return x[0, row.shape[1] :].cpu(), int(nfe)


DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


def dream_generate(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    steps: int,
    gen_length: int,
    alg: str,
    temperature: float = 0.0,
    eps: float = 1e-3,
    **options,
) -> tuple[torch.Tensor, int]:
    """Upstream ``DreamGenerationMixin.diffusion_generate`` on one prompt (``max_new_tokens =
    gen_length``, no attention mask); ``options`` (``top_p``, ``top_k``, ``alg_temp``,
    ``generation_logits_hook_func``) are passed as given, so an option left out takes the
    generation config's value. Returns (generated region, 1-D long; number of model forward
    calls, counted with a forward hook -- it equals ``steps``). Its prints are silenced."""
    if alg not in DREAM_ALGS:
        raise ValueError(f"alg={alg!r}: expected one of {DREAM_ALGS}")
    row = _prompt_row(model, prompt)
    calls = [0]

    def count(module, args, output) -> None:
        calls[0] += 1

    handle = model.register_forward_hook(count)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            output = model.diffusion_generate(
                row,
                max_new_tokens=gen_length,
                steps=steps,
                alg=alg,
                temperature=temperature,
                eps=eps,
                return_dict_in_generate=True,
                output_history=False,
                **options,
            )
    finally:
        handle.remove()
    return output.sequences[0, row.shape[1] :].cpu(), calls[0]


def dream_attention_arguments(attention_mask: torch.Tensor | None):
    """(attention mask, ``tok_idx``) exactly as Dream's ``_sample`` passes them to the model for a
    2-D 0/1 padding mask: a ``[B, 1, L, L]`` boolean where query and key are both real, and the
    position ids it computes (which the upstream model ignores); ``("full", None)`` when nothing
    is padded."""
    if attention_mask is None or not torch.any(attention_mask == 0.0):
        return "full", None
    tok_idx = attention_mask.long().cumsum(-1) - 1
    tok_idx.masked_fill_(attention_mask == 0, 1)
    mask = torch.logical_and(attention_mask.unsqueeze(1).unsqueeze(-2), attention_mask.unsqueeze(1).unsqueeze(-1))
    return mask, tok_idx


def upstream_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Float32 logits ``[B, L, V]`` of the upstream forward.

    LLaDA: ``model(input_ids, attention_mask=...)`` (the upstream ignores the mask). Dream: the
    raw, unshifted ``.logits`` of ``model(x, mask, tok_idx)`` called as ``diffusion_generate``
    calls it (see :func:`dream_attention_arguments`). The mask token's column is large and
    negative (see :func:`without_mask_logit` before comparing with an absolute tolerance)."""
    input_ids = input_ids.to(device=model.device, dtype=torch.long)
    if attention_mask is not None:
        attention_mask = attention_mask.to(model.device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if _is_dream(model):
            mask, tok_idx = dream_attention_arguments(attention_mask)
            logits = model(input_ids, mask, tok_idx).logits
        else:
            logits = model(input_ids, attention_mask=attention_mask).logits
    return logits.float()


def without_mask_logit(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """``logits`` without the mask token's column, for comparing logits with an absolute tolerance.

    The mask logit is about -1e4 x (final-norm dim j), i.e. -5000 to -7000, so float32 rounding
    alone (ulp 5e-4 there) makes two implementations differ by ~1e-3 in that column, while the
    other logits (|x| < ~50) agree to ~1e-5. Compare the rest, or use a relative tolerance."""
    return torch.cat([logits[..., :mask_id], logits[..., mask_id + 1 :]], dim=-1)


def _is_dream(model: torch.nn.Module) -> bool:
    return getattr(model.config, "model_type", None) == "Dream"
