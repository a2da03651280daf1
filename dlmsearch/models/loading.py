"""Building model adapters from local files (Hydra ``_target_`` functions of ``conf/model/``).

Nothing here downloads: a path that does not exist fails with one line naming it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.denoiser import BidirectionalDenoiser


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


def load_hf_model(
    path: str,
    mask_id: int,
    vocab_size: int,
    shift_logits: bool = False,
    device: str = "cpu",
    dtype: str = "bfloat16",
    trust_remote_code: bool = True,
) -> ModelAdapter:
    """A Hugging Face masked diffusion LM (LLaDA, Dream, ...) from a local directory only."""
    if path in (None, "", "???"):
        raise ValueError("model.path is required: the local directory of the downloaded model (the Hub is never contacted)")
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"model.path={directory} has no config.json; point it at a local model directory")
    import torch
    from transformers import AutoModel

    module = AutoModel.from_pretrained(
        str(directory), trust_remote_code=trust_remote_code, local_files_only=True, torch_dtype=getattr(torch, dtype)
    )
    max_length = getattr(module.config, "max_sequence_length", None) or getattr(module.config, "max_position_embeddings", None)
    return ModelAdapter(
        module=module, mask_id=mask_id, vocab_size=vocab_size, shift_logits=shift_logits, device=device, dtype=dtype, max_length=max_length
    )
