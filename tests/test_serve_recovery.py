"""The server after a failed step, and with a sample that never finishes, against offline decoding.

A request with ``n`` choices returns what ``n`` offline decodes with its seed return, also when a
step it shares with a batch-mate fails after some of its choices were answered: each index once,
the usage of each choice once, a stream that finishes every choice. A sample whose decoder never
finishes it fails with the rounds' bound (one readable error for its request), and the requests
beside it are answered as offline. Everything runs in-process over one engine, whose scheduler
admits nothing until a test's requests are all queued, so that they decode side by side.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_serve import MODEL, PROMPTS, body_of, offline

from dlmsearch.api import Model, compose_settings
from dlmsearch.search.components.commit import ThresholdRule
from dlmsearch.search.session import DecodeSession
from dlmsearch.serve.scheduler import Scheduler

# Sampled at temperature 1 with seed 0, choice 0 finishes after 2 steps and choice 1 after 4
# (``test_the_batch_mates_finish_apart`` checks it), so a step between them finds choice 0 answered.
QUICK = {"prompt": "Make 15 from 3 5 7.", "chat": False, "max_tokens": 8, "seed": 0, "temperature": 1.0, "n": 2}
MATE = {"prompt": "Make 999 from 8 6 2 3.", "chat": False, "max_tokens": 8}  # 7 steps; its rows fail once armed
STALLED = {"prompt": "Make 777 from 7 7.", "chat": False, "max_tokens": 8}  # its rows never commit a token
COUNTERS = ("steps", "row_forwards", "token_forwards", "tokens_committed")
ANSWER_S = 30.0  # a request unanswered by then hangs (a bound for the test, not a timing check: it takes ~1 s)
MAX_STEPS = 200  # far more than any test's requests need, failed steps and all: more is a session stepping forever


class Faults:
    """What the tests inject while serving (``active``; offline decodes run without): rows holding
    ``poison`` fail once a step has finished a sample (``armed``), rows holding ``stall`` commit
    nothing, and the first admission waits for ``expect`` queued requests."""

    def __init__(self, poison: int, stall: int) -> None:
        self.poison, self.stall = poison, stall
        self.reset(0)
        self.active = False

    def reset(self, expect: int) -> None:
        self.expect, self.armed, self.failed, self.steps, self.active = expect, False, 0, 0, True

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from dlmsearch.models.adapter import ModelAdapter

        faults = self
        logits, step, select = ModelAdapter.window_logits, DecodeSession.step, ThresholdRule.select
        admissions = Scheduler._admissions

        def window_logits(adapter: Any, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if faults.active and faults.armed and bool((tokens == faults.poison).any()):
                faults.failed += 1
                raise torch.OutOfMemoryError("out of memory (a test's batch-mate that cannot take its rows)")
            return logits(adapter, tokens, *args, **kwargs)

        def stepped(session: DecodeSession) -> list:
            faults.steps += 1
            results = step(session)
            faults.armed = faults.armed or (faults.active and bool(results))
            return results

        def selected(rule: ThresholdRule, canvas: Any, evaluation: Any, layout: Any) -> torch.Tensor:
            chosen = select(rule, canvas, evaluation, layout)
            return chosen & ~(faults.active & (canvas.tokens == faults.stall).any(dim=1, keepdim=True))

        def gated(scheduler: Scheduler) -> list:
            if len(scheduler.waiting) < faults.expect:
                return []
            faults.expect = 0
            return admissions(scheduler)

        monkeypatch.setattr(ModelAdapter, "window_logits", window_logits)
        monkeypatch.setattr(DecodeSession, "step", stepped)
        monkeypatch.setattr(ThresholdRule, "select", selected)
        monkeypatch.setattr(Scheduler, "_admissions", gated)


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load(MODEL)


@pytest.fixture(scope="module")
def serving(model: Model) -> Iterator[tuple[Any, Faults]]:
    """One in-process server (``+decoder=fast_dllm``) with the faults patched in, and its faults."""
    from fastapi.testclient import TestClient

    from dlmsearch.serve.app import Server, create_app

    token = lambda word: int(model.tokenizer.convert_tokens_to_ids(word))
    faults = Faults(token("999"), token("777"))
    with pytest.MonkeyPatch.context() as monkeypatch:
        faults.patch(monkeypatch)
        overrides = ["+decoder=fast_dllm", "serve.max_n=4"]
        server = Server(compose_settings(overrides, (), "serve"), overrides, MODEL)
        with TestClient(create_app(server)) as client:
            yield client, faults


def streamed(client: Any, case: dict) -> dict[str, Any]:
    """A streamed completion read whole: each index's text, its finish chunks, the usage chunk, [DONE]."""
    path, body = body_of(case)
    texts: dict[int, str] = {}
    finishes: list[int] = []
    got: dict[str, Any] = {"usage": None, "done": False, "errors": []}
    with client.stream("POST", path, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            data = line.removeprefix("data: ")
            if not line.startswith("data: ") or data == "[DONE]":
                got["done"] = got["done"] or data == "[DONE]"
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                got["errors"].append(chunk["error"])
            got["usage"] = chunk.get("usage") or got["usage"]
            for choice in chunk.get("choices", []):
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
                if choice["finish_reason"]:
                    finishes.append(choice["index"])
    return {**got, "texts": texts, "finishes": finishes}


def side_by_side(client: Any, faults: Faults, cases: list[dict], stream: bool = False) -> list[Any]:
    """The cases' answers, sent at once and admitted together (the first as a stream where asked)."""
    faults.reset(expect=len(cases))
    send: list[Callable[[], Any]] = [
        (lambda case=case: client.post(*body_of(case)[:1], json=body_of(case)[1])) for case in cases
    ]
    if stream:
        send[0] = lambda: streamed(client, cases[0])
    pool = concurrent.futures.ThreadPoolExecutor(len(cases))
    try:  # bounded: a request left hanging is answered when the server stops (the module's end)
        futures = [pool.submit(call) for call in send]
        deadline = time.monotonic() + ANSWER_S
        while not all(future.done() for future in futures):
            concurrent.futures.wait(futures, timeout=0.05)
            if faults.steps > MAX_STEPS or time.monotonic() > deadline:
                pytest.fail(f"a request is still unanswered after {faults.steps} steps: a session steps forever")
        return [future.result() for future in futures]
    finally:
        pool.shutdown(wait=False)
        faults.active = False


def check_as_offline(model: Model, case: dict, response: Any) -> None:
    """``response`` (a body, or a read stream) holds each of the case's choices once, as offline, usage summed once."""
    expected = offline(model, case)
    if isinstance(response, dict):  # a stream
        assert response["errors"] == [] and response["done"]
        assert sorted(response["finishes"]) == list(range(len(expected))), "every choice finishes, once"
        texts, usage = [response["texts"][i] for i in range(len(expected))], response["usage"]
    else:
        assert response.status_code == 200, response.text
        indices = [c["index"] for c in response.json()["choices"]]
        assert sorted(indices) == list(range(len(expected))), f"each index once: {indices}"
        texts = [c["text"] for c in sorted(response.json()["choices"], key=lambda c: c["index"])]
        usage = response.json()["usage"]
    assert texts == [e["text"] for e in expected]
    assert {k: usage[k] for k in COUNTERS} == {k: sum(e[k] for e in expected) for k in COUNTERS}


def test_the_batch_mates_finish_apart(model: Model) -> None:
    """The premise of the recovery tests: QUICK's choices finish apart, MATE still decodes between them."""
    quick, [mate] = [e["steps"] for e in offline(model, QUICK)], offline(model, MATE)
    assert quick[0] < quick[1] and quick[0] < mate["steps"], (quick, mate["steps"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_failed_shared_step_decodes_only_the_unanswered_choices(
    serving: tuple[Any, Faults], model: Model, stream: bool
) -> None:
    """Choice 0 answered, then the step shared with a batch-mate fails: choice 1 alone decodes again."""
    client, faults = serving
    quick, mate = side_by_side(client, faults, [QUICK, MATE], stream)
    assert faults.failed, "the batch-mate's rows failed after a choice was answered"
    assert mate.status_code == 500 and "out of memory" in mate.json()["error"]["message"]
    check_as_offline(model, QUICK, quick)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.sampled_from([QUICK["prompt"], *PROMPTS[:3]]),  # sampled choices of these often end steps apart
    seed=st.integers(0, 4),
    n=st.integers(2, 4),
    stream=st.booleans(),
)
def test_n_choices_served_equal_n_offline_decodes_after_a_batch_mate_fails(
    serving: tuple[Any, Faults], model: Model, prompt: str, seed: int, n: int, stream: bool
) -> None:
    """Metamorphic: served with ``n`` choices beside a batch-mate that fails once a sample finished
    (whichever that is), a request equals ``n`` offline decodes with its seed; the mate equals its
    offline decode, or gets its error where it was still decoding."""
    client, faults = serving
    case = {**QUICK, "prompt": prompt, "seed": seed, "n": n}
    served, mate = side_by_side(client, faults, [case, MATE], stream)
    check_as_offline(model, case, served)
    if mate.status_code == 500:
        assert "out of memory" in mate.json()["error"]["message"]
    else:
        check_as_offline(model, MATE, mate)


def test_a_sample_that_never_finishes_fails_with_the_rounds_bound(serving: tuple[Any, Faults], model: Model) -> None:
    """A stalled sample gets one 500 naming the bound (not a server stepping forever); its batch-mates are served."""
    client, faults = serving
    good = {**QUICK, "n": 1}
    stalled, answered = side_by_side(client, faults, [STALLED, good])
    assert stalled.status_code == 500, stalled.text
    message = stalled.json()["error"]["message"]
    assert "did not finish sample uid(s)" in message and "within" in message and "rounds" in message, message
    check_as_offline(model, good, answered)
