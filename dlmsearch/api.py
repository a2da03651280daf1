"""A Python API for notebooks and evaluation harnesses: load a model, pick a decoder, generate.

```python
from dlmsearch.api import Decoder, Model

model = Model.load("llada", path="/models/LLaDA-8B-Instruct")            # or "dream", or "sudoku"
decoder = Decoder.from_preset("adalook", overrides={"decoder.expansion.max_depth": 3})
out = decoder.generate(model, ["What is 7 * 8?"], gen_length=256, block_length=32, cache="dual")
print(out[0].text, out[0].steps, out[0].row_forwards)
```

Nothing here is a second implementation of the CLI: every object comes from a config composed
from ``conf/`` by :func:`dlmsearch.config.compose` and built by :func:`dlmsearch.config.build`
(the model through its loader, the decoder, the engine), prompts are encoded and outputs read
back by the text tasks (chat template, cut at the first stop id), and each batch is decoded by
:class:`dlmsearch.run.Decoding`, the CLI's own decode session (:class:`dlmsearch.search.session.DecodeSession`). So a
prompt gives the same tokens and counters here as through ``python -m dlmsearch``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import torch
from omegaconf import DictConfig, OmegaConf

from dlmsearch.config import CONF_DIR, Setting, build, compose_settings, decoder_presets, unknown
from dlmsearch.models.adapter import ModelAdapter
from dlmsearch.run import Decoding
from dlmsearch.search.driver import SearchDecoder
from dlmsearch.tasks.base import TaskItem
from dlmsearch.tasks.sudoku import puzzle_item
from dlmsearch.tasks.sudoku_files import PuzzleFileError, SudokuPuzzle, _parse_grid
from dlmsearch.tasks.sudoku_grids import clue_conflict
from dlmsearch.tasks.text import TextTask, load_tokenizer, with_initial_canvas

__all__ = ["Decoder", "Generation", "Model", "PromptList", "compose_settings", "prompt_list"]

# Keys a decoder may override (the rest belongs to Model.load or to generate's arguments).
DECODER_KEYS = ("decoder", "engine", "decoding", "seed", "deadline_s")
_OPTION_NAME = re.compile(r"[\w.-]+")


def _is_group(key: str) -> bool:
    """Whether ``key`` names a config group (``decoding``, ``decoder/expansion``): its value picks a file."""
    return (CONF_DIR / key.replace(".", "/")).is_dir()


def _split_overrides(
    overrides: Mapping[str, Any] | Sequence[str] | None,
    allowed: tuple[str, ...],
    what: str,
) -> tuple[tuple[str, ...], tuple[Setting, ...]]:
    """Hydra override strings (group choices, or strings the caller wrote in Hydra's grammar)
    and settings (Python values for keys), from a mapping (``{"decoder.commit.threshold": 0.8,
    "decoder/expansion": "fixed_depth"}``) or from Hydra override strings."""
    if overrides is None:
        return (), ()
    if isinstance(overrides, Mapping):
        pairs = [(str(k), v) for k, v in overrides.items()]
        for key, value in pairs:
            if _is_group(key) and not (isinstance(value, str) and _OPTION_NAME.fullmatch(value)):
                raise ValueError(f"{what}: {key!r} is a config group; its value names one of its files, got {value!r}")
        strings = [f"{k}={v}" for k, v in pairs if _is_group(k)]
        settings = tuple((k, v) for k, v in pairs if not _is_group(k))
        keys = [k for k, _ in pairs]
    elif isinstance(overrides, Sequence) and not isinstance(overrides, str):
        strings, settings = [str(o) for o in overrides], ()
        keys = [o.split("=", 1)[0].lstrip("+~") for o in strings]
    else:
        raise TypeError(
            f"{what} must be a dict of key -> value or a list of 'key=value' strings, got {type(overrides).__name__}"
        )
    for key in keys:
        root = re.split(r"[./]", key, maxsplit=1)[0]
        if root not in allowed:
            raise ValueError(
                f"{what}: {key!r} is not a key of {', '.join(allowed)}; {_WHERE.get(root, 'see conf/config.yaml')}"
            )
    return tuple(strings), settings


_WHERE = {
    "model": "model settings go to Model.load(..., key=value)",
    "task": "gen_length, block_length and chat are arguments of generate()",
    "batch_size": "batch_size is an argument of generate()",
}


@attrs.frozen
class Generation:
    """One decoded prompt or puzzle and what it cost.

    ``text`` is the generation as the CLI writes it (text: cut at the first stop id, special
    tokens dropped; Sudoku: the 81-digit grid). ``tokens`` is the whole generation region,
    stop tokens included. ``correct`` is the task's judge (Sudoku: the grid solves the puzzle),
    None for free text.
    """

    text: str
    tokens: torch.Tensor
    steps: int
    row_forwards: int
    token_forwards: int
    tokens_committed: int
    correct: bool | None = None
    deadline_hit: bool = False  # ``deadline_s`` ran out and the base rule alone finished it
    decoder_forwards: int = (
        0  # the steps that denoised (not a cache's separate write, nor a uniform-noise encoder call)
    )
    live_particles: float = 1.0  # a population's particles still decoding, averaged over the rounds
    verifier_accepted: bool | None = None  # the task verifier's verdict, where the decoder asked for one


@attrs.define(kw_only=True)
class PromptList(TextTask):
    """The prompts given to :meth:`Decoder.generate`, encoded and read back as every text task does."""

    prompts: list[str] = attrs.field(factory=list)
    name: ClassVar[str] = "prompts"

    def sources(self) -> list[tuple[str, str, Any]]:
        return [(str(i), text, None) for i, text in enumerate(self.prompts)]


def _text_fields(task_cfg: DictConfig) -> dict[str, Any]:
    """The text-task settings of a composed ``task=prompts`` (tokenizer, ids, chat, lengths), without its prompt source."""
    fields = [f.name for f in attrs.fields(TextTask) if f.init and f.name not in ("path", "limit")]
    values = {name: OmegaConf.select(task_cfg, name) for name in fields}
    return {k: (OmegaConf.to_container(v) if OmegaConf.is_config(v) else v) for k, v in values.items()}


def prompt_list(task_cfg: DictConfig, prompts: Sequence[str] = (), **settings: Any) -> PromptList:
    """A :class:`PromptList` with a composed ``task=prompts``'s settings, ``settings`` over them
    (the server encodes and reads its requests with one, ``chat=False``)."""
    return PromptList(**{**_text_fields(task_cfg), **settings}, prompts=list(prompts))


@attrs.define(eq=False)
class Model:
    """A loaded model (``adapter``) with its tokenizer (text families) and the config it came from.

    ``name`` is the config in ``conf/model/`` (``llada``, ``dream`` or ``sudoku``); ``settings``
    are the ``model.*`` values it was loaded with, so that a decode composes the same config
    as the CLI would.
    """

    name: str
    adapter: ModelAdapter
    config: DictConfig
    settings: tuple[Setting, ...] = ()
    tokenizer: Any = None
    lengths: tuple[int, int] | None = (
        None  # text: the default (gen_length, block_length), what the model was trained for, else 256 and 32
    )
    _tasks: dict[tuple[Any, ...], PromptList] = attrs.field(factory=dict, repr=False)

    @classmethod
    def load(cls, family_or_config: str = "sudoku", path: str | Path | None = None, **model_overrides: Any) -> Model:
        """Load ``conf/model/<family_or_config>.yaml`` with ``model.path=path`` and ``model.<key>=<value>``
        for each keyword (``device="cuda"``, ``dtype="bfloat16"``, ``logits_eos_inf=True``, ...).

        LLaDA and Dream load from a local directory (weights, ``config.json``, tokenizer; nothing
        is downloaded) through :func:`dlmsearch.models.loading.load_text_model`; ``sudoku`` is the
        shipped denoiser (``path=None``) or any denoiser directory, through ``load_denoiser``.
        """
        available = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
        if family_or_config not in available:
            raise ValueError(unknown("model", family_or_config, available))
        settings = {**({"path": str(Path(path).expanduser())} if path is not None else {}), **model_overrides}
        values = tuple((f"model.{k}", v) for k, v in settings.items())
        text = family_or_config != "sudoku"
        cfg = compose_settings([f"model={family_or_config}", *(["task=prompts"] if text else [])], values)
        adapter = build(cfg, "model")
        tokenizer = load_tokenizer(cfg.task.tokenizer, bool(cfg.task.trust_remote_code)) if text else None
        lengths = (int(cfg.task.gen_length), int(cfg.task.block_length)) if text else None
        return cls(
            name=family_or_config,
            adapter=adapter,
            config=cfg.model,
            settings=values,
            tokenizer=tokenizer,
            lengths=lengths,
        )

    @property
    def is_text(self) -> bool:
        """Whether the model decodes text (LLaDA, Dream) rather than Sudoku grids."""
        return self.tokenizer is not None

    def _text_task(self, task_cfg: DictConfig, prompts: list[str]) -> PromptList:
        """The composed ``task=prompts`` settings as a task over ``prompts`` (one per setting, reused)."""
        values = _text_fields(task_cfg)
        key = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(values.items()))
        if key not in self._tasks:
            self._tasks[key] = PromptList(**values)
        task = self._tasks[key]
        task.prompts = list(prompts)
        return task


@attrs.frozen
class Decoder:
    """A decoder preset (``conf/decoder/<preset>.yaml``) with overrides, ready to decode with any model.

    The decoder is composed again for each :meth:`generate` call, together with the model and
    the generation settings: presets read the task's numbers (``task.gen_length`` sets the
    LLaDA and Dream schedules, ``decoding`` the thresholds), exactly as on the command line.
    """

    preset: str
    overrides: tuple[str, ...] = ()  # Hydra override strings: group choices, or what the caller wrote as strings
    settings: tuple[Setting, ...] = ()  # Python values for keys, set on the composed config
    decoding: str | None = None

    @classmethod
    def from_preset(
        cls, name: str, overrides: Mapping[str, Any] | Sequence[str] | None = None, decoding: str | None = None
    ) -> Decoder:
        """A preset with overrides of ``decoder.*``, ``engine.*``, ``decoding.*``, ``seed`` or ``deadline_s``.

        ``overrides`` is a dict (``{"decoder.commit.threshold": 0.8, "engine.cache": "dual",
        "decoder/expansion": "fixed_depth"}``) or Hydra override strings. ``decoding`` picks the
        task-dependent defaults (``"text"``: the papers', ``"sudoku"``: the shipped model's);
        None uses the task's, as the CLI does (text for LLaDA/Dream, sudoku for puzzles).
        A mistake (unknown preset or key, wrong type) fails here, naming the key.
        """
        if name not in decoder_presets():
            raise ValueError(unknown("decoder preset", name, decoder_presets()))
        if decoding is not None and not (isinstance(decoding, str) and _OPTION_NAME.fullmatch(decoding)):
            raise ValueError(f"decoding must name a file of conf/decoding/ (text, sudoku), got {decoding!r}")
        strings, settings = _split_overrides(overrides, DECODER_KEYS, "Decoder.from_preset overrides")
        decoder = cls(preset=name, overrides=strings, settings=settings, decoding=decoding)
        cfg = compose_settings(decoder._overrides(), settings)
        build(cfg, "decoder")  # engine keys were checked by compose; its values are checked with the model, in generate
        return decoder

    @property
    def name(self) -> str:
        return self.preset

    def _overrides(self, *choices: str) -> list[str]:
        return [
            f"+decoder={self.preset}",
            *([f"decoding={self.decoding}"] if self.decoding else []),
            *choices,
            *self.overrides,
        ]

    def config(
        self,
        model: Model,
        gen_length: int | None = None,
        block_length: int | None = None,
        chat: bool = True,
        batch_size: int = 8,
        **engine: Any,
    ) -> DictConfig:
        """The whole config a decode with these settings uses (what ``python -m dlmsearch`` would compose).

        Args:
            model: the loaded model (its config name and settings).
            gen_length: tokens to generate (None: what the model declares, else 256).
            block_length: the semi-autoregressive block (None: the model's, else 32).
            chat: wrap prompts in the tokenizer's chat template.
            batch_size: samples decoded together.
            engine: engine settings given explicitly (cache, temperature, top_p, top_k, seed, row_budget).
        """
        task: list[Setting] = []
        if model.is_text:
            # Unset lengths stay the config's: what the model was trained for, else 256 in blocks of 32 (conf/task/prompts.yaml)
            task = [
                ("task.chat", chat),
                *(
                    (f"task.{k}", v)
                    for k, v in (("gen_length", gen_length), ("block_length", block_length))
                    if v is not None
                ),
            ]
        elif (gen_length, block_length) not in ((None, None), (81, 81)):
            raise ValueError(
                f"a Sudoku canvas is one block of 81 cells: leave gen_length and block_length unset (got {gen_length}, {block_length})"
            )
        given = {k: v for k, v in engine.items() if v is not None}
        unknown = set(given) - {"cache", "temperature", "top_p", "top_k", "seed", "row_budget"}
        if unknown:
            raise TypeError(f"unknown generate() argument(s): {', '.join(sorted(unknown))}")
        explicit = [("seed" if k == "seed" else f"engine.{k}", v) for k, v in given.items()]
        choices = [f"model={model.name}", *(["task=prompts"] if model.is_text else [])]
        # Explicit generate() arguments win over the preset's overrides: they come last.
        return compose_settings(
            self._overrides(*choices), [*model.settings, *task, *self.settings, ("batch_size", batch_size), *explicit]
        )

    def generate(
        self,
        model: Model,
        prompts: Sequence[str],
        gen_length: int | None = None,
        block_length: int | None = None,
        chat: bool = True,
        batch_size: int = 8,
        cache: str | None = None,
        temperature: float | None = None,
        seed: int | None = None,
        row_budget: int | None = None,
        progress: bool = False,
        top_p: float | None = None,
        top_k: int | None = None,
        initial_canvas: torch.Tensor | Sequence[Sequence[int]] | None = None,
        max_length: int | None = None,
    ) -> list[Generation]:
        """Decode ``prompts`` (text models) or 81-character puzzles (``0`` or ``.`` for blanks; Sudoku).

        Text: ``gen_length`` tokens in blocks of ``block_length`` (defaults: ``model.lengths``,
        what the model was trained for, else 256 in blocks of 32, a block-diffusion model's own blocks);
        ``chat=True`` wraps each prompt in the tokenizer's chat template (Instruct models),
        ``chat=False`` encodes the raw text (Base models). ``cache`` (auto|none|prefix|dual|...),
        ``temperature``, ``top_p``, ``top_k``, ``seed`` and ``row_budget`` override the engine's
        settings (None: the preset's, the checkpoint's generation_config.json, else conf/engine). Prompts are decoded ``batch_size`` at a time, longest first
        (results do not depend on the batch); item ``i`` keys its randomness with uid ``i``, as
        the CLI does for the ``i``-th item of a task.

        Args:
            model: the loaded model (:meth:`Model.load`).
            prompts: the texts (or puzzles), one generation each.
            gen_length: tokens to generate (None: the model's declared length, else 256).
            block_length: the semi-autoregressive block (None: the model's, else 32).
            chat: wrap each prompt in the chat template (Instruct models).
            batch_size: prompts decoded together (results do not depend on it).
            cache: the cache policy's name (None: the config's, ``auto``).
            temperature: sampling temperature (None: the preset's or the checkpoint's).
            seed: keys the counter-based randomness.
            row_budget: rows per forward chunk.
            progress: show a progress bar over prompts.
            top_p: nucleus truncation.
            top_k: keep the k most likely tokens.
            initial_canvas: a uniform-noise model's first canvas per prompt (``[prompts,
                canvas_length]`` ids, a LongTensor or lists): the reference's ``decoder_input_ids``,
                which replays a decode exactly; None: drawn (keyed by the seed).
            max_length: the ceiling of a decoder whose length changes while it decodes (``daedal``,
                ``rho_eos``, any preset with ``decoder/length``), ``gen_length`` then being the initial
                length; None: the decoder's own (``decoder.length.max_length``).
        """
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings (got one string): generate(model, [prompt])")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        prompts = list(prompts)
        if not prompts:
            return []
        cfg = self.config(
            model,
            gen_length,
            block_length,
            chat,
            batch_size,
            cache=cache,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            row_budget=row_budget,
        )
        decoder = with_ceiling(build(cfg, "decoder"), max_length)
        engine = build(cfg, "engine", adapter=model.adapter)
        task, items = _task_items(model, cfg, prompts)
        if initial_canvas is not None:
            able = model.adapter.capabilities
            canvas_length = able.canvas_length or int(cfg.task.block_length)
            items = with_initial_canvas(items, initial_canvas, able.mask_id, able.vocab_size, canvas_length)
        decoding = Decoding(decoder, engine, task, deadline_s=cfg.get("deadline_s"))
        what = f"{decoder.name} on {len(items)} {'prompts' if model.is_text else 'puzzles'}"
        return _in_batches(decoding, items, batch_size, what if progress else None)


def with_ceiling(decoder: SearchDecoder, max_length: int | None) -> SearchDecoder:
    """``decoder`` with its length policy's ceiling at ``max_length`` (None: as it is); a decoder of
    fixed length has no ceiling to set."""
    if max_length is None:
        return decoder
    if not decoder.length.changes:
        raise ValueError(
            f"max_length={max_length} is a length policy's ceiling, and decoder {decoder.name!r} decodes a fixed "
            "length: use Decoder.from_preset('daedal') or ('rho_eos'), or leave max_length unset"
        )
    return attrs.evolve(decoder, length=attrs.evolve(decoder.length, max_length=max_length))


def _task_items(model: Model, cfg: DictConfig, prompts: list[Any]) -> tuple[Any, list[TaskItem]]:
    """The task that reads the outputs, and one item per prompt (text) or puzzle (Sudoku)."""
    if model.is_text:
        bad = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
        if bad:
            raise TypeError(f"prompts[{bad[0]}] is a {type(prompts[bad[0]]).__name__}, not a string")
        task: Any = model._text_task(cfg.task, prompts)
        return task, task.items()
    return build(cfg, "task"), [puzzle_item(_puzzle(p, i)) for i, p in enumerate(prompts)]


def _in_batches(decoding: Decoding, items: list[TaskItem], batch_size: int, progress: str | None) -> list[Generation]:
    """Decode ``batch_size`` items at a time, longest first (results do not depend on the batch);
    item ``i`` keys its randomness with uid ``i``. ``progress``: the bar's label, None for no bar."""
    order = sorted(range(len(items)), key=lambda i: -len(items[i].prompt))
    results: list[Generation | None] = [None] * len(items)
    bar = _progress(len(items), progress) if progress is not None else None
    try:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            decoded = decoding.results(decoding.decoder, [items[i] for i in batch], batch)
            for i, result in zip(batch, decoded):
                results[i] = _generation(decoding.task, items[i], result)
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    return results  # type: ignore[return-value]


def _generation(task: Any, item: TaskItem, result: Any) -> Generation:
    return Generation(
        text=task.output(item, result.tokens),
        tokens=result.tokens,
        steps=result.steps,
        row_forwards=result.row_forwards,
        token_forwards=result.token_forwards,
        tokens_committed=result.tokens_committed,
        correct=task.judge(item, result.tokens),
        deadline_hit=result.deadline_hit,
        decoder_forwards=result.decoder_forwards,
        live_particles=result.population.live_particles,
        verifier_accepted=result.population.accepted,
    )


def _puzzle(text: Any, index: int) -> SudokuPuzzle:
    """An 81-character puzzle string as the puzzle files are read (``0`` or ``.`` for blanks)."""
    if not isinstance(text, str):
        raise TypeError(f"puzzles[{index}] is a {type(text).__name__}, not an 81-character string")
    try:
        grid = _parse_grid(text, Path("puzzles"), index, "puzzle")
    except PuzzleFileError as error:
        raise ValueError(f"puzzles[{index}]: {str(error).split(': ', 1)[1]}") from None
    conflict = clue_conflict(grid)
    if conflict:
        raise ValueError(f"puzzles[{index}]: the puzzle's clues contradict each other: {conflict}")
    return SudokuPuzzle(id=str(index), puzzle=grid)


def _progress(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="item", dynamic_ncols=True)
