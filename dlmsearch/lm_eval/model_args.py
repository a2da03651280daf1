"""``--model_args`` checked before anything loads: the source, the sizes, the override keys (one-line errors)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ModelArgsError(ValueError):
    """A mistake in ``--model_args`` (path, family, decoder, key or value): ``python -m dlmsearch.lm_eval``
    prints it as one line, ``error: ...``, and exits 2."""


TEXT_FAMILIES = ("llada", "dream", "sdar", "llada2", "diffusion_gemma")  # conf/model/<family>.yaml with model.path=DIR
SHIPPED_TEXT_MODELS = (
    "countdown",
    "countdown_block",
    "countdown_uniform",
    "countdown_varied",
)  # the Countdown models dlmsearch ships (LLaDA's, SDAR's and DiffusionGemma's formats; LLaDA's on varied lengths)
NAMED_ARGS = (
    "path",
    "family",
    "decoder",
    "gen_length",
    "block_length",
    "batch_size",
    "cache",
    "device",
    "dtype",
    "chat",
    "temperature",
    "seed",
    "decoding",
)


def check_source(family: str, path: str | None) -> None:
    """Fail with one line unless ``family`` is a text model and ``path`` a local directory (nothing is downloaded)."""
    if family not in TEXT_FAMILIES + SHIPPED_TEXT_MODELS:
        raise ModelArgsError(
            f"model_args family must be a text model ({', '.join(TEXT_FAMILIES)}) or a shipped one ({', '.join(SHIPPED_TEXT_MODELS)}: no path needed), got {family!r}"
        )
    if path is None and family not in SHIPPED_TEXT_MODELS:
        raise ModelArgsError("model_args needs path=DIR: the local directory of the checkpoint (nothing is downloaded)")
    if path is not None and not Path(str(path)).expanduser().is_dir():
        raise ModelArgsError(
            f"model_args path={path} is not a directory: give the local directory of the checkpoint (nothing is downloaded)"
        )


def checked_sizes(gen_length: int | None, block_length: int | None, batch_size: int | str) -> int:
    """The batch size as an integer (lm-eval passes strings), after every size is checked positive."""
    if isinstance(batch_size, str) and batch_size.strip().isdigit():  # lm-eval's --batch_size 8 comes as a string
        batch_size = int(batch_size)
    if isinstance(batch_size, str):  # "auto" / "auto:N": decoding uses a fixed batch
        log.warning(
            "dlmsearch: batch_size=%s is not supported; decoding 8 at a time (model_args batch_size=N)", batch_size
        )
        batch_size = 8
    for name, value in (("gen_length", gen_length), ("block_length", block_length), ("batch_size", batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ModelArgsError(f"model_args {name} must be a positive integer, got {value!r}")
    return batch_size


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``model.*`` keys (for the model) and the rest (for the decoder); an unknown key fails with one line."""
    unknown = [
        k
        for k in overrides
        if k.split(".")[0].split("/")[0] not in ("model", "decoder", "engine", "decoding", "deadline_s")
    ]
    if unknown:
        raise ModelArgsError(
            f"unknown model_args: {', '.join(unknown)} (model_args take {', '.join(NAMED_ARGS)} and decoder.*, engine.*, decoding.*, model.* keys)"
        )
    model_keys = {k[len("model.") :]: v for k, v in overrides.items() if k.startswith("model.")}
    decoder_keys = {k: v for k, v in overrides.items() if not k.startswith("model.")}
    return model_keys, decoder_keys
