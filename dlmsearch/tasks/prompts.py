"""Free prompts: decode the user's own text, with nothing to judge.

``task.prompt="..."`` decodes one prompt; ``task.path=FILE`` reads many: a ``.jsonl`` file
holds one JSON object per line with the text in ``task.field`` (and an optional ``id``), any
other file one prompt per non-empty line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import attrs

from dlmsearch.tasks.text import TaskFileError, TextTask, read_jsonl, read_text_file
from dlmsearch.validation import check_type

JSONL_SUFFIXES = (".jsonl", ".ndjson")


def load_prompts(path: str | Path, field: str = "prompt") -> list[tuple[str, str]]:
    """``(id, text)`` per prompt of a JSONL or plain text file; ids are the ``id`` field or ``stem:line``."""
    file = Path(path).expanduser()
    prompts: list[tuple[str, str]] = []
    if file.suffix.lower() in JSONL_SUFFIXES:
        for line, record in read_jsonl(file, (field,)):
            text = record[field]
            if not isinstance(text, str) or not text.strip():
                raise TaskFileError(f"{file}:{line}: field {field!r} must be a non-empty string, got {text!r}")
            prompts.append((str(record["id"]) if "id" in record else f"{file.stem}:{line}", text))
    else:
        _, lines = read_text_file(file)
        prompts = [(f"{file.stem}:{line}", text) for line, text in enumerate(lines, start=1) if text.strip()]
    seen: set[str] = set()
    for id_, _ in prompts:
        if id_ in seen:
            raise TaskFileError(f"{file}: id {id_!r} appears more than once (results are keyed by id)")
        seen.add(id_)
    return prompts


@attrs.define(kw_only=True)
class PromptsTask(TextTask):
    """The user's prompts (exactly one of ``path`` and ``prompt``); outputs are not judged."""

    prompt: str | None = attrs.field(default=None, validator=check_type(str, optional=True))
    field: str = attrs.field(default="prompt", validator=check_type(str))
    name: ClassVar[str] = "prompts"

    def __attrs_post_init__(self) -> None:
        if (self.path is None) == (self.prompt is None):
            raise ValueError(
                'task=prompts needs exactly one of task.path=FILE (.jsonl or one prompt per line) and task.prompt="..."'
            )
        if self.prompt is not None and not self.prompt.strip():
            raise ValueError("task.prompt is empty")
        super().__attrs_post_init__()

    @property
    def source(self) -> str:
        return self.path or "task.prompt"

    def sources(self) -> list[tuple[str, str, Any]]:
        if self.prompt is not None:
            return [("prompt", self.prompt, None)]
        return [(id_, text, None) for id_, text in load_prompts(self.path, self.field)]  # type: ignore[arg-type]
