"""What every text task shares: the model's tokenizer, prompt encoding, and reading the output.

A text task turns prompts into token ids with the tokenizer of the model being decoded (so
``task.tokenizer`` is ``${model.path}``), gives a generation region of ``gen_length`` masks,
and reads a generation back as text up to the first stop token. LLaDA fills the tail of its
canvas with EOS/EOT tokens, so the answer is everything before the first of them.

Prompt encoding follows the models' reference code: an Instruct model sees
``apply_chat_template([{"role": "user", ...}], add_generation_prompt=True, tokenize=False)``
encoded again as text. The template writes every special token it wants (LLaDA's writes the
BOS), so that text is encoded without the tokenizer's own special tokens: the same ids as
``apply_chat_template(..., tokenize=True)`` (Dream's reference), and no second BOS where a
tokenizer adds one to plain text (LLaDA's reference encodes with ``tokenizer(prompt)``).
``chat: false`` (Base models) encodes the raw text as the tokenizer does by default, BOS
included where the tokenizer adds one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import attrs
import torch

from dlmsearch.core.capabilities import open_marker
from dlmsearch.tasks.answers import extract_answer, normalize_number
from dlmsearch.tasks.base import TaskItem
from dlmsearch.validation import check_range, check_type, number

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


class TaskFileError(ValueError):
    """A task's data file that cannot be used; the message names the file (and line)."""


def _as_ids(value: Any) -> tuple[int, ...] | None:
    """``stop_ids`` from YAML (a list, a ListConfig, one int) or None as a tuple of ints."""
    if value is None:
        return None
    values = (
        [value]
        if isinstance(value, int)
        else list(value)
        if isinstance(value, Iterable) and not isinstance(value, str)
        else None
    )
    if values is None or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise TypeError(f"stop_ids must be a list of token ids, got {value!r}")
    return tuple(values)


def load_tokenizer(path: str | None, trust_remote_code: bool = False) -> Any:
    """The tokenizer in a local model directory; never contacts the Hub."""
    if path in (None, "", "???"):
        raise ValueError(
            "text tasks need the model's tokenizer: choose model=llada|dream model.path=DIR (a local model directory)"
        )
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(
            f"model directory {directory} does not exist (text tasks read the tokenizer from model.path)"
        )
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{directory} has no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # it warns about model_type while reading config.json for the tokenizer class
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers' errors are long; one line naming the directory
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        hint = (
            " (its tokenizer is code in that directory: task.trust_remote_code=true)"
            if "trust_remote_code" in str(error)
            else ""
        )
        raise ValueError(f"cannot load the tokenizer in {directory}: {type(error).__name__}: {first}{hint}") from error
    finally:
        transformers_logging.set_verbosity(verbosity)


def read_text_file(path: str | Path) -> tuple[Path, list[str]]:
    """A UTF-8 text file's lines; a missing, binary or empty file fails naming it."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist or is not a file")
    data = file.read_bytes()
    try:
        if b"\x00" in data:
            raise UnicodeDecodeError("utf-8", data, data.index(b"\x00"), data.index(b"\x00") + 1, "NUL byte")
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TaskFileError(f"{file} is not a UTF-8 text file (byte {error.start}: {error.reason})") from None
    if not text.strip():
        raise TaskFileError(f"{file} is empty")
    return file, text.splitlines()


def json_lines(path: str | Path) -> list[tuple[int, Any]]:
    """``(line number, value)`` per non-blank line of a JSONL file, one readable error where a line is not JSON."""
    file, lines = read_text_file(path)
    values = []
    for number_, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values.append((number_, json.loads(line)))
        except json.JSONDecodeError as error:
            raise TaskFileError(f"{file}:{number_}: not JSON ({error.msg} at column {error.colno})") from None
    return values


def read_jsonl(path: str | Path, fields: tuple[str, ...]) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` per non-blank line, each an object holding every one of ``fields``."""
    file = Path(path).expanduser()
    records = []
    for number_, record in json_lines(path):
        if not isinstance(record, dict):
            raise TaskFileError(f"{file}:{number_}: expected a JSON object, got {type(record).__name__}")
        missing = [f for f in fields if f not in record]
        if missing:
            raise TaskFileError(
                f"{file}:{number_}: no field {', '.join(repr(f) for f in missing)} (fields: {', '.join(record) or 'none'})"
            )
        records.append((number_, record))
    return records


def shorten(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters (for rendering)."""
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


@attrs.frozen
class AnswerVerifier:
    """The verifier of free-text tasks: no partial check, no acceptance, answers extracted from the text."""

    decode: Callable[[torch.Tensor], str]
    checks_partial: ClassVar[bool] = False
    checks_complete: ClassVar[bool] = False  # accepts() never says yes: a free text's answer is only extracted

    def consistent(self, sample: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(tokens), dtype=torch.bool)

    def accepts(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(tokens), dtype=torch.bool)

    def violations(self, sample: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(tokens))

    def answers(self, sample: torch.Tensor, tokens: torch.Tensor) -> list[str | None]:
        found = [extract_answer(self.decode(row)) for row in tokens]
        return [None if a is None else (normalize_number(a) or a) for a in found]


@attrs.define(kw_only=True)
class TextTask:
    """Fields and behaviour shared by text tasks; subclasses supply :meth:`sources`.

    ``tokenizer``, ``mask_id``, ``vocab_size`` and ``stop_ids`` come from the model config, so
    prompts are encoded for the model being decoded (``mask_id`` null: a model without a mask token). ``stop_ids: None`` stops at the
    tokenizer's EOS.
    """

    tokenizer: str | None = attrs.field(default=None, validator=check_type(str, optional=True))
    mask_id: int | None = number(int, 0, optional=True)
    vocab_size: int = number(int, 1)
    stop_ids: tuple[int, ...] | None = attrs.field(default=None, converter=_as_ids)
    chat: bool = attrs.field(default=True, validator=check_type(bool))
    trust_remote_code: bool = attrs.field(default=False, validator=check_type(bool))
    gen_length: int = attrs.field(default=256, validator=[check_type(int), check_range(1)])
    block_length: int = attrs.field(default=32, validator=[check_type(int), check_range(1)])
    limit: int | None = attrs.field(
        default=None, validator=[check_type(int, optional=True), check_range(1, optional=True)]
    )
    path: str | None = attrs.field(default=None, validator=check_type(str, optional=True))
    # a JSONL file, one list of canvas_length ids per item in the task's order: a uniform-noise model's first
    # canvas (DiffusionGemma's decoder_input_ids), to replay a decode; None: drawn
    initial_canvas: str | None = attrs.field(default=None, validator=check_type(str, optional=True))
    name: ClassVar[str] = "text"
    _tokenizer: Any = attrs.field(init=False, default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.gen_length % self.block_length:
            raise ValueError(
                f"task.gen_length={self.gen_length} must be a multiple of task.block_length={self.block_length}"
            )
        if self.mask_id is not None and self.mask_id >= self.vocab_size:
            raise ValueError(f"mask_id={self.mask_id} is outside the model's vocabulary of {self.vocab_size}")
        self._tokenizer = tokenizer = load_tokenizer(self.tokenizer, self.trust_remote_code)
        largest = max(tokenizer.get_vocab().values())
        if largest >= self.vocab_size:
            raise ValueError(
                f"tokenizer in {self.tokenizer} has ids up to {largest}, beyond the model's vocabulary of {self.vocab_size}"
            )
        if self.chat and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer in {self.tokenizer} has no chat template; an Instruct model needs one, or set task.chat=false for a Base model"
            )
        if self.stop_ids is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    f"tokenizer in {self.tokenizer} has no EOS token: give the stop tokens as task.stop_ids=[...]"
                )
            self.stop_ids = (int(tokenizer.eos_token_id),)
        outside = [i for i in self.stop_ids if not 0 <= i < self.vocab_size]
        if outside:
            raise ValueError(f"stop_ids {outside} are outside the model's vocabulary of {self.vocab_size}")

    # ----------------------------------------------------------------- subclass hooks

    def sources(self) -> list[tuple[str, str, Any]]:
        """``(id, prompt text, reference)`` per item, in order."""
        raise NotImplementedError

    def question(self, text: str, reference: Any) -> Any:
        """What a verifier may see of an item: the prompt text (tasks whose reference holds no
        answer, such as Countdown's numbers and target, may give more)."""
        return text

    def verifier(self, questions: list[Any]) -> AnswerVerifier:
        """Votes over the answers the texts state; a text task cannot accept an output alone."""
        return AnswerVerifier(self.decode)

    # ----------------------------------------------------------------- encoding and decoding

    def encode(self, text: str) -> torch.Tensor:
        """Prompt ids for ``text``: chat-templated for ``chat: true``, raw otherwise."""
        if not self.chat:
            return torch.tensor(self._tokenizer(text)["input_ids"], dtype=torch.long)
        return self.encode_messages([{"role": "user", "content": text}])

    def encode_messages(self, messages: list[dict[str, str]]) -> torch.Tensor:
        """Prompt ids for a conversation through the chat template (a user's prompt is one message; the server's chat requests are any)."""
        if not getattr(self._tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer in {self.tokenizer} has no chat template")
        templated = self._tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return torch.tensor(self._tokenizer(templated, add_special_tokens=False)["input_ids"], dtype=torch.long)

    def generated_ids(self, tokens: torch.Tensor) -> list[int]:
        """The generation up to (not including) the first stop token."""
        ids = [int(t) for t in tokens.detach().cpu().reshape(-1).tolist()]
        stops = set(self.stop_ids or ())
        for at, token in enumerate(ids):
            if token in stops:
                return ids[:at]
        return ids

    def decode(self, tokens: torch.Tensor) -> str:
        """The generation as text: cut at the first stop token, special tokens dropped."""
        return self._tokenizer.decode(self.generated_ids(tokens), skip_special_tokens=True)

    # ----------------------------------------------------------------- the Task protocol

    def items(self) -> list[TaskItem]:
        sources = self.sources()
        if self.limit is not None:
            sources = sources[: self.limit]
        generation = torch.full((self.gen_length,), open_marker(self.mask_id, self.vocab_size), dtype=torch.long)
        items = [
            TaskItem(
                id=id_,
                prompt=self.encode(text),
                generation=generation.clone(),
                reference=ref,
                question=self.question(text, ref),
            )
            for id_, text, ref in sources
        ]
        if self.initial_canvas is None:
            return items
        canvases = [value for _, value in json_lines(self.initial_canvas)][: len(items)]
        return with_initial_canvas(items, canvases, self.mask_id, self.vocab_size, self.block_length)

    def judge(self, item: TaskItem, tokens: torch.Tensor) -> bool | None:
        return None

    def output(self, item: TaskItem, tokens: torch.Tensor) -> str:
        return self.decode(tokens)

    def details(self, item: TaskItem, tokens: torch.Tensor) -> dict[str, Any]:
        return {}

    def token_strings(self, ids: list[int]) -> list[str]:
        tokens = self._tokenizer.convert_ids_to_tokens([int(i) for i in ids])
        return [str(i) if t is None else t for i, t in zip(ids, tokens)]

    def prompt_text(self, item: TaskItem) -> str:
        """The item's prompt as the model sees it (template included)."""
        return self._tokenizer.decode(item.prompt.tolist(), skip_special_tokens=False)

    def render(self, item: TaskItem, output: str) -> str:
        return f"[{item.id}] prompt:\n{shorten(self.prompt_text(item))}\n--- output:\n{output}"


def with_initial_canvas(
    items: list[TaskItem], given: Any, mask_id: int | None, vocab_size: int, canvas_length: int
) -> list[TaskItem]:
    """The items with their first canvas given (a uniform-noise model's ``decoder_input_ids``: the
    API's ``initial_canvas=``, the CLI's ``task.initial_canvas``), checked.

    Args:
        items: the task's items.
        given: ``[items, canvas_length]`` ids: a LongTensor or lists.
        mask_id: the model's mask id (None: it has no mask token, as a uniform-noise model).
        vocab_size: the ids allowed.
        canvas_length: the model's canvas.
    """
    if mask_id is not None:
        raise ValueError(
            "an initial canvas is a uniform-noise model's first canvas (DiffusionGemma's decoder_input_ids); "
            "this model fills a masked canvas"
        )
    try:
        canvas = torch.as_tensor(given if isinstance(given, torch.Tensor) else [list(row) for row in given])
    except (TypeError, ValueError) as error:
        raise TypeError(f"initial_canvas must be a LongTensor or a list of lists of token ids: {error}") from None
    expected = (len(items), canvas_length)
    if canvas.dim() != 2 or tuple(canvas.shape) != expected or canvas.is_floating_point():
        raise ValueError(
            f"initial_canvas must be integer ids of shape [prompts, canvas_length] = {list(expected)}; got "
            f"{list(canvas.shape)} of {canvas.dtype}"
        )
    if bool(((canvas < 0) | (canvas >= vocab_size)).any()):
        raise ValueError(f"initial_canvas holds ids outside the vocabulary [0, {vocab_size})")
    return [
        attrs.evolve(item, generation=torch.cat([row.long(), item.generation[canvas_length:]]))
        for item, row in zip(items, canvas)
    ]
