"""Building model adapters from local files (Hydra ``_target_`` functions of ``conf/model/``).

Nothing here downloads: a path that does not exist fails with one line naming it.

A LLaDA or Dream directory names its own token ids; :func:`checkpoint_ids` reads them
(``config.json``, ``generation_config.json``, the tokenizer's files). ``conf/model/llada.yaml``
and ``dream.yaml`` take them through ``${checkpoint:KEY}`` (:func:`preset_id`), their
``fallback_ids`` only where the directory names nothing; an id given explicitly (a command-line
override, an argument of :func:`load_text_model`) must agree with the directory's.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.denoiser import BidirectionalDenoiser
from dlmsearch.shipped import package_data

if TYPE_CHECKING:
    import torch

    from dlmsearch.models.families import Family


def shipped_sudoku_model_path() -> Path:
    """Directory of the Sudoku denoiser shipped inside the package."""
    return package_data("sudoku_model")


def load_denoiser(
    path: str | None, mask_id: int, vocab_size: int, device: str = "cpu", dtype: str = "float32"
) -> ModelAdapter:
    """A :class:`BidirectionalDenoiser` saved as safetensors; ``path=None`` is the shipped Sudoku model."""
    directory = Path(path).expanduser() if path else shipped_sudoku_model_path()
    if not directory.is_dir():
        raise FileNotFoundError(f"model.path={directory} is not a directory")
    module = BidirectionalDenoiser.load(directory)
    if module.config.vocab_size != vocab_size:
        raise ValueError(
            f"model.vocab_size={vocab_size} but the checkpoint in {directory} has {module.config.vocab_size}"
        )
    return ModelAdapter(
        module=module,
        mask_id=mask_id,
        vocab_size=vocab_size,
        device=device,
        dtype=dtype,
        max_length=module.config.max_len,
    )


def resolve_device(device: str, dtype: str) -> tuple[str, str]:
    """``auto`` picks CUDA in bfloat16 when a GPU is present, else the CPU in float32."""
    import torch

    cuda = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


# ---------------------------------------------------------------------------------------------
# Token ids a checkpoint names
# ---------------------------------------------------------------------------------------------

ID_KEYS = ("mask_id", "vocab_size", "stop_ids", "block_size")
_ID_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
)


@attrs.frozen
class CheckpointIds:
    """The token ids a model directory's own files name (None or empty where they name none).

    ``stop_ids``: the EOS ids (``config.json``'s ``eos_token_id`` first, then
    ``generation_config.json``'s, int or list; else the tokenizer's ``eos_token``), then the
    family's end tokens the tokenizer has (LLaDA ``<|endoftext|>``, ``<|eot_id|>``; Dream
    ``<|endoftext|>``, ``<|im_end|>``). ``eos_ids`` are the ones the files call EOS: an
    explicit stop list must hold them (it may add more). ``mask_source`` / ``vocab_source``:
    ``(file, what it says)``; ``stop_source``: what the files say; for messages.
    """

    mask_id: int | None = None
    vocab_size: int | None = None
    stop_ids: tuple[int, ...] = ()
    eos_ids: tuple[int, ...] = ()
    mask_source: tuple[str, str] | None = None
    vocab_source: tuple[str, str] | None = None
    stop_source: str | None = None
    block_size: int | None = None  # a block-diffusion checkpoint's attention block (config.json's block_size)

    def value(self, key: str) -> Any:
        """``mask_id``, ``vocab_size``, ``stop_ids`` (a list) or ``block_size``, None where the files name none."""
        if key == "stop_ids":
            return list(self.stop_ids) or None
        return getattr(self, key)


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object file; ``{}`` where it does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def _token_id(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be a token id (a non-negative integer), got {value!r}")
    return value


def _token_ids(value: Any, where: str) -> tuple[int, ...]:
    """``eos_token_id``: one id or a list of them."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    return tuple(i for i in (_token_id(v, where) for v in values) if i is not None)


def _token_name(value: Any) -> str | None:
    """A tokenizer config's ``mask_token`` / ``eos_token``: a string or an ``AddedToken`` dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _tokenizer_vocabulary(directory: Path) -> dict[str, int]:
    """Token name -> id for the tokenizer's added tokens (and its model vocabulary, where a dict)."""
    names: dict[str, int] = {}
    tokenizer = _json_object(directory / "tokenizer.json")
    vocab = (tokenizer.get("model") or {}).get("vocab") if isinstance(tokenizer.get("model"), dict) else None
    if isinstance(vocab, dict):
        names.update({k: v for k, v in vocab.items() if isinstance(v, int)})
    for token in tokenizer.get("added_tokens") or []:
        if isinstance(token, dict) and isinstance(token.get("content"), str) and isinstance(token.get("id"), int):
            names[token["content"]] = token["id"]
    decoder = _json_object(directory / "tokenizer_config.json").get("added_tokens_decoder") or {}
    for number, token in decoder.items() if isinstance(decoder, dict) else ():
        content = _token_name(token)
        if content is not None and str(number).isdigit():
            names[content] = int(number)
    return names


def checkpoint_ids(directory: Path, family: str) -> CheckpointIds:
    """The mask id, vocabulary size and stop ids that the files in ``directory`` name.

    Mask: ``config.json``'s ``mask_token_id``, else ``generation_config.json``'s, else the
    tokenizer's ``mask_token``, else the family's mask token (``<|mdm_mask|>``, ``<|mask|>``) in
    the tokenizer. Vocabulary: ``config.json``'s ``vocab_size``. Stop ids: see
    :class:`CheckpointIds`. Read once per directory and version of its files.
    """
    directory = Path(directory).expanduser()
    stamp = tuple(
        (name, path.stat().st_mtime_ns, path.stat().st_size)
        for name in _ID_FILES
        if (path := directory / name).is_file()
    )
    return _checkpoint_ids(str(directory), family, stamp)


@functools.lru_cache(maxsize=64)
def _checkpoint_ids(directory_name: str, family: str, stamp: tuple[Any, ...]) -> CheckpointIds:
    from dlmsearch.models.families import FAMILIES

    directory = Path(directory_name)
    config = _json_object(directory / "config.json")
    generation = _json_object(directory / "generation_config.json")
    special = {
        **_json_object(directory / "special_tokens_map.json"),
        **_json_object(directory / "tokenizer_config.json"),
    }
    names = _tokenizer_vocabulary(directory)
    chosen = FAMILIES.get(family)
    mask_names = chosen.mask_tokens if chosen else ()
    stop_names = chosen.stop_tokens if chosen else ()

    mask_id, mask_source = None, None
    for file, data in (("config.json", config), ("generation_config.json", generation)):
        mask_id = _token_id(data.get("mask_token_id"), f"{directory / file}: mask_token_id")
        if mask_id is not None:
            mask_source = (file, f"mask_token_id={mask_id}")
            break
    if mask_id is None:
        declared = _token_name(special.get("mask_token"))
        for name in ([declared] if declared else []) + [n for n in mask_names if n != declared]:
            if name in names:
                mask_id, mask_source = names[name], ("tokenizer", f"{name} is id {names[name]}")
                break

    vocab_size = _token_id(config.get("vocab_size"), f"{directory / 'config.json'}: vocab_size")
    vocab_source = ("config.json", f"vocab_size={vocab_size}") if vocab_size is not None else None

    eos: list[int] = []
    said: list[str] = []
    for file, data in (("config.json", config), ("generation_config.json", generation)):
        ids = _token_ids(data.get("eos_token_id"), f"{directory / file}: eos_token_id")
        if ids:
            said.append(f"{file} eos_token_id={data['eos_token_id']}")
            eos += [i for i in ids if i not in eos]
    declared_eos = _token_name(special.get("eos_token"))
    if not eos and declared_eos in names:
        eos.append(names[declared_eos])
        said.append(f"the tokenizer's eos_token {declared_eos} is id {names[declared_eos]}")
    stop = list(eos)
    for name in stop_names:
        if name in names and names[name] not in stop:
            stop.append(names[name])
            said.append(f"the tokenizer's {name} is id {names[name]}")
    return CheckpointIds(
        mask_id=mask_id,
        vocab_size=vocab_size,
        stop_ids=tuple(stop),
        eos_ids=tuple(eos),
        mask_source=mask_source,
        vocab_source=vocab_source,
        stop_source=", ".join(said) or None,
        block_size=_token_id(config.get("block_size"), f"{directory / 'config.json'}: block_size"),
    )


def _plain(value: Any) -> Any:
    """A config value (ListConfig, DictConfig) as plain Python."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def preset_id(key: str, _parent_: Any) -> Any:
    """``${checkpoint:KEY}`` in ``conf/model/llada.yaml`` / ``dream.yaml``: the ``KEY``
    (``mask_id``, ``vocab_size``, ``stop_ids``) that the directory at ``model.path`` names
    (:func:`checkpoint_ids`), else the preset's ``fallback_ids.KEY``.

    The fallback is also what a config without a usable directory yet (``model.path`` unset or
    not a directory) shows; loading such a path fails later with its own message.
    """
    from omegaconf import OmegaConf

    if key not in ID_KEYS:
        raise ValueError(f"${{checkpoint:{key}}}: the key must be one of {', '.join(ID_KEYS)}")
    fallback = _plain(OmegaConf.select(_parent_, f"fallback_ids.{key}", default=None))
    path = None if OmegaConf.is_missing(_parent_, "path") else _parent_.get("path")
    directory = Path(str(path)).expanduser() if path not in (None, "") else None
    if directory is None or not directory.is_dir():
        return fallback
    named = checkpoint_ids(directory, str(_parent_.get("family"))).value(key)
    return fallback if named is None else named


def resolve_ids(
    directory: Path,
    family: str,
    mask_id: int | None,
    vocab_size: int | None,
    stop_ids: Any,
    fallback_ids: Any = None,
) -> tuple[int, int, list[int]]:
    """The ids to load with: each given one checked against what the directory names, each
    missing one taken from the directory, else from ``fallback_ids``. A disagreement fails with
    one line naming both values.

    Args:
        directory: the checkpoint's directory, whose files name its ids (:func:`checkpoint_ids`).
        family: the checkpoint's family (where its files keep the ids).
        mask_id: the caller's mask id, or None.
        vocab_size: the caller's vocabulary size, or None.
        stop_ids: the caller's stop ids (one id or a list; a config node is accepted), or None.
        fallback_ids: ``{key: value}`` taken where neither the caller nor the directory names one.
    """
    named = checkpoint_ids(directory, family)
    fallback = _plain(fallback_ids) or {}
    given = {"mask_id": mask_id, "vocab_size": vocab_size, "stop_ids": _plain(stop_ids)}
    if isinstance(given["stop_ids"], int) and not isinstance(given["stop_ids"], bool):
        given["stop_ids"] = [given["stop_ids"]]
    hint = "; leave model.{key} unset to take the checkpoint's"
    for key in ("mask_id", "vocab_size"):
        value, source = given[key], named.mask_source if key == "mask_id" else named.vocab_source
        if value is not None and source is not None and value != named.value(key):
            raise ValueError(f"model.{key}={value} but {directory / source[0]} says {source[1]}" + hint.format(key=key))
    stops = given["stop_ids"]
    if stops is not None:
        missing = [i for i in named.eos_ids if i not in stops]
        if missing:
            said = f" ({named.stop_source})" if named.stop_source else ""
            raise ValueError(
                f"model.stop_ids={list(stops)} lacks {missing}, which {directory} names as EOS{said}"
                + hint.format(key="stop_ids")
                + f", {list(named.stop_ids)}"
            )
    resolved: dict[str, Any] = {}
    for key in ("mask_id", "vocab_size", "stop_ids"):  # (a block size is the model's, checked where it loads)
        value = given[key]
        if value is None:
            value = named.value(key)
        if value is None:
            value = fallback.get(key)
        if value is None:
            raise ValueError(
                f"model.{key} is not set and {directory} names none (config.json, generation_config.json, tokenizer): set model.{key}=..."
            )
        resolved[key] = value
    stops = resolved["stop_ids"]
    return (
        resolved["mask_id"],
        resolved["vocab_size"],
        list(stops) if isinstance(stops, (list, tuple)) else [stops],
    )  # types: checked by ModelAdapter


def load_text_model(
    path: str | None,
    family: str,
    mask_id: int | None = None,
    vocab_size: int | None = None,
    stop_ids: list[int] | None = None,
    impl: str = "native",
    device: str = "auto",
    dtype: str = "auto",
    logits_eos_inf: bool = False,
    confidence_eos_eot_inf: bool = False,
    fallback_ids: dict[str, Any] | None = None,
    block_length: int | None = None,
    tensor_parallel: int = 1,
    full_attention: bool = False,
) -> ModelAdapter:
    """A LLaDA or Dream checkpoint from a local directory (the Hub is never contacted).

    ``impl=native`` runs dlmsearch's own transformer (exact padding, no remote code);
    ``impl=remote`` runs the checkpoint's own modeling code through transformers with
    ``trust_remote_code``; that code does not honour padding, so the engine forwards rows of
    different prompt lengths separately. ``logits_eos_inf`` (EOS never proposed) and
    ``confidence_eos_eot_inf`` (EOS/EOT proposals committed last) are LLaDA's switches.

    ``mask_id``, ``vocab_size``, ``stop_ids``: None takes the ones the directory names
    (:func:`checkpoint_ids`), else ``fallback_ids[key]``; a given one must agree with the
    directory's (stop ids: hold its EOS ids), else one line names both (:func:`resolve_ids`).

    Args:
        path: the checkpoint's local directory (required).
        family: the checkpoint's family, a key of ``FAMILIES`` (``llada``, ``dream``, ...).
        mask_id: the mask token's id; None takes the directory's.
        vocab_size: the vocabulary the decoders sample from (at most the model's output logits); None takes the directory's.
        stop_ids: the ids that end a generation (the first is EOS); None takes the directory's.
        impl: ``native`` (dlmsearch's transformer) or ``remote`` (the checkpoint's own code).
        device: ``cpu``, ``cuda``, ... or ``auto`` (:func:`resolve_device`).
        dtype: a torch dtype's name or ``auto`` (:func:`resolve_device`).
        logits_eos_inf: EOS is never proposed (LLaDA's switch).
        confidence_eos_eot_inf: EOS/EOT proposals are committed last (LLaDA's switch).
        fallback_ids: the ids to take where neither the caller nor the directory names one.
        block_length: a block-diffusion model's attention block; it must agree with ``config.json``'s ``block_size``.
        tensor_parallel: processes (of torchrun's) the native model is sharded over
            (:mod:`~dlmsearch.models.tensor_parallel`); 1: whole in this process.
        full_attention: decode a block-diffusion checkpoint with attention over the whole canvas (:func:`_with_full_attention`).
    """
    from dlmsearch.models.native import checkpoint_family, read_config
    from dlmsearch.models.tensor_parallel import join

    _check_choices(path, family, impl)
    group = join(_native_only(tensor_parallel, impl))
    directory = Path(path).expanduser()
    config = read_config(directory)
    checked = checkpoint_family(directory, config, family)
    if block_length is not None:
        config = _with_block_length(config, checked.block_diffusion, family, directory, block_length)
    if checked.block_diffusion and impl != "native":
        raise ValueError(
            f"model.impl={impl}: {family} is a block-diffusion model, which dlmsearch decodes with its native transformer only (block-causal attention, the exact block cache); use model.impl=native"
        )
    mask_id, vocab_size, stop_ids = resolve_ids(directory, family, mask_id, vocab_size, stop_ids, fallback_ids)
    device, dtype = resolve_device(device, dtype)
    eos = stop_ids[:1]
    module, max_length = _load_module(directory, config, checked, impl, device, dtype, vocab_size, group)
    module = _with_full_attention(module, checked.block_diffusion, family, full_attention)
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
        attention_block=module.config.block_size if impl == "native" else None,
    )


def _with_full_attention(module: Any, block_diffusion: bool, family: str, full_attention: bool) -> Any:
    """The native module, attending to the whole canvas when ``full_attention``: a block-diffusion
    checkpoint decoded as a masked-diffusion model (no attention blocks, no block cache, the
    decoding blocks ``task.block_length``), for a model trained so in the block format
    (``experiments/train_countdown_block.py attention=full``) or to see what block-causal attention
    does at decode time."""
    if not full_attention:
        return module
    if not block_diffusion:
        raise ValueError(
            f"model.full_attention=true: {family} already attends to the whole canvas; the switch is for block-diffusion checkpoints (sdar, llada2)"
        )
    module.config = attrs.evolve(module.config, block_size=None)
    return module


def _native_only(tensor_parallel: int, impl: str) -> int:
    """``tensor_parallel``, refused (one line) for the checkpoint's own code."""
    if tensor_parallel != 1 and impl != "native":
        raise ValueError(
            f"model.tensor_parallel={tensor_parallel} shards dlmsearch's native transformer only; model.impl={impl} runs "
            "the checkpoint's own code, which has no place for the all-reduce: use model.impl=native"
        )
    return tensor_parallel


def _check_choices(path: str | None, family: str, impl: str) -> None:
    """Fail with one line before anything is read when the path, family or implementation cannot be loaded."""
    from dlmsearch.models.families import FAMILIES

    if path in (None, "", "???"):
        raise ValueError(
            f"model.path is required: the local directory of the {family} checkpoint (the Hub is never contacted)"
        )
    if family not in FAMILIES:
        raise ValueError(f"model.family must be one of {', '.join(FAMILIES)}; got {family!r}")
    if impl not in ("native", "remote"):
        raise ValueError(f"model.impl must be native or remote; got {impl!r}")


def _with_block_length(
    config: dict[str, Any], block_diffusion: bool, family: str, directory: Path, block_length: int
) -> dict[str, Any]:
    """``config`` with the given attention block, which only a block-diffusion model has and must match the checkpoint's."""
    if not block_diffusion:
        raise ValueError(
            f"model.block_length is the attention block of block-diffusion models; {family} attends to the whole canvas (its decoding blocks are task.block_length)"
        )
    named = config.get("block_size")
    if named is not None and named != block_length:
        raise ValueError(
            f"model.block_length={block_length} but {directory / 'config.json'} has block_size={named}: the model attends in blocks of {named}"
        )
    return {**config, "block_size": block_length}


def _load_module(
    directory: Path,
    config: dict[str, Any],
    checked: Family,
    impl: str,
    device: str,
    dtype: str,
    vocab_size: int,
    group: Any = None,
) -> tuple[Any, int | None]:
    """The loaded module and its context length; the native transformer also checks the vocabulary fits its logits.

    Args:
        directory: the checkpoint's directory.
        config: its ``config.json`` (with the caller's block size, if given).
        checked: what :func:`~dlmsearch.models.native.checkpoint_family` found the checkpoint to be.
        impl: ``native`` or ``remote``.
        device: the resolved device.
        dtype: the resolved dtype's name.
        vocab_size: the vocabulary the decoders sample from.
        group: this rank's tensor-parallel group (:func:`~dlmsearch.models.tensor_parallel.join`), or None.
    """
    import torch

    from dlmsearch.models.native import load_native

    if impl == "native":
        module = load_native(directory, config, checked, device, getattr(torch, dtype), group)
        if vocab_size > module.config.vocab_size:
            raise ValueError(
                f"model.vocab_size={vocab_size} but the checkpoint in {directory} has {module.config.vocab_size} output logits"
            )
        return module, module.config.max_length
    module = _load_remote(directory, dtype)
    max_length = getattr(module.config, "max_sequence_length", None) or getattr(
        module.config, "max_position_embeddings", None
    )
    return module, max_length


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
        return Sampling(
            temperature=None if temperature is None else float(temperature),
            top_p=config.get("top_p"),
            top_k=config.get("top_k"),
        )
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from error


def _load_remote(directory: Path, dtype: str) -> torch.nn.Module:
    """The checkpoint's own modeling code (``trust_remote_code``), from local files only."""
    import torch
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(
            str(directory), trust_remote_code=True, local_files_only=True, dtype=getattr(torch, dtype)
        )
    except Exception as error:  # transformers raises many kinds; one line naming the directory
        raise RuntimeError(
            f"transformers could not load the remote code in {directory} ({type(error).__name__}: {error}); "
            "the default model.impl=native does not need it"
        ) from error
