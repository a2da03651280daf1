"""OpenAI's request and response bodies, as far as a diffusion decoder can honour them.

Requests are read by pydantic (unknown OpenAI fields are ignored, as OpenAI's own servers do;
the extras this server adds are ``preset``, ``decoder`` and ``deadline_s``), and every failure
is an :class:`APIError` that :mod:`dlmsearch.serve.app` turns into OpenAI's error body
``{"error": {"message", "type", "param", "code"}}`` with its HTTP status.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class APIError(Exception):
    """One request's failure: its HTTP status and OpenAI's error fields."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or {
            400: "invalid_request_error",
            404: "invalid_request_error",
            413: "invalid_request_error",
            429: "rate_limit_error",
            503: "server_error",
        }.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


Scalar = str | int | float | bool | None


class Sampled(BaseModel):
    """What both endpoints share: the model, the length, sampling, choices, stops, streaming, and this server's extras."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    seed: int | None = None
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    # dlmsearch's extras (OpenAI's clients send them through ``extra_body``)
    preset: str | None = None  # another decoder preset the server allows (serve.presets)
    decoder: dict[str, Scalar] = Field(
        default_factory=dict
    )  # decoder options ("commit.threshold": 0.8) within serve.request_options
    deadline_s: float | None = Field(
        default=None, gt=0.0
    )  # past it the sample stops exploring and finishes with the base rule

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [] if value is None else [value] if isinstance(value, str) else list(value)
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop is up to 4 non-empty strings")
        return stops


class CompletionRequest(Sampled):
    """``POST /v1/completions``: raw text, encoded without the chat template (``task.chat=false``)."""

    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("prompt is an empty list")
        return value


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        """The message's text (OpenAI's content parts: only ``{"type": "text"}`` ones are understood)."""
        if isinstance(self.content, str):
            return self.content
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in self.content):
            raise ValueError("only text content parts are understood")
        return "".join(part["text"] for part in self.content)


class ChatRequest(Sampled):
    """``POST /v1/chat/completions``: the messages through the checkpoint's chat template (``task.chat=true``)."""

    messages: list[Message] = Field(min_length=1)


def parse(body: bytes, kind: type[Sampled]) -> Sampled:
    """The request body as ``kind``; a non-UTF-8, non-JSON or invalid body is a 400 naming the field."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise APIError(400, f"the request body is not UTF-8 (byte {error.start})", code="invalid_encoding") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise APIError(
            400,
            f"the request body is not JSON ({error.msg} at line {error.lineno}, column {error.colno})",
            code="invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    try:
        return kind.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        message = "missing" if first["type"] == "missing" else first["msg"]
        raise APIError(
            400,
            f"{param}: {message}" if param else message,
            param=param,
            code="invalid_value" if first["type"] != "missing" else "missing_field",
        ) from None


def usage(prompt_tokens: int, completion_tokens: int, counters: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's token counts, then what this decode cost (steps, row- and token-forwards, ...)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        **counters,
    }


def completion_body(
    request_id: str, model: str, chat: bool, choices: list[dict[str, Any]], usage_: dict[str, Any]
) -> dict[str, Any]:
    """A whole response: ``text_completion`` or ``chat.completion``."""
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": c["index"],
                "message": {"role": "assistant", "content": c["text"]},
                "finish_reason": c["finish_reason"],
                "logprobs": None,
            }
            if chat
            else {"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": None}
            for c in choices
        ],
        "usage": usage_,
    }


def chunk_body(
    request_id: str,
    model: str,
    chat: bool,
    index: int,
    text: str | None,
    finish_reason: str | None,
    usage_: dict[str, Any] | None = None,
    role: bool = False,
) -> dict[str, Any]:
    """One Server-Sent Event's data: ``text_completion`` chunks or ``chat.completion.chunk`` deltas.

    Args:
        request_id: the response's id, the same in every chunk of one stream.
        model: the served model's name.
        chat: a ``chat.completion.chunk`` delta rather than a ``text_completion`` chunk.
        index: the choice this chunk belongs to.
        text: the new text; None sends no ``content`` in a chat delta (an empty ``text`` for completions).
        finish_reason: ``"stop"`` or ``"length"`` on a choice's last chunk, else None.
        usage_: the usage chunk's counts (OpenAI's ``stream_options.include_usage``), if this is it.
        role: the chat stream's first chunk per choice, which names the assistant's role.
    """
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body
