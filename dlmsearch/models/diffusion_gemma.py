"""DiffusionGemma (uniform-noise block diffusion) through transformers' own modules.

transformers (>= 5.25) ships the model (``transformers.models.diffusion_gemma``): one set of Gemma-4
weights run as an *encoder* (causal over the prompt and every finished canvas, writing a KV cache)
and as a *decoder* (bidirectional over the current canvas, reading that cache, with a
self-conditioning input). dlmsearch runs both modules as they are; this adapter only decides
what each call sees, so that a row's logits do not depend on its batch:

* **encoder calls** run one slot at a time against the slot's own ``DynamicCache`` (the reference
  loop's calls for one prompt, unchanged), once per finished canvas;
* **decoder calls** stack the rows' cached prefixes left-padded into one read-only prefix and
  pass the 4-D masks themselves (each row sees its own prefix and canvas; on sliding layers the last
  ``sliding_window - 1`` cached columns, as ``DynamicSlidingWindowLayer`` keeps them), with each
  row's own positions;
* attention runs through transformers' ``sdpa_attention_forward`` registered under its own name
  (``AttentionInterface``), with its sums in float64 on CPU, for the reason
  :func:`~dlmsearch.models.token_ops.attend` gives (the keys a batch pads in would reassociate them);
* the routed experts run through transformers' ``batched_mm`` on CPU, registered under its own name
  (``ExpertsInterface``, :func:`exact_experts`): its default ``grouped_mm`` multiplies each expert's
  tokens as one matrix, whose row count is the batch's, and a row's sums moved with it (every
  decoder logit by up to ~2e-5 beside batch-mates), so a sampled draw near a boundary, or an
  entropy near the keep-set's bound, decided differently batched and alone.

There is no mask token. The engine keeps a position the next step may replace ("open", noised) as
``mask_id = vocab_size``, one past the vocabulary, and fills it with keyed uniform ids before the
decoder sees it (``dlmsearch.search.engine.uniform_noise``); the id never reaches the model.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from dlmsearch.core.sampling import Sampling
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.models.loading import _json_object

EXACT_ATTENTION = "dlmsearch_exact"  # the name transformers' AttentionInterface knows dlmsearch's attention by
EXACT_EXPERTS = "dlmsearch_exact"  # the name transformers' ExpertsInterface knows dlmsearch's routed experts by


def exact_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
):
    """transformers' sdpa attention with its reductions in float64 on CPU, rounded back (decoding
    only: on CUDA or with gradients it runs as it is).

    Args:
        module: the attention layer (transformers passes it).
        query: ``[batch, heads, queries, head_dim]``.
        key: ``[batch, kv_heads, keys, head_dim]``.
        value: ``[batch, kv_heads, keys, head_dim]``.
        args: the attention mask, then sdpa's other positional arguments.
        kwargs: sdpa's keywords (``scaling``, ``is_causal``, ``sliding_window``, ...).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type != "cpu" or torch.is_grad_enabled():
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)
    mask = args[0] if args else kwargs.pop("attention_mask", None)
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    output, weights = sdpa_attention_forward(
        module, query.double(), key.double(), value.double(), mask, *args[1:], **kwargs
    )
    return output.to(query.dtype), weights


def exact_experts(
    module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' routed experts with each token's products its own on CPU (``batched_mm``: one
    small matrix product per token and expert, whatever else the call holds); decoding only: on
    CUDA or with gradients transformers' default ``grouped_mm`` runs as it is (see the module docstring).

    Args:
        module: the experts layer (transformers passes it).
        hidden_states: ``[tokens, hidden]``.
        top_k_index: ``[tokens, k]`` each token's experts.
        top_k_weights: ``[tokens, k]`` their weights.
    """
    from transformers.integrations.moe import batched_mm_experts_forward, grouped_mm_experts_forward

    if hidden_states.device.type != "cpu" or torch.is_grad_enabled():
        return grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    return batched_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)


def register_exact_experts() -> str:
    """Register :func:`exact_experts` with transformers' ``ExpertsInterface``; its name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(EXACT_EXPERTS, exact_experts)
    return EXACT_EXPERTS


def register_exact_attention() -> str:
    """Register :func:`exact_attention` (and sdpa's masks under the same name) with transformers; its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(EXACT_ATTENTION, exact_attention)
    AttentionMaskInterface.register(EXACT_ATTENTION, sdpa_mask)
    return EXACT_ATTENTION


@attrs.frozen
class _PrefixLayer:
    keys: torch.Tensor
    values: torch.Tensor


def _left_padded(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    """Each row's ``[1, kv_heads, n, dim]`` cached keys (or values), zero-padded on the left to ``width`` and stacked."""
    return torch.cat([F.pad(part, (0, 0, width - part.shape[-2], 0)) for part in parts])


@attrs.frozen
class _StackedPrefix:
    """What the decoder reads from ``cache``: per layer the rows' cached keys and values, left-padded (read only)."""

    layers: list[_PrefixLayer]
    is_compileable: bool = False

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].keys.shape[-2]


@attrs.define(eq=False)
class EncoderPrefixes:
    """Per slot: transformers' ``DynamicCache`` of everything encoded so far (prompt and finished
    canvases) and the canvas column where that prefix ends (-1: nothing encoded yet)."""

    caches: list[Any] = attrs.field(factory=list)
    end: torch.Tensor = attrs.field(factory=lambda: torch.zeros(0, dtype=torch.long))

    def reset(self, slots: int) -> None:
        self.caches = [None] * slots
        self.end = torch.full((slots,), -1, dtype=torch.long)

    def reorder(self, source: torch.Tensor) -> None:
        """Slot ``i`` takes slot ``source[i]``'s prefix; a prefix taken twice is copied (its layers
        are replaced, never written in place, by later encoder calls, so a shallow copy suffices)."""
        taken: set[int] = set()
        caches = []
        for s in source.tolist():
            cache = self.caches[s]
            if cache is not None and s in taken:
                cache = copy.copy(cache)
                cache.layers = [copy.copy(layer) for layer in cache.layers]
            taken.add(s)
            caches.append(cache)
        self.caches, self.end = caches, self.end[source]

    def admit(self, slots: int) -> None:
        self.caches = self.caches + [None] * slots
        self.end = torch.cat([self.end, torch.full((slots,), -1, dtype=torch.long)])

    def widen(self, columns: int) -> None:
        """Every canvas gained ``columns`` of left padding: the stored prefixes end that much later."""
        self.end = torch.where(self.end >= 0, self.end + columns, self.end)


@attrs.frozen
class _BranchMemory:
    """A lookahead branch's own memory of its canvas (what :class:`CanvasMemory` keeps per slot)."""

    start: int
    logits: torch.Tensor  # [L, V]
    draft: torch.Tensor  # [L]
    repeats: int


@attrs.define(eq=False)
class CanvasMemory:
    """Per slot, of the canvas it is denoising (its first column ``start``, -1: none): the last
    step's processed logits (the next step's self-conditioning input, in the model's dtype), the
    last draft (argmax) and how many steps in a row the draft has repeated (the stopping rule's
    stability). A slot that moves to a new canvas starts afresh, as the reference resets both.

    A lookahead branch (a row whose ``row_key`` is not its slot's root) reads its slot's memory
    until it has its own: after its first evaluation its memory is kept apart (``branches``, by
    slot and row key), so a branch rolled deeper continues the reference loop from its own step;
    the adopted branch's memory becomes its slot's (:meth:`adopt`), and the rest are dropped."""

    start: torch.Tensor = attrs.field(factory=lambda: torch.zeros(0, dtype=torch.long))
    logits: torch.Tensor | None = None  # [slots, L, V]
    draft: torch.Tensor | None = None  # [slots, L]
    repeats: torch.Tensor = attrs.field(factory=lambda: torch.zeros(0, dtype=torch.long))
    branches: dict[tuple[int, int], _BranchMemory] = attrs.field(factory=dict)

    def reset(self, slots: int) -> None:
        self.start = torch.full((slots,), -1, dtype=torch.long)
        self.logits = self.draft = None
        self.repeats = torch.zeros(slots, dtype=torch.long)
        self.branches = {}

    def reorder(self, source: torch.Tensor) -> None:
        self.start, self.repeats, self.branches = self.start[source], self.repeats[source], {}
        if self.logits is not None:
            self.logits, self.draft = self.logits[source.to(self.logits.device)], self.draft[source]

    def admit(self, slots: int) -> None:
        self.start = torch.cat([self.start, torch.full((slots,), -1, dtype=torch.long)])
        self.repeats = torch.cat([self.repeats, torch.zeros(slots, dtype=torch.long)])
        self.branches = {}
        if self.logits is not None:
            self.logits = torch.cat([self.logits, self.logits.new_zeros(slots, *self.logits.shape[1:])])
            self.draft = torch.cat([self.draft, self.draft.new_full((slots, self.draft.shape[1]), -1)])

    def widen(self, columns: int) -> None:
        self.start = torch.where(self.start >= 0, self.start + columns, self.start)

    def _read(
        self, slot: torch.Tensor, row_key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """Each row's memory: ``start``, logits, draft and repeats (a branch's own where it has one)."""
        start, repeats = self.start[slot].clone(), self.repeats[slot].clone()
        logits = None if self.logits is None else self.logits[slot.to(self.logits.device)]
        draft = None if self.draft is None else self.draft[slot].clone()
        for row, key in enumerate(zip(slot.tolist(), row_key.tolist()) if self.branches else ()):
            entry = self.branches.get(key)
            if entry is not None:
                start[row], repeats[row] = entry.start, entry.repeats
                logits[row], draft[row] = entry.logits.to(logits.device), entry.draft
        return start, logits, draft, repeats

    def conditioning(
        self, slot: torch.Tensor, start: torch.Tensor, row_key: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The rows' self-conditioning logits (zeros where a row has none) and ``[rows]`` which rows have them."""
        stored, logits, _, _ = self._read(slot, row_key)
        has = (stored == start) & (stored >= 0)
        return (logits if logits is not None and bool(has.any()) else None), has

    def repeated(
        self, slot: torch.Tensor, start: torch.Tensor, row_key: torch.Tensor, draft: torch.Tensor
    ) -> torch.Tensor:
        """``[rows]`` steps in a row the row's draft of this canvas has equalled ``draft`` (without storing it)."""
        stored, _, last, repeats = self._read(slot, row_key)
        if last is None:
            return torch.zeros(len(slot), dtype=torch.long)
        equal = (stored == start) & (last == draft).all(dim=1)
        return torch.where(equal, repeats + 1, 0)

    def remember(
        self,
        slot: torch.Tensor,
        start: torch.Tensor,
        row_key: torch.Tensor,
        root: torch.Tensor,
        logits: torch.Tensor,
        draft: torch.Tensor,
        repeats: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Keep the rows' processed logits and drafts for their next step (a slot's own row in the
        slot's memory, a branch in its own); ``[rows]`` how many steps in a row each draft has now
        repeated (0 at a canvas's first step).

        Args:
            slot: ``[rows]`` each row's slot.
            start: ``[rows]`` the first column of each row's canvas.
            row_key: ``[rows]`` each row's key (its slot's root, or a branch).
            root: ``[rows]`` rows that are their slot's own canvas.
            logits: ``[rows, L, V]`` the step's processed logits (in the dtype to keep).
            draft: ``[rows, L]`` the step's drafts.
            repeats: ``[rows]`` :meth:`repeated` of these rows, where the caller counted it before
                the write (None: counted here).
        """
        repeats = self.repeated(slot, start, row_key, draft) if repeats is None else repeats
        if self.logits is None:
            self.logits = logits.new_zeros(len(self.start), *logits.shape[1:])
            self.draft = torch.full((len(self.start), draft.shape[1]), -1, dtype=torch.long)
        at = root.nonzero().squeeze(1)
        self._store(slot[at], start[at], logits[at.to(logits.device)], draft[at], repeats[at])
        for row in (~root).nonzero().squeeze(1).tolist():
            key = (int(slot[row]), int(row_key[row]))
            self.branches[key] = _BranchMemory(
                int(start[row]), logits[row].clone(), draft[row].clone(), int(repeats[row])
            )
        return repeats

    def _store(
        self, slot: torch.Tensor, start: torch.Tensor, logits: torch.Tensor, draft: torch.Tensor, repeats: torch.Tensor
    ) -> None:
        self.logits[slot.to(self.logits.device)] = logits.to(self.logits.device)
        self.draft[slot], self.start[slot], self.repeats[slot] = draft, start, repeats

    def adopt(self, slot: torch.Tensor, row_key: torch.Tensor) -> None:
        """Each slot takes the memory of the branch it adopted (where that branch has its own), and
        every branch's memory is dropped: the lookahead is over."""
        for s, key in zip(slot.tolist(), row_key.tolist()):
            entry = self.branches.get((s, key))
            if entry is not None:
                at = torch.tensor([s])
                self._store(
                    at,
                    torch.tensor([entry.start]),
                    entry.logits[None],
                    entry.draft[None],
                    torch.tensor([entry.repeats]),
                )
        self.branches = {}


@attrs.define(eq=False)
class DiffusionGemmaAdapter(ModelAdapter):
    """A ``DiffusionGemmaForBlockDiffusion`` behind dlmsearch's model boundary (see the module docstring)."""

    canvas_length: int = 0
    pad_id: int = 0

    def __attrs_post_init__(self) -> None:
        self.module.config._attn_implementation = register_exact_attention()
        text = self.module.config.get_text_config()
        text._attn_implementation = EXACT_ATTENTION
        self.module.set_experts_implementation(register_exact_experts())
        super().__attrs_post_init__()
        self.capabilities = attrs.evolve(
            self.capabilities,
            name="DiffusionGemma",
            noise="uniform",
            canvas_length=self.canvas_length,
            media_ids=self._media_ids(),
            cache_policies=("none",),
            shadow=False,
            layerwise=False,
        )

    def _check_ids(self) -> None:
        """The open-position marker is one past the vocabulary (the model never sees it)."""
        if self.mask_id != self.vocab_size:
            raise ValueError(
                f"a uniform-noise model's open positions are marked vocab_size ({self.vocab_size}); got mask_id={self.mask_id}"
            )

    def _media_ids(self) -> tuple[int, ...]:
        """The ids that stand for image or audio inputs in this vocabulary (Gemma's image, begin- and end-of-image tokens)."""
        config = self.module.config
        names = ("image_token_id", "boi_token_id", "eoi_token_id", "audio_token_id", "boa_token_id", "eoa_token_id")
        found = (getattr(config, name, None) for name in names)
        return tuple(sorted({i for i in found if isinstance(i, int) and 0 <= i < self.vocab_size}))

    @property
    def never_proposed(self) -> list[int]:
        """No mask token: only suppressed ids are never proposed."""
        return list(self.suppressed_ids)

    @property
    def sliding_window(self) -> int | None:
        return getattr(self.module.config.get_text_config(), "sliding_window", None)

    def _layer_types(self) -> list[str]:
        return list(self.module.config.get_text_config().layer_types)

    @torch.no_grad()
    def encode(
        self, prefixes: EncoderPrefixes, slot: int, tokens: torch.Tensor, positions: torch.Tensor, end: int
    ) -> None:
        """One encoder call for one slot: ``tokens`` (``[n]``, at ``positions``) appended to its cached prefix, which then ends at column ``end``."""
        from transformers import DynamicCache

        cache = prefixes.caches[slot]
        if cache is None:
            cache = DynamicCache(config=self.module.config.get_text_config(decoder=True))
        self.module.model.encoder(
            input_ids=tokens[None].to(self.device), cache=cache, position_ids=positions[None].to(self.device)
        )
        prefixes.caches[slot] = cache
        prefixes.end[slot] = end

    @torch.no_grad()
    def denoise(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        prefixes: EncoderPrefixes,
        slot: torch.Tensor,
        conditioning: tuple[torch.Tensor | None, torch.Tensor],
    ) -> torch.Tensor:
        """One decoder call: float32 logits ``[rows, L, V]`` of the canvases ``tokens [rows, L]`` at
        ``positions [rows, L]``, each against its slot's encoded prefix, with its self-conditioning
        logits (``conditioning``: the logits or None, and ``[rows]`` which rows have them)."""
        caches = [prefixes.caches[s] for s in slot.tolist()]
        if any(c is None for c in caches):
            raise AssertionError("a row's prefix was not encoded before its decoder call")
        rows, length = tokens.shape
        layers, masks = [], {}
        for index, layer_type in enumerate(self._layer_types()):
            parts = [c.layers[index] for c in caches]
            cached = torch.tensor([p.keys.shape[-2] for p in parts])
            width = int(cached.max())
            layers.append(
                _PrefixLayer(
                    _left_padded([p.keys for p in parts], width), _left_padded([p.values for p in parts], width)
                )
            )
            if layer_type not in masks:  # the layers of one type hold the same cached columns
                visible = torch.arange(width + length)[None, :] >= (width - cached)[:, None]
                masks[layer_type] = visible[:, None, None, :].expand(rows, 1, length, width + length).to(self.device)
        logits, has = conditioning
        if logits is not None:
            logits = torch.where(has.to(logits.device)[:, None, None], logits, 0)
        out = self.module(
            decoder_input_ids=tokens.to(self.device),
            cache=_StackedPrefix(layers),
            self_conditioning_logits=logits,
            self_conditioning_mask=None if logits is None or bool(has.all()) else has.to(self.device),
            decoder_attention_mask=masks,
            decoder_position_ids=positions.to(self.device),
        )
        return out.logits[..., : self.vocab_size].float()


def _checkpoint_directory(path: str | None) -> Path:
    """The checkpoint's directory, checked to hold a ``model_type: diffusion_gemma`` config.json."""
    if path in (None, "", "???"):
        raise ValueError(
            "model.path is required: the local directory of the DiffusionGemma checkpoint (the Hub is never contacted)"
        )
    directory = Path(str(path)).expanduser()
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"model.path={directory}: no config.json there (a DiffusionGemma checkpoint directory is expected)"
        )
    model_type = _json_object(config_path).get("model_type")
    if model_type != "diffusion_gemma":
        raise ValueError(
            f"{config_path} has model_type={model_type!r}; model=diffusion_gemma loads model_type 'diffusion_gemma'"
        )
    return directory


def checkpoint_fields(path: str | None) -> dict[str, Any]:
    """What a DiffusionGemma directory declares, for its config (``${diffusion_gemma:KEY}``):
    ``vocab_size``, ``mask_id`` (open positions: one past the vocabulary), ``canvas_length``,
    ``stop_ids`` (generation_config.json's ``eos_token_id``, else config.json's) and ``pad_id``."""
    directory = _checkpoint_directory(path)
    config = _json_object(directory / "config.json")
    text = config.get("text_config") or {}
    if config.get("vision_config") and not text:
        raise ValueError(
            f"{directory / 'config.json'} has vision weights but no text_config: dlmsearch decodes DiffusionGemma's "
            "text model, which this checkpoint does not describe"
        )
    generation = _json_object(directory / "generation_config.json")
    vocab = text.get("vocab_size", config.get("vocab_size"))
    eos = generation.get("eos_token_id", text.get("eos_token_id", config.get("eos_token_id")))
    pad = generation.get("pad_token_id", text.get("pad_token_id", config.get("pad_token_id")))
    return {
        "vocab_size": vocab,
        "mask_id": vocab,
        "canvas_length": config.get("canvas_length"),
        "stop_ids": [eos] if isinstance(eos, int) else list(eos or []),
        "pad_id": 0 if pad is None else pad,
    }


def load_diffusion_gemma(
    path: str | None,
    device: str = "auto",
    dtype: str = "auto",
    vocab_size: int | None = None,
    mask_id: int | None = None,
    stop_ids: list[int] | None = None,
    block_length: int | None = None,
    tensor_parallel: int = 1,
) -> DiffusionGemmaAdapter:
    """A local ``model_type: diffusion_gemma`` checkpoint through transformers' own classes (the Hub
    is never contacted): its ids and ``canvas_length`` from its ``config.json`` /
    ``generation_config.json`` (:func:`checkpoint_fields`; a value given here must agree). Text only.

    Args:
        path: the checkpoint's local directory.
        device: ``cpu``, ``cuda``, ... or ``auto``.
        dtype: ``float32``, ``bfloat16`` or ``auto`` (bfloat16 on CUDA).
        vocab_size: the vocabulary (the checkpoint's).
        mask_id: the open-position marker (``vocab_size``).
        stop_ids: the ids that end an answer (the checkpoint's EOS).
        block_length: the canvas (the checkpoint's ``canvas_length``).
        tensor_parallel: processes (of torchrun's) the text layers are sharded over
            (:func:`~dlmsearch.models.tensor_parallel.parallelize_diffusion_gemma`); 1: whole in this process.
    """
    import sys

    from transformers import DiffusionGemmaForBlockDiffusion

    from dlmsearch.models.loading import _plain, resolve_device
    from dlmsearch.models.tensor_parallel import join, parallelize_diffusion_gemma

    fields = checkpoint_fields(path)
    given = {"vocab_size": vocab_size, "mask_id": mask_id, "stop_ids": stop_ids, "canvas_length": block_length}
    for key, value in given.items():
        if value is not None and _plain(value) != fields[key]:
            raise ValueError(f"model.{key}={_plain(value)} but the checkpoint in {path} has {fields[key]}")
    group = join(tensor_parallel)
    device, dtype = resolve_device(device, dtype)
    module = DiffusionGemmaForBlockDiffusion.from_pretrained(
        str(_checkpoint_directory(path)), local_files_only=True, dtype=getattr(torch, dtype), attn_implementation="sdpa"
    )
    if group is not None:
        module = module.to(device)
        for what in parallelize_diffusion_gemma(module, group):
            if group.rank == 0 and int(os.environ.get("RANK", "0")) == 0:
                print(f"model.tensor_parallel={tensor_parallel}: {what} stay replicated", file=sys.stderr)
        module.tensor_parallel = group  # as shard_model marks a native model: the adapter's capabilities read it
    return DiffusionGemmaAdapter(
        module=module,
        mask_id=fields["mask_id"],
        vocab_size=fields["vocab_size"],
        device=device,
        dtype=dtype,
        max_length=getattr(module.config.get_text_config(), "max_position_embeddings", None),
        stop_ids=fields["stop_ids"],
        generation_defaults=Sampling(),  # its temperature is a schedule: the decoder's
        canvas_length=fields["canvas_length"],
        pad_id=int(fields["pad_id"]),
    )


def generation_setting(path: str | None, key: str, default: Any) -> Any:
    """``generation_config.json``'s ``key`` (dotted: nested) in the directory ``path``, else ``default``
    (no directory, no file, no such key, or null: transformers' "unset")."""
    file = Path(str(path)).expanduser() / "generation_config.json" if path not in (None, "", "???") else None
    if file is None or not file.is_file():
        return default
    value: Any = _json_object(file)
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return default if value is None else value
