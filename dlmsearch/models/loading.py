"""Building model adapters from local files (Hydra ``_target_`` functions of ``conf/model/``).

Nothing here downloads: a path that does not exist fails with one line naming it.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.denoiser import BidirectionalDenoiser
from dlmsearch.core.sampling import Sampling

if TYPE_CHECKING:
    import torch


def shipped_sudoku_model_path() -> Path:
    """Directory of the Sudoku denoiser shipped inside the package."""
    return Path(str(resources.files("dlmsearch") / "data" / "sudoku_model"))


def load_denoiser(path: str | None, mask_id: int, vocab_size: int, device: str = "cpu", dtype: str = "float32") -> ModelAdapter:
    """A :class:`BidirectionalDenoiser` saved as safetensors; ``path=None`` is the shipped Sudoku model."""
    directory = Path(path).expanduser() if path else shipped_sudoku_model_path()
    if not directory.is_dir():
        raise FileNotFoundError(f"model.path={directory} is not a directory")
    module = BidirectionalDenoiser.load(directory)
    if module.config.vocab_size != vocab_size:
        raise ValueError(f"model.vocab_size={vocab_size} but the checkpoint in {directory} has {module.config.vocab_size}")
    return ModelAdapter(module=module, mask_id=mask_id, vocab_size=vocab_size, device=device, dtype=dtype, max_length=module.config.max_len)


def resolve_device(device: str, dtype: str) -> tuple[str, str]:
    """``auto`` picks CUDA in bfloat16 when a GPU is present, else the CPU in float32."""
    import torch

    cuda = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


def load_text_model(
    path: str | None,
    family: str,
    mask_id: int,
    vocab_size: int,
    stop_ids: list[int],
    impl: str = "native",
    device: str = "auto",
    dtype: str = "auto",
    logits_eos_inf: bool = False,
    confidence_eos_eot_inf: bool = False,
) -> ModelAdapter:
    """A LLaDA or Dream checkpoint from a local directory (the Hub is never contacted).

    ``impl=native`` runs dlmsearch's own transformer (exact padding, no remote code);
    ``impl=remote`` runs the checkpoint's own modeling code through transformers with
    ``trust_remote_code``; that code does not honour padding, so the engine forwards rows of
    different prompt lengths separately. ``logits_eos_inf`` (EOS never proposed) and
    ``confidence_eos_eot_inf`` (EOS/EOT proposals committed last) are LLaDA's switches.
    """
    import torch

    from dlmsearch.models.families import FAMILIES
    from dlmsearch.models.native import checkpoint_family, load_native, read_config

    if path in (None, "", "???"):
        raise ValueError(f"model.path is required: the local directory of the {family} checkpoint (the Hub is never contacted)")
    if family not in FAMILIES:
        raise ValueError(f"model.family must be one of {', '.join(FAMILIES)}; got {family!r}")
    if impl not in ("native", "remote"):
        raise ValueError(f"model.impl must be native or remote; got {impl!r}")
    directory = Path(path).expanduser()
    config = read_config(directory)
    checked = checkpoint_family(directory, config, family)
    checkpoint_mask = config.get("mask_token_id")
    if checkpoint_mask is not None and checkpoint_mask != mask_id:
        raise ValueError(f"model.mask_id={mask_id} but {directory / 'config.json'} says mask_token_id={checkpoint_mask}")
    device, dtype = resolve_device(device, dtype)
    eos = stop_ids[:1]
    if impl == "native":
        module = load_native(directory, config, checked, device, getattr(torch, dtype))
        max_length = module.config.max_length
    else:
        module = _load_remote(directory, dtype)
        max_length = getattr(module.config, "max_sequence_length", None) or getattr(module.config, "max_position_embeddings", None)
    return ModelAdapter(
        module=module,
        mask_id=mask_id,
        vocab_size=vocab_size,
        shift_logits=checked.shift_logits,
        device=device,
        dtype=dtype,
        max_length=max_length,
        honours_padding=impl == "native",
        suppressed_ids=list(eos) if logits_eos_inf else [],
        deferred_ids=list(stop_ids) if confidence_eos_eot_inf else [],
        stop_ids=list(stop_ids),
        generation_defaults=generation_defaults(directory),
    )


def generation_defaults(directory: Path) -> Sampling:
    """The sampling settings a checkpoint's ``generation_config.json`` gives (temperature, top-p,
    top-k; ``do_sample: false`` means temperature 0); unset where the file or the key is absent."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return Sampling()
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    temperature = config.get("temperature")
    if config.get("do_sample") is False:
        temperature = 0.0
    try:
        return Sampling(temperature=None if temperature is None else float(temperature), top_p=config.get("top_p"), top_k=config.get("top_k"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from error


def _load_remote(directory: Path, dtype: str) -> "torch.nn.Module":
    """The checkpoint's own modeling code (``trust_remote_code``), from local files only."""
    import torch
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(str(directory), trust_remote_code=True, local_files_only=True, dtype=getattr(torch, dtype))
    except Exception as error:  # transformers raises many kinds; one line naming the directory
        raise RuntimeError(
            f"transformers could not load the remote code in {directory} ({type(error).__name__}: {error}); "
            "the default model.impl=native does not need it"
        ) from error
