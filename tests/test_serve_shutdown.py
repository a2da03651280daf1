"""SIGTERM past ``serve.grace_s``: every unfinished request gets an answer, not a cut connection.

One real server (the shipped Countdown model on a loopback port, ``serve.grace_s=0.5``) holds
three requests when it gets SIGTERM: a response and a stream that are decoding (``llada``, one
token a step over 96 tokens and 8 choices each: hundreds of times longer than the grace on this
model) and a response still queued behind them (``serve.max_batch=16``). Past the grace, the
responses are OpenAI's JSON error with ``code: server_shutdown``, the stream ends with an error
event and ``data: [DONE]``, the log has one line per such request and no traceback, and the
process exits 0.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from serving import metric, running_server, wait_until

GRACE_S = 0.5
LONG = {"model": "countdown", "preset": "llada", "max_tokens": 96, "n": 8, "temperature": 0.7, "seed": 3}
PROMPT = "Make 15 from 3 5 7."
CUT_OFF = "cut off by the shutdown"


def _post(url: str, path: str, body: dict[str, Any], into: dict[str, Any], name: str) -> None:
    """A plain request, its response (or what went wrong) kept under ``name``."""
    try:
        into[name] = httpx.post(url + path, json=body, timeout=120)
    except httpx.HTTPError as error:
        into[name] = error


def _stream(url: str, path: str, body: dict[str, Any], into: dict[str, Any]) -> None:
    """A streamed request: its status, its ``data:`` lines as they came, and a transport error if it was cut."""
    into["stream_lines"], into["stream_error"] = [], None
    try:
        with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as response:
            into["stream_status"] = response.status_code
            for line in response.iter_lines():
                if line.startswith("data: "):
                    into["stream_lines"].append(line[len("data: ") :])
    except httpx.HTTPError as error:
        into["stream_error"] = error


@pytest.fixture(scope="module")
def shutdown(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two requests decoding and one queued, then SIGTERM: what each client got, the exit status and the log."""
    overrides = ["+decoder=fast_dllm", "serve.presets=[llada]", f"serve.grace_s={GRACE_S}", "serve.max_batch=16"]
    got: dict[str, Any] = {}
    with running_server(overrides, cwd=str(tmp_path_factory.mktemp("shutdown"))) as (process, url, lines):
        running = [
            threading.Thread(target=_post, args=(url, "/v1/completions", {**LONG, "prompt": PROMPT}, got, "response")),
            threading.Thread(
                target=_stream,
                args=(url, "/v1/chat/completions", {**LONG, "messages": [{"role": "user", "content": PROMPT}]}, got),
            ),
        ]
        for thread in running:
            thread.start()
        wait_until(lambda: metric(url, "dlmsearch_running_samples") >= 16, "both long requests to decode")
        queued = threading.Thread(
            target=_post, args=(url, "/v1/completions", {**LONG, "n": 1, "prompt": PROMPT}, got, "queued")
        )
        queued.start()
        wait_until(lambda: metric(url, "dlmsearch_queue_depth") >= 1, "the third request to queue")
        process.send_signal(signal.SIGTERM)
        for thread in [*running, queued]:
            thread.join(120)
        got["exit"] = process.wait(60)
        time.sleep(0.2)  # the reader thread takes the last lines
        got["log"] = list(lines)
    return got


@pytest.mark.parametrize("name", ["response", "queued"])
def test_an_unfinished_response_gets_openais_error_body(shutdown: dict[str, Any], name: str) -> None:
    response = shutdown[name]
    assert isinstance(response, httpx.Response), f"no response: {response!r}"
    assert response.status_code == 503, (
        f"{response.status_code}: {response.text[:300]} (did the request finish within the grace?)"
    )
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "server_shutdown" and error["type"] == "server_error" and error["param"] is None
    assert "serve.grace_s" in error["message"]


def test_an_unfinished_stream_ends_with_an_error_event_then_done(shutdown: dict[str, Any]) -> None:
    assert shutdown["stream_error"] is None, (
        f"the stream was cut: {shutdown['stream_error']!r}; got {shutdown['stream_lines'][-3:]}"
    )
    assert shutdown["stream_status"] == 200
    *chunks, error, done = shutdown["stream_lines"]
    assert done == "[DONE]"
    assert json.loads(error)["error"]["code"] == "server_shutdown", error
    assert chunks and all(json.loads(c)["object"] == "chat.completion.chunk" for c in chunks)
    assert not any(json.loads(c)["choices"][0]["finish_reason"] for c in chunks), (
        "a choice finished: the request was not cut off"
    )


def test_the_log_has_one_line_per_cut_off_request_and_no_traceback(shutdown: dict[str, Any]) -> None:
    log = "\n".join(shutdown["log"])
    assert shutdown["exit"] == 0, log
    cut = [line for line in shutdown["log"] if CUT_OFF in line]
    assert len(cut) == 3, log
    assert sum("(queued, 0 of 1 choices done)" in line for line in cut) == 1, log
    assert sum("stream ended with a server_shutdown error event" in line for line in cut) == 1, log
    assert "Traceback" not in log and not any(line.startswith("ERROR") for line in shutdown["log"]), log
