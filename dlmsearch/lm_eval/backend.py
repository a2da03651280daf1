"""The ``dlmsearch`` model of lm-evaluation-harness: importing this module registers it.

Requests are decoded through :mod:`dlmsearch.api` (one model, one decoder, batches of
``batch_size``), so a context gives the same text as ``python -m dlmsearch`` with
``task=prompts``. Masked diffusion decoding gives no left-to-right likelihoods here, so
``loglikelihood`` tasks (multiple choice, perplexity) are refused with a clear error.

Model args (``--model_args k=v,k=v``): ``path`` (local checkpoint directory), ``family``
(llada|dream|sdar|llada2|diffusion_gemma, or countdown / countdown_block / countdown_uniform / countdown_varied: the shipped Countdown models, no path needed), ``decoder`` (a preset of ``conf/decoder/``), ``gen_length`` (used when a request
gives no ``max_gen_toks``) and ``block_length`` (unset: what the model was trained for, as
``python -m dlmsearch`` takes them, else 256 in blocks of 32), ``batch_size``, ``cache`` (none|prefix|dual; unset: the config's, none),
``device`` (auto|cpu|cuda...), ``dtype``, ``chat`` (true: each context is one user turn of the
tokenizer's chat template, Instruct models; false: raw text, Base models), ``temperature``
(unset: the request's, greedy unless it samples), ``seed`` (unset: 0), ``decoding`` (text|sudoku), plus any
``decoder.*``, ``engine.*``, ``decoding.*`` key (e.g. ``decoder.commit.threshold=0.8``) and
``model.*`` key (e.g. ``model.logits_eos_inf=true``).
"""

from __future__ import annotations

from typing import Any

try:
    import lm_eval.models  # noqa: F401  (lm-eval's own models stay registered beside ours)
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "dlmsearch.lm_eval needs lm-evaluation-harness, the lm_eval extra: pip install -e '.[lm_eval]' in a clone of dlmsearch, "
        "or pip install 'dist/dlmsearch-<version>-py3-none-any.whl[lm_eval]' for a wheel (dlmsearch is not on PyPI), "
        "or pip install 'lm-eval>=0.4.13,<0.5'"
    ) from error

from dlmsearch.api import Decoder, Model
from dlmsearch.config import build
from dlmsearch.lm_eval.model_args import ModelArgsError, check_source, checked_sizes, split_overrides
from dlmsearch.lm_eval.request_kwargs import MAX_TOKEN_KEYS, cut_at_stop, gen_length_for, stop_sequences

LOGLIKELIHOOD_ERROR = (
    "dlmsearch decodes; log-likelihood requests are not supported (output_type loglikelihood, "
    "loglikelihood_rolling and multiple_choice tasks): masked diffusion decoding gives no left-to-right "
    "likelihoods here. Choose generate_until tasks such as gsm8k."
)


@register_model("dlmsearch")
class DLMSearchLM(LM):
    """lm-eval's view of a dlmsearch decoder over a text checkpoint (LLaDA, Dream, SDAR, LLaDA2.x)."""

    def __init__(
        self,
        path: str | None = None,
        family: str = "llada",
        decoder: str = "adalook",
        gen_length: int | None = None,
        block_length: int | None = None,
        batch_size: int | str = 8,
        cache: str | None = None,
        device: str | None = "auto",
        dtype: str = "auto",
        chat: bool = True,
        temperature: float | None = None,
        seed: int | None = None,
        decoding: str | None = None,
        max_batch_size: int | None = None,  # lm-eval passes it; decoding batches are fixed
        trust_remote_code: bool | None = None,  # lm-eval's --trust_remote_code; tokenizers use the CLI's default
        **overrides: Any,
    ) -> None:
        """Check every model_arg, load the model and the decoder preset, and compose a decode with them.

        Args:
            path: the checkpoint's local directory (None: a shipped Countdown model).
            family: a text family or a shipped model's name (``SHIPPED_TEXT_MODELS``).
            decoder: the decoder preset.
            gen_length: tokens generated per request; None: what the model was trained for, else 256.
            block_length: the decoding block; None: the model's trained block, else 32.
            batch_size: requests decoded together (lm-eval's ``auto`` falls back to 8).
            cache: the engine's KV cache (``engine.cache``), or None for the preset's.
            device: ``cpu``, ``cuda``, ... or ``auto``.
            dtype: a torch dtype's name or ``auto``.
            chat: encode each context as one user message through the chat template.
            temperature: the sampling temperature, or None for the preset's.
            seed: the decode's seed, or None for the configured one.
            decoding: the task-dependent defaults (``text`` or ``sudoku``); None: the task's.
            max_batch_size: lm-eval passes it; decoding batches are fixed.
            trust_remote_code: lm-eval's ``--trust_remote_code``; tokenizers use the CLI's default.
            **overrides: ``decoder.*``, ``engine.*``, ``decoding.*``, ``model.*`` and ``deadline_s`` keys.
        """
        super().__init__()
        check_source(family, path)
        batch_size = checked_sizes(gen_length, block_length, batch_size)
        model_keys, decoder_keys = split_overrides(overrides)
        try:  # the API's messages name the key or the file (ConfigError is a ValueError; a directory without a tokenizer: OSError)
            self.model = Model.load(family, path=path, device=device or "auto", dtype=dtype, **model_keys)
        except (ValueError, OSError) as error:
            raise ModelArgsError(f"model_args: {error}") from error
        try:
            self.decoder = Decoder.from_preset(decoder, overrides=decoder_keys, decoding=decoding)
        except (ValueError, TypeError) as error:
            raise ModelArgsError(f"model_args: {error}") from error
        trained_gen, trained_block = (
            self.model.lengths
        )  # unset: what the model was trained for, else 256 in blocks of 32
        self.gen_length, self.block_length, self.batch_size = (
            gen_length or trained_gen,
            block_length or trained_block,
            batch_size,
        )
        self.chat, self.temperature, self.seed = bool(chat), temperature, seed
        self.cache = cache
        self._device = self.model.adapter.device
        self._check_settings()

    def _check_settings(self) -> None:
        """Compose a decode of ``gen_length`` with these settings now, so that a wrong value (``cache``,
        ``temperature``, ``seed``, a ``decoder.*`` / ``engine.*`` value) fails before any request."""
        gen_length = gen_length_for(self.gen_length, self.block_length)
        try:
            cfg = self.decoder.config(
                self.model,
                gen_length,
                self.block_length,
                self.chat,
                self.batch_size,
                cache=self.cache,
                temperature=self.temperature,
                seed=self.seed,
            )
            decoder = build(cfg, "decoder")
            engine = build(cfg, "engine", adapter=self.model.adapter)
            owner = decoder.plan(engine, gen_length, self.block_length).temperature
        except (ValueError, TypeError) as error:
            raise ModelArgsError(f"model_args: {error}") from error
        self._rule_temperature = not owner.takes_settings  # e.g. a uniform-noise step's schedule
        self._varies = decoder.length.changes  # a length policy: gen_length starts, max_gen_toks is the ceiling

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> DLMSearchLM:
        """``--model_args`` win over lm-eval's own ``--batch_size`` / ``--device`` (which always come, defaults included)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
    ) -> DLMSearchLM:
        harness = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**harness, **arg_dict})

    # ----------------------------------------------------------------- requests

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Decode each context; the text is cut at the first of the request's ``until`` strings.

        Requests are grouped by generation length (``max_gen_toks``, else ``gen_length``, rounded
        up to whole blocks) and temperature, each group decoded in batches of ``batch_size``. Under a
        length policy (``decoder=daedal``, ``rho_eos``) that length is the ceiling and the model arg
        ``gen_length`` the initial length.
        """
        groups: dict[tuple[int, float | None], list[int]] = {}
        settings = []
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args[0], dict(request.args[1] or {})
            until = stop_sequences(gen_kwargs.get("until"))
            given = [gen_kwargs[k] for k in MAX_TOKEN_KEYS if gen_kwargs.get(k) is not None]
            length = gen_length_for(int(given[0]) if given else self.gen_length, self.block_length)
            settings.append((context, until))
            groups.setdefault((length, self._temperature(gen_kwargs)), []).append(index)
        texts: list[str] = [""] * len(requests)
        for (length, temperature), indices in groups.items():
            start = min(self.gen_length, length) if self._varies else length
            generations = self.decoder.generate(
                self.model,
                [settings[i][0] for i in indices],
                gen_length=start,
                max_length=length if self._varies else None,
                block_length=self.block_length,
                chat=self.chat,
                batch_size=self.batch_size,
                cache=self.cache,
                temperature=temperature,
                seed=self.seed,
                progress=not disable_tqdm,
            )
            for i, generation in zip(indices, generations):
                texts[i] = cut_at_stop(generation.text, settings[i][1])
                self.cache_hook.add_partial("generate_until", requests[i].args, texts[i])
        return texts

    def _temperature(self, gen_kwargs: dict[str, Any]) -> float | None:
        """The model arg ``temperature`` if given, else the request's (0 unless it samples). Where the
        decode's commit rule or population owns the temperature (a uniform-noise step samples at its
        schedule), a greedy request (lm-eval's default) leaves it to that owner (None); one that asks
        to sample is refused by the plan, naming the owner's settings."""
        if self.temperature is not None:
            return float(self.temperature)
        sampled = gen_kwargs.get("do_sample", float(gen_kwargs.get("temperature") or 0.0) > 0)
        if not sampled and self._rule_temperature:
            return None
        return float(gen_kwargs.get("temperature") or 0.0) if sampled else 0.0

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        raise NotImplementedError(LOGLIKELIHOOD_ERROR)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError(LOGLIKELIHOOD_ERROR)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        raise NotImplementedError(
            "dlmsearch applies the chat template itself: model_args chat=true (the default) wraps each context as one "
            "user turn of the tokenizer's template, chat=false encodes the raw text; run without --apply_chat_template"
        )
