"""DiffusionGemma's reference loop (transformers' own ``generate``) with dlmsearch's keyed draws.

A test helper (issue 37's parity groundwork), not a test module and not imported by dlmsearch.
:func:`reference_generate` runs ``DiffusionGemmaGenerationMixin.generate`` (transformers 5.25,
``transformers/models/diffusion_gemma/generation_diffusion_gemma.py``; line numbers below are that
file's) for one prompt; :func:`reference_generate_batch` for left-padded prompts in one call. Its
random draws are replaced by dlmsearch's counter-based ones (:func:`hashed_uniform`) under the key
scheme below, so that dlmsearch's engine, drawing with the same keys, must reproduce the tokens and
the decoder-forward counts exactly. Every substitution is an attribute set on the model instance
(or on the generation module's ``torch`` name) for the duration of the call and removed after it;
nothing in transformers is edited.

**The loop, as the code runs it** (``generate``, 551-832; ``N = max_denoising_steps``,
``L = canvas_length``):

0. Configuration (642, 856-876): keywords > ``generation_config`` > ``model.generation_config`` >
   defaults (227-235: ``max_new_tokens`` 256, ``N`` 48, ``entropy_bound`` 0.1, ``t_min`` 0.4,
   ``t_max`` 0.8, ``stability_threshold`` 1, ``confidence_threshold`` 0.005). A field left None is
   filled by its default, so adaptive stopping cannot be switched off through the config (see
   ``stopping`` below). ``eos_token_id``/``pad_token_id`` are *not* defaulted: without them nothing
   stops at EOS and nothing is padded. ``max_new_canvases = ceil(max_new_tokens / L)`` (652).
   A ``DynamicCache`` (929); the compiled path (708-712) is only taken for a compileable (static)
   cache. The sampler, the processors (user ones first, then
   ``LinearTemperatureScheduleLogitsProcessor``, 1160-1181; the list passed in is *appended to*, so
   a reused ``LogitsProcessorList`` accumulates temperature processors: the harness copies it), the
   EOS/max-length criteria and ``StableAndConfidentStoppingCriteria`` are built once (700-703).
1. Per canvas ``k`` (720):
   a. **Encoder call** (722-742): the whole prompt at ``k = 0`` (prefill), else the previous
      canvas's ``L`` ids (945), at ``encoder_position_ids`` (684-686, then the previous canvas's
      decoder positions, 1119), causal masks over the cache (953-961, the 2-D ``attention_mask``);
      it appends to the cache. Every row of the batch is encoded, finished or not.
   b. ``_prepare_denoiser_inputs`` (964-999): the canvas is
      ``model_kwargs.pop("decoder_input_ids", sampler.initialize_canvas(...))`` (983-985): a given
      ``decoder_input_ids`` is used for the **first canvas only**, and the default (uniform ids,
      ``torch.randint``, 395-405) is drawn even when a canvas is given. No self-conditioning
      (``self_conditioning_logits=None``: the first step feeds zeros through the MLP). The decoder
      mask (989-994) is ``None`` when nothing is padded (sdpa then attends over all cached keys and
      the canvas: the last ``sliding_window - 1`` on sliding layers, everything on full layers),
      otherwise a bidirectional padding mask over cache + canvas. The stopping history is reset.
   c. Steps ``n = N, N-1, ..., 1`` (758). First ``decoder_forward_passes += ~(finished_denoising |
      finished_sequences)`` (761), then ``_denoising_step`` (1001-1074):
      i.   **Decoder call** (1027-1034) on the current canvas at positions
           ``cur_len .. cur_len + L - 1``, reading the cache without writing it; logits are float32,
           soft-capped (``30 * tanh(x / 30)``).
      ii.  ``processed = processors(logits)``; the temperature is
           ``t_min + (t_max - t_min) * (n / N)`` with ``n`` an int32 *tensor* (1022), so ``n / N``
           and ``t`` are float32 (298-317); ``processed = logits / t``.
      iii. ``probs = softmax(processed, dtype=float32)``; **token draw**
           ``torch.multinomial(probs.view(B * L, V), 1)`` at every position of every row (1039-1044);
           the draft is ``argmax(processed)`` (1045).
      iv.  **Acceptance** (``EntropyBoundSampler.accept_canvas``, 407-449): entropies of
           ``Categorical(logits=processed)``, ``torch.sort`` ascending (not stable: ties matter),
           keep sorted position ``i`` iff ``cumsum(H)_i - H_i <= entropy_bound`` (the entropies
           *before* it; the lowest-entropy position is always kept). Kept positions take the drawn
           token, the others keep the current one (448).
      v.   **Re-noising** (451-470): a full fresh uniform canvas (``initialize_canvas`` again,
           ``torch.randint``) is drawn, and every position not kept takes its id: nothing kept at an
           earlier step is protected.
      vi.  Rows already ``finished_denoising`` keep their previous argmax, canvas and
           self-conditioning logits (1056-1061; their draws are made and discarded); then
           ``finished_denoising |= stopping(argmax, processed)`` (1063): *stable* = the argmax
           equals each of the last ``stability_threshold`` argmaxes (history starts at -1, so never
           at a canvas's first step), *confident* = mean entropy of ``processed`` below
           ``confidence_threshold`` (504-538).
      vii. ``processed`` (cast to the embedding dtype) is the next step's self-conditioning (1066).
      The inner loop ends early when every row has ``finished_denoising`` (789).
   d. The **argmax draft** (not the sampled canvas) is appended (793). ``_finalize_canvas``
      (1077-1105): a row whose new canvas holds an EOS is finished; in that canvas everything after
      its first EOS becomes ``pad``; a row finished at an earlier canvas gets a whole canvas of
      ``pad``. The outer loop ends when every row is finished (809), else positions move on by ``L``
      (1108-1123).
2. Returned (829-832): ``sequences`` (prompt + whole canvases: **not cut** to ``max_new_tokens``;
   one-at-a-time, a sequence that met EOS has no canvases after that one), ``tokens_per_forward``
   (non-pad new ids / ``decoder_forward_passes``) and the cache. **The per-sample
   ``decoder_forward_passes`` counter itself is not returned**: the harness reads it from the
   ``_compute_tokens_per_forward`` call (835-854).

**Calls and counts** for one sample: per canvas one encoder call and ``s_k`` decoder calls,
``s_k = N`` unless adaptive stopping ends the canvas earlier (never at its first step; with
``stability_threshold = 1`` at the earliest at step 2). ``decoder_forward_passes = sum_k s_k``; the
model calls are ``sum_k (1 + s_k)``. In a batch a row's counter stops when it stops denoising or
finishes, though the batched forwards go on for every row.

**Key scheme** (:func:`hashed_uniform` keys, in dlmsearch's order, as
``dlmsearch/search/engine/rollout.py`` ``_prepare`` and ``block_reference.py`` use them):
``[seed, uid, call, row_key, position, stream]`` with

* ``call``: the index (from 0) of the model call *after which* the draw is made, counting both
  encoder and decoder calls of this sample in order: the encoder call of canvas ``k`` is call
  ``sum_{j<k} (1 + s_j)``, its decoder steps the next ``s_k`` calls. The encoder call counts as
  the engine counts the block cache's separate write ("two model calls for that row, its draws
  keyed by the second", ``RolloutEngine.evaluate``), so a canvas's first decoder step is keyed one
  past its encoder call.
  In a batch each row counts only its own calls: an encoder call only while the row is unfinished,
  a decoder call only while it is neither finished nor done denoising (as
  ``decoder_forward_passes`` counts); draws for other rows are discarded by the loop anyway.
* ``row_key``: 0 (the sample's own canvas; a lookahead branch would have its own).
* ``position``: the sample's own position of the canvas column, padding not counted:
  ``prompt_length + k * L + j`` for column ``j`` of canvas ``k`` (the engine's
  ``attention.cumsum() - 1``).
* ``stream`` and the draws:
  - token draw after decoder call ``c`` (1043): ``inverse_cdf(probs, u)`` with
    ``u = hashed_uniform([..., c, 0, position, Stream.TOKEN_SAMPLE])`` (dlmsearch's sampling draw);
  - uniform ids after call ``c`` (the canvas initialisation after encoder call ``c``, 984, and the
    re-noising after decoder call ``c``, 1050, one stream for both since their calls differ):
    ``min(floor(u * V), V - 1)`` with ``u = hashed_uniform([..., c, 0, position, RENOISE])`` in
    float64 arithmetic on the float32 ``u`` (:data:`RENOISE`: ``Stream.RENOISE`` once dlmsearch
    defines it, 4 until then). A given ``initial_canvas`` replaces canvas 0's initialisation.

**Batches.** ``generate`` takes a left-padded batch with a 2-D ``attention_mask`` (691-697).
Positions are shared by all rows (``encoder_position_ids`` / ``decoder_position_ids`` are
``arange(...).unsqueeze(0)``, 684-689): a row with ``p`` pads has its positions shifted by ``p``.
RoPE is relative, so attention scores agree with the unpadded run only up to rounding. Padding is
honoured through the masks only: the encoder's causal/sliding masks and the decoder's
bidirectional mask take the 2-D mask (the decoder's is ``None`` where no row is padded).
``tests/test_diffusion_gemma_reference.py`` measures the batched reference against one-at-a-time
on the tiny model (with keyed draws, which depend only on each row's own keys): every row's tokens,
decoder passes, steps per canvas and kept counts are identical, prompts of 1-13 ids (up to 12
pads, past the sliding window), rows finishing at EOS and rows stopping early included. With
torch's generator they could not be: ``multinomial``/``randint`` run over the whole batch.

**Stopping off.** ``stopping=False`` makes ``_prepare_diffusion_stopping_criteria`` return None,
the loop's own no-criteria path (1054): every canvas runs ``N`` decoder steps.

**Other quirks an integration meets.**

* ``pad_token_id`` (0 in Gemma) is an ordinary vocabulary id: a model can emit it, and
  ``tokens_per_forward`` then counts it as padding. ``eos_token_id`` may be a list; any of its ids
  ends the sequence.
* The encoder receives ``**model_kwargs`` too (734-740): a given ``decoder_input_ids`` reaches the
  first encoder call and is ignored there.
* The soft-capped logits bound every tempered logit to ``30 / t``; at ``t = 0.4`` probabilities
  below ``exp(-103)`` underflow to exactly 0 in float32, so an entropy can be exactly 0: a tiny
  ``confidence_threshold`` does not switch stopping off either (hence the None path above).
* ``use_bidirectional_attention="all"`` crashes this ``generate`` under sdpa: the text config's
  ``is_causal=False`` is injected into the attention kwargs while the layer passes ``is_causal``
  itself (``TypeError: ... multiple values for keyword argument 'is_causal'``).
* The ``image_token_id`` check (657-666) only warns, and only about the prompt; generated ids are
  never treated as images.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dlmsearch.search.engine.summaries import inverse_cdf
from dlmsearch.search.records.randomness import Stream, hashed_uniform

RENOISE = int(getattr(Stream, "RENOISE", 4))  # the uniform-id stream: canvas initialisation and re-noising
ROW_KEY = 0


@dataclass(frozen=True)
class ReferenceOutput:
    """One sample's result.

    Attributes:
        tokens: ``max_new_tokens`` ids: the new ids cut to ``max_new_tokens``, then ``pad`` where the
            sequence stopped earlier (one-at-a-time ``generate`` returns no canvas after the EOS one;
            a batch returns pad canvases there).
        generated: the new ids exactly as ``generate`` returned them (whole canvases).
        decoder_forward_passes: ``generate``'s own per-sample counter.
        canvas_steps: decoder calls per canvas this sample ran (its counter's increments per canvas).
        kept: per canvas, per decoder step of this sample, how many positions the EB-sampler kept
            (took their new draw; the rest were re-noised): ``len(kept[k]) == canvas_steps[k]``.
        encoder_calls: encoder calls this sample took part in while unfinished (one per canvas it ran).
        tokens_per_forward: ``generate``'s ``tokens_per_forward`` (non-pad new ids / decoder passes).
    """

    tokens: list[int]
    generated: list[int]
    decoder_forward_passes: int
    canvas_steps: list[int]
    kept: list[list[int]]
    encoder_calls: int
    tokens_per_forward: float

    @property
    def model_calls(self) -> int:
        """Encoder plus decoder calls: the count the key scheme's ``call`` runs over."""
        return self.encoder_calls + self.decoder_forward_passes


@dataclass(frozen=True)
class Settings:
    """The decode's parameters (``generate``'s keywords)."""

    max_new_tokens: int
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    max_denoising_steps: int = 48
    stopping: bool = True
    stability_threshold: int = 1
    confidence_threshold: float = 0.005


class _Keys:
    """Each row's call count, latest call and canvas positions, kept by hooks around ``generate``."""

    def __init__(self, seed: int, uids: Sequence[int], prompt_lengths: Sequence[int], canvas: int) -> None:
        rows = len(uids)
        self.seed = torch.tensor(seed)
        self.uid = torch.tensor(list(uids), dtype=torch.long)
        self.prompt_length = torch.tensor(list(prompt_lengths), dtype=torch.long)
        self.canvas_length = canvas
        self.canvas = -1
        self.calls = torch.zeros(rows, dtype=torch.long)
        self.latest = torch.full((rows,), -1, dtype=torch.long)
        self.finished = torch.zeros(rows, dtype=torch.bool)
        self.encoder_calls = torch.zeros(rows, dtype=torch.long)
        self.canvas_steps: list[list[int]] = [[] for _ in range(rows)]
        self.kept: list[list[list[int]]] = [[] for _ in range(rows)]
        self.active = torch.zeros(rows, dtype=torch.bool)
        self.forwards = {"encoder": 0, "decoder": 0, "steps": 0}
        self.decoder_forward_passes: torch.Tensor | None = None

    def called(self, active: torch.Tensor) -> None:
        self.calls += active.long()
        self.latest = torch.where(active, self.calls - 1, self.latest)

    def encoder(self) -> None:
        self.canvas += 1
        active = ~self.finished
        self.called(active)
        self.encoder_calls += active.long()
        for row in active.nonzero().flatten().tolist():
            self.canvas_steps[row].append(0)
            self.kept[row].append([])

    def decoder_step(self, finished_denoising: torch.Tensor) -> None:
        active = ~(finished_denoising.cpu() | self.finished)
        self.active = active
        self.called(active)
        self.forwards["steps"] += 1
        for row in active.nonzero().flatten().tolist():
            self.canvas_steps[row][-1] += 1

    def accepted(self, mask: torch.Tensor) -> None:
        counts = mask.sum(dim=-1).cpu()
        for row in self.active.nonzero().flatten().tolist():
            self.kept[row][-1].append(int(counts[row]))

    def uniform(self, stream: int) -> torch.Tensor:
        """``[rows, L]`` uniforms for the current canvas's columns after each row's latest call."""
        position = self.prompt_length[:, None] + self.canvas * self.canvas_length + torch.arange(self.canvas_length)
        keys = [self.seed, self.uid[:, None], self.latest[:, None], torch.tensor(ROW_KEY), position]
        return hashed_uniform([*keys, torch.tensor(stream)])


class _TorchWithKeyedMultinomial:
    """The generation module's ``torch``, but ``multinomial`` draws with the keys."""

    def __init__(self, keys: _Keys) -> None:
        self._keys = keys

    def multinomial(self, probs: torch.Tensor, num_samples: int) -> torch.Tensor:
        assert num_samples == 1 and probs.dim() == 2, (num_samples, probs.shape)
        rows, length = len(self._keys.uid), self._keys.canvas_length
        uniform = self._keys.uniform(int(Stream.TOKEN_SAMPLE)).to(probs.device)
        return inverse_cdf(probs.view(rows, length, -1), uniform).reshape(rows * length, 1)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _keyed_ids(keys: _Keys, vocab_size: int, device: torch.device) -> torch.Tensor:
    uniform = keys.uniform(RENOISE).double()
    return torch.floor(uniform * vocab_size).long().clamp_(max=vocab_size - 1).to(device)


@contextlib.contextmanager
def _instance_patches(obj: Any, **attributes: Any) -> Iterator[None]:
    """Set attributes on one object (shadowing its class's) and remove them afterwards."""
    assert not any(name in vars(obj) for name in attributes), "already patched"
    try:
        for name, value in attributes.items():
            setattr(obj, name, value)
        yield
    finally:
        for name in attributes:
            vars(obj).pop(name, None)


@contextlib.contextmanager
def _hooks(model: Any, keys: _Keys, settings: Settings, substitute: bool) -> Iterator[None]:
    """The counting hooks (always) and the draw substitutions (``substitute``) on ``model``."""
    from transformers.models.diffusion_gemma import generation_diffusion_gemma as generation

    cls = type(model)
    encoder_module = model.model.encoder
    encoder_forward, decoder_forward = encoder_module.forward, model.forward

    def prepare_encoder_inputs(*args: Any, **kwargs: Any):
        keys.encoder()
        return cls._prepare_encoder_inputs(model, *args, **kwargs)

    def denoising_step(*args: Any, **kwargs: Any):
        keys.decoder_step(kwargs["finished_denoising"])
        return cls._denoising_step(model, *args, **kwargs)

    def finalize_canvas(*args: Any, **kwargs: Any):
        input_ids, finished = cls._finalize_canvas(*args, **kwargs)
        keys.finished = finished.cpu().clone()
        return input_ids, finished

    def compute_tokens_per_forward(input_ids, decoder_forward_passes, *args: Any, **kwargs: Any):
        keys.decoder_forward_passes = decoder_forward_passes.cpu().clone()
        return cls._compute_tokens_per_forward(input_ids, decoder_forward_passes, *args, **kwargs)

    def counted(kind: str, forward):
        def call(*args: Any, **kwargs: Any):
            keys.forwards[kind] += 1
            return forward(*args, **kwargs)

        return call

    def prepare_sampler(generation_config):
        sampler = cls._prepare_sampler(model, generation_config)
        accept_canvas = sampler.accept_canvas

        def accept_and_count(*args: Any, **kwargs: Any):
            accepted = accept_canvas(*args, **kwargs)
            keys.accepted(sampler.accepted_token_mask)
            return accepted

        sampler.accept_canvas = accept_and_count
        if substitute:  # an instance attribute: renoise_canvas calls self.initialize_canvas too
            sampler.initialize_canvas = lambda batch_size, device: _keyed_ids(keys, sampler.vocab_size, device)
        return sampler

    patches = {
        "_prepare_encoder_inputs": prepare_encoder_inputs,
        "_denoising_step": denoising_step,
        "_finalize_canvas": finalize_canvas,
        "_compute_tokens_per_forward": compute_tokens_per_forward,
        "_prepare_sampler": prepare_sampler,
        "forward": counted("decoder", decoder_forward),
    }
    if not settings.stopping:
        patches["_prepare_diffusion_stopping_criteria"] = lambda generation_config: None
    with contextlib.ExitStack() as stack:
        stack.enter_context(_instance_patches(model, **patches))
        stack.enter_context(_instance_patches(encoder_module, forward=counted("encoder", encoder_forward)))
        if substitute:
            saved = generation.torch
            generation.torch = _TorchWithKeyedMultinomial(keys)
            stack.callback(setattr, generation, "torch", saved)
        yield


def reference_generate_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    settings: Settings,
    *,
    seed: int,
    uids: Sequence[int],
    initial_canvases: Sequence[Sequence[int]] | None = None,
    substitute: bool = True,
    logits_processors: Sequence[Any] = (),
) -> list[ReferenceOutput]:
    """``model.generate`` on the prompts, left-padded into one batch (one prompt: no padding).

    Args:
        model: a ``DiffusionGemmaForBlockDiffusion``.
        prompts: the prompts' ids.
        settings: the decode's parameters.
        seed: the draws' first key (``substitute=False``: the global generator's seed, forked).
        uids: each prompt's sample id: the draws' second key.
        initial_canvases: the first canvas of each row (``decoder_input_ids``); None: drawn.
        substitute: draw with dlmsearch's keyed uniforms (True) or torch's generator (False).
        logits_processors: processors run before the temperature schedule (copied per call).
    """
    from transformers import LogitsProcessorList
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    pad = model.generation_config.pad_token_id
    eos = model.generation_config.eos_token_id
    pad = model.config.get_text_config().pad_token_id if pad is None else pad
    eos = model.config.get_text_config().eos_token_id if eos is None else eos
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    canvas = model.config.canvas_length
    keys = _Keys(seed, uids, [len(p) for p in prompts], canvas)
    kwargs: dict[str, Any] = {
        "max_new_tokens": settings.max_new_tokens,
        "max_denoising_steps": settings.max_denoising_steps,
        "sampler_config": EntropyBoundSamplerConfig(entropy_bound=float(settings.entropy_bound)),
        "t_min": settings.t_min,
        "t_max": settings.t_max,
        "stability_threshold": settings.stability_threshold,
        "confidence_threshold": float(settings.confidence_threshold),
        "eos_token_id": eos,
        "pad_token_id": pad,
        "return_dict_in_generate": True,
        "logits_processor": LogitsProcessorList(list(logits_processors)),
    }
    if width != min(len(p) for p in prompts):
        kwargs["attention_mask"] = attention_mask
    if initial_canvases is not None:
        kwargs["decoder_input_ids"] = torch.tensor([list(c) for c in initial_canvases])
    with contextlib.ExitStack() as stack:
        stack.enter_context(_hooks(model, keys, settings, substitute))
        if not substitute:
            stack.enter_context(torch.random.fork_rng(devices=[]))
            torch.manual_seed(seed)
        out = model.generate(input_ids, **kwargs)
    assert keys.forwards["decoder"] == keys.forwards["steps"], keys.forwards
    assert keys.forwards["encoder"] == keys.canvas + 1, keys.forwards
    passes = keys.decoder_forward_passes
    assert passes is not None, "generate did not report its decoder_forward_passes"
    results = []
    for row in range(len(prompts)):
        generated = out.sequences[row, width:].tolist()
        tokens = (generated + [pad] * settings.max_new_tokens)[: settings.max_new_tokens]
        results.append(
            ReferenceOutput(
                tokens=tokens,
                generated=generated,
                decoder_forward_passes=int(passes[row]),
                canvas_steps=keys.canvas_steps[row],
                kept=keys.kept[row],
                encoder_calls=int(keys.encoder_calls[row]),
                tokens_per_forward=float(out.tokens_per_forward[row]),
            )
        )
    return results


def reference_generate(
    model: Any,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    entropy_bound: float = 0.1,
    t_min: float = 0.4,
    t_max: float = 0.8,
    max_denoising_steps: int = 48,
    stopping: bool = True,
    seed: int = 0,
    uid: int = 0,
    initial_canvas: Sequence[int] | None = None,
    substitute: bool = True,
    logits_processors: Sequence[Any] = (),
    stability_threshold: int = 1,
    confidence_threshold: float = 0.005,
) -> ReferenceOutput:
    """transformers' ``generate`` for one prompt, with dlmsearch's keyed draws (see the module docstring).

    Args:
        model: a ``DiffusionGemmaForBlockDiffusion``.
        prompt_ids: the prompt's ids.
        max_new_tokens: the generation length (a partial last canvas is still denoised whole).
        entropy_bound: the EB-sampler's bound.
        t_min: the temperature at step 1.
        t_max: the temperature the schedule starts from (step ``N`` has ``t_min + (t_max - t_min)``).
        max_denoising_steps: ``N``, the steps per canvas without adaptive stopping.
        stopping: adaptive (stable and confident) stopping per canvas, or always ``N`` steps.
        seed: the draws' first key.
        uid: the sample's id: the draws' second key.
        initial_canvas: the first canvas (``decoder_input_ids``); None: drawn.
        substitute: keyed draws (True) or torch's own generator seeded with ``seed`` (False).
        logits_processors: processors applied before the temperature schedule.
        stability_threshold: steps the argmax must repeat to count as stable.
        confidence_threshold: the mean entropy below which a canvas is confident.
    """
    settings = Settings(
        max_new_tokens=max_new_tokens,
        entropy_bound=entropy_bound,
        t_min=t_min,
        t_max=t_max,
        max_denoising_steps=max_denoising_steps,
        stopping=stopping,
        stability_threshold=stability_threshold,
        confidence_threshold=confidence_threshold,
    )
    canvases = None if initial_canvas is None else [initial_canvas]
    return reference_generate_batch(
        model,
        [prompt_ids],
        settings,
        seed=seed,
        uids=[uid],
        initial_canvases=canvases,
        substitute=substitute,
        logits_processors=logits_processors,
    )[0]


__all__ = ["RENOISE", "ReferenceOutput", "Settings", "reference_generate", "reference_generate_batch"]
