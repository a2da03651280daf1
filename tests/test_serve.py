"""The server, started for real on a loopback port, against what offline decoding gives.

A served request returns the tokens' text and the counters that :meth:`dlmsearch.api.Decoder.generate`
(the CLI's own decode call) gives for the same prompt, settings and seed, whatever else is being
served: every preset, mixed lengths, sampling, seeds and choices, all at once. Then the
streaming format, every bad input with its status and error body, back-pressure, a client
that goes away, a step that fails, and SIGTERM.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from serving import metric, running_server, wait_until

from dlmsearch.api import Decoder, Model, compose_settings
from dlmsearch.config import decoder_presets

MODEL = "countdown"
BLOCK = 8  # the shipped Countdown model's block length (its trained_on.json)
PROMPTS = [
    "Make 24 from 3 4 6 2.",
    "Make 10 from 2 5 1.",
    "Make 30 from 5 6 2 1.",
    "Make 7 from 9 2.",
    "Make 48 from 8 6 2 3.",
    "Make 15 from 3 5 7.",
]


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load(MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> str:
    with running_server(
        ["+decoder=fast_dllm", "serve.presets=all", "serve.max_n=4", "serve.max_batch=32"],
        cwd=str(tmp_path_factory.mktemp("serve")),
    ) as (_, url, _):
        yield url


def offline(model: Model, case: dict) -> list[dict]:
    """What the offline path gives for a case: one record per choice (item ``i`` of the prompt repeated n times)."""
    options = {f"decoder.{k}": v for k, v in case.get("decoder", {}).items()}
    decoder = Decoder.from_preset(case.get("preset", "fast_dllm"), overrides=options)
    gen_length = -(-case.get("max_tokens", 16) // BLOCK) * BLOCK
    out = decoder.generate(
        model,
        [case["prompt"]] * case.get("n", 1),
        gen_length=gen_length,
        block_length=BLOCK,
        chat=case["chat"],
        seed=case.get("seed", 0),
        temperature=case.get("temperature"),
        top_p=case.get("top_p"),
        top_k=case.get("top_k"),
    )
    return [
        {
            "text": g.text,
            "steps": g.steps,
            "row_forwards": g.row_forwards,
            "token_forwards": g.token_forwards,
            "tokens_committed": g.tokens_committed,
        }
        for g in out
    ]


def body_of(case: dict) -> tuple[str, dict]:
    body = {k: v for k, v in case.items() if k not in ("chat", "prompt")}
    body["model"] = MODEL
    if case["chat"]:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": case["prompt"]}]}
    return "/v1/completions", {**body, "prompt": case["prompt"]}


def served(client: httpx.Client, case: dict) -> list[dict]:
    path, body = body_of(case)
    response = client.post(path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    data = response.json()
    texts = [c["message"]["content"] if case["chat"] else c["text"] for c in data["choices"]]
    assert len(texts) == case.get("n", 1)
    if case.get("n", 1) == 1:
        return [
            {
                "text": texts[0],
                **{k: data["usage"][k] for k in ("steps", "row_forwards", "token_forwards", "tokens_committed")},
            }
        ]
    return [{"text": t} for t in texts]


def cases() -> list[dict]:
    """Every preset, with mixed lengths, endpoints, seeds and sampling."""
    out = []
    # a free prompt has no verdict to read: mcts_verified is refused (BAD_INPUTS), mcts is served
    # a length policy starts at the server's task.gen_length, its ceiling max_tokens: tests/test_length_serving.py
    served = [p for p in decoder_presets("mask") if p != "mcts_verified" and p not in ("daedal", "rho_eos")]
    for i, preset in enumerate(served):
        case = {
            "preset": preset,
            "prompt": PROMPTS[i % len(PROMPTS)],
            "chat": i % 2 == 0,
            "max_tokens": (16, 8, 24)[i % 3],
            "seed": i,
        }
        if i % 4 == 1:
            case |= {"temperature": 0.8, "top_k": 20}
        if i % 4 == 3:
            case |= {"temperature": 0.5, "top_p": 0.9}
        out.append(case)
    out += [
        {"prompt": PROMPTS[0], "chat": True, "max_tokens": 16, "seed": 11, "temperature": 1.0, "n": 3},
        {"prompt": PROMPTS[1], "chat": False, "max_tokens": 16, "seed": 12, "decoder": {"commit.threshold": 0.7}},
        {
            "preset": "adalook",
            "prompt": PROMPTS[2],
            "chat": True,
            "max_tokens": 16,
            "seed": 13,
            "decoder": {"expansion.max_depth": 2},
        },
    ]
    return out


def test_served_equals_offline_under_concurrency(server: str, model: Model) -> None:
    """Every preset at once from 16 clients, each answer equal to offline decoding."""
    all_cases = cases()
    with httpx.Client(base_url=server) as client, concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda case: served(client, case), all_cases))
    for case, answer in zip(all_cases, got):
        expected = offline(model, case)
        if case.get("n", 1) > 1:
            expected = [{"text": e["text"]} for e in expected]
        assert answer == expected, case


def test_mixed_sampling_shares_one_forward(server: str, model: Model) -> None:
    """One preset at six sampling settings and two commit thresholds at once: each answer equals its
    offline decode, and the steps the server took are fewer than the requests' own steps added up
    (they shared the steps)."""
    settings = [{}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.0, "top_k": 5}, {"top_k": 3}]
    settings += [{"temperature": 0.5}, {"temperature": 0.9, "top_p": 0.8, "top_k": 20}]
    settings += [{"decoder": {"commit.threshold": 0.5}}, {"temperature": 0.7, "decoder": {"commit.threshold": 0.99}}]
    mixed = [
        {"prompt": PROMPTS[i % len(PROMPTS)], "chat": True, "max_tokens": 24, "seed": 40 + i, **extra}
        for i, extra in enumerate(settings)
    ]
    before = metric(server, "dlmsearch_steps_total")
    with httpx.Client(base_url=server) as client, concurrent.futures.ThreadPoolExecutor(len(mixed)) as pool:
        got = list(pool.map(lambda case: served(client, case), mixed))
    taken = metric(server, "dlmsearch_steps_total") - before
    for case, answer in zip(mixed, got):
        assert answer == offline(model, case), case
    assert taken < sum(answer[0]["steps"] for answer in got)


def test_openai_client_and_streaming(server: str, model: Model) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    case = {"prompt": PROMPTS[0], "chat": True, "max_tokens": 32, "seed": 5}
    [expected] = offline(model, case)
    whole = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": case["prompt"]}], max_tokens=32, seed=5
    )
    assert whole.choices[0].message.content == expected["text"]
    assert whole.model_dump()["usage"]["steps"] == expected["steps"]
    assert whole.model_dump()["usage"]["token_forwards"] == expected["token_forwards"]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": case["prompt"]}],
        max_tokens=32,
        seed=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, reasons, usages = [], [], []
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert "".join(pieces) == expected["text"]
    assert len(pieces) >= 2, "fast_dllm's blocks are final when committed: the text comes block by block"
    assert reasons == [whole.choices[0].finish_reason]
    assert usages and usages[0].completion_tokens == whole.usage.completion_tokens
    completion = client.completions.create(
        model=MODEL, prompt=PROMPTS[3], max_tokens=16, seed=2, extra_body={"preset": "ete"}
    )
    assert (
        completion.choices[0].text
        == offline(model, {"preset": "ete", "prompt": PROMPTS[3], "chat": False, "max_tokens": 16, "seed": 2})[0][
            "text"
        ]
    )


def sse_texts(response: httpx.Response) -> tuple[list[str], bool]:
    """The text pieces of a completions stream, and whether it ended with [DONE]."""
    pieces, done = [], False
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            done = True
            continue
        for choice in json.loads(data)["choices"]:
            if choice["text"]:
                pieces.append(choice["text"])
    return pieces, done


def test_a_revising_decoder_streams_only_what_cannot_change(server: str, model: Model) -> None:
    case = {"preset": "remdm", "prompt": PROMPTS[4], "chat": False, "max_tokens": 32, "seed": 1}
    [expected] = offline(model, case)
    path, body = body_of(case)
    with httpx.stream("POST", server + path, json={**body, "stream": True}, timeout=60) as response:
        pieces, done = sse_texts(response)
    assert done and "".join(pieces) == expected["text"]
    assert len(pieces) <= 1, "ReMDM may remask a committed token: nothing streams before the end"


BAD_INPUTS = [
    # (what, path, raw body or JSON, headers, status, error code, param)
    ("malformed JSON", "/v1/completions", b'{"model": "countdown", "prompt": ', {}, 400, "invalid_json", None),
    ("not an object", "/v1/completions", b"[1, 2]", {}, 400, "invalid_json", None),
    (
        "non-UTF-8 body",
        "/v1/completions",
        b'{"model": "countdown", "prompt": "\xff\xfe"}',
        {},
        400,
        "invalid_encoding",
        None,
    ),
    ("missing prompt", "/v1/completions", {"model": MODEL}, {}, 400, "missing_field", "prompt"),
    ("missing messages", "/v1/chat/completions", {"model": MODEL}, {}, 400, "missing_field", "messages"),
    ("empty messages", "/v1/chat/completions", {"model": MODEL, "messages": []}, {}, 400, "invalid_value", "messages"),
    ("missing model", "/v1/completions", {"prompt": "x"}, {}, 400, "missing_field", "model"),
    (
        "wrong type",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "temperature": "hot"},
        {},
        400,
        "invalid_value",
        "temperature",
    ),
    (
        "max_tokens beyond the context",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "max_tokens": 4096},
        {},
        400,
        "context_length_exceeded",
        "max_tokens",
    ),
    (
        "max_tokens zero",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "max_tokens": 0},
        {},
        400,
        "invalid_value",
        "max_tokens",
    ),
    ("unknown model", "/v1/completions", {"model": "gpt-4", "prompt": "x"}, {}, 404, "model_not_found", "model"),
    ("n above the limit", "/v1/completions", {"model": MODEL, "prompt": "x", "n": 5}, {}, 400, None, "n"),
    (
        "an option the plan refuses",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "decoder": {"commit.threshold": 2.0}},
        {},
        400,
        "decoder_refused",
        "decoder",
    ),
    (
        "an option that does not exist",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "decoder": {"no_such_key": 1}},
        {},
        400,
        "decoder_refused",
        "decoder",
    ),
    (
        "an unknown preset",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "preset": "nope"},
        {},
        400,
        "preset_not_allowed",
        "preset",
    ),
    (
        "a tree search whose value reads a verdict a prompt does not have",
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "preset": "mcts_verified"},
        {},
        400,
        "decoder_refused",
        "preset",
    ),
    ("an empty prompt", "/v1/completions", {"model": MODEL, "prompt": ""}, {}, 400, None, "prompt"),
    ("oversized body", "/v1/completions", {"model": MODEL, "prompt": "x" * 1_100_000}, {}, 413, "body_too_large", None),
    ("unknown route", "/v1/embeddings", {"model": MODEL, "input": "x"}, {}, 404, "not_found", None),
]


@pytest.mark.parametrize("what, path, body, headers, status, code, param", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_gets_an_openai_error(
    server: str, what: str, path: str, body: object, headers: dict, status: int, code: str | None, param: str | None
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        server + path, content=content, headers={"content-type": "application/json", **headers}, timeout=30
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    assert httpx.get(server + "/health", timeout=10).json()["status"] == "ok"


SLOW = {"preset": "llada", "prompt": PROMPTS[5], "chat": False, "max_tokens": 96, "n": 4, "temperature": 0.7, "seed": 3}


def test_a_client_that_goes_away_frees_its_slots(server: str, model: Model) -> None:
    path, body = body_of(SLOW)
    ok_before = metric(server, 'dlmsearch_requests_total{outcome="ok"}')
    with httpx.Client(base_url=server, timeout=60) as client:
        other = concurrent.futures.ThreadPoolExecutor(1).submit(
            served, client, {"prompt": PROMPTS[1], "chat": True, "max_tokens": 16, "seed": 8}
        )
        with client.stream("POST", path, json={**body, "stream": True}) as response:
            next(response.iter_lines())  # its first block (of 12): the client leaves now
        wait_until(
            lambda: metric(server, "dlmsearch_running_samples") == 0 and other.done(),
            f"the slots to be freed (other done: {other.done()}, health: {httpx.get(server + '/health').text})",
        )
        assert other.result() == offline(model, {"prompt": PROMPTS[1], "chat": True, "max_tokens": 16, "seed": 8})
    assert metric(server, 'dlmsearch_requests_total{outcome="ok"}') == ok_before + 1  # only the other request finished


def test_a_full_queue_answers_429(tmp_path) -> None:
    with running_server(["+decoder=llada", "serve.max_batch=1", "serve.max_queue=1"], cwd=str(tmp_path)) as (_, url, _):
        path, body = body_of({**SLOW, "n": 1})
        with httpx.Client(base_url=url, timeout=120) as client, concurrent.futures.ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(lambda _: client.post(path, json=body), range(6)))
        codes = sorted(r.status_code for r in statuses)
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
        limited = next(r for r in statuses if r.status_code == 429).json()["error"]
        assert limited["code"] == "queue_full" and limited["type"] == "rate_limit_error"


def test_sigterm_drains_then_exits_zero(tmp_path, model: Model) -> None:
    with running_server(["+decoder=llada", "serve.grace_s=60"], cwd=str(tmp_path)) as (process, url, lines):
        path, body = body_of(SLOW)
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(response=httpx.post(url + path, json=body, timeout=120)))
        thread.start()
        wait_until(lambda: metric(url, "dlmsearch_running_samples") >= 1, "the request to run")
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        refused = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        thread.join(120)
        assert result["response"].status_code == 200, result["response"].text
        texts = [c["text"] for c in result["response"].json()["choices"]]
        assert texts == [e["text"] for e in offline(model, SLOW)]
        assert process.wait(60) == 0, "\n".join(lines)


def test_a_step_that_fails_fails_only_its_request(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of memory for one request's rows, even alone: it gets a 500, the others decode as offline."""
    from fastapi.testclient import TestClient

    from dlmsearch.models.adapter import ModelAdapter
    from dlmsearch.serve.app import Server, create_app

    poison = int(model.tokenizer.convert_tokens_to_ids("999"))
    original = ModelAdapter.window_logits

    def window_logits(self, tokens: torch.Tensor, *args, **kwargs):
        if bool((tokens == poison).any()):
            raise torch.OutOfMemoryError("out of memory (a test's model that cannot take this row)")
        return original(self, tokens, *args, **kwargs)

    monkeypatch.setattr(ModelAdapter, "window_logits", window_logits)
    overrides = ["+decoder=fast_dllm"]
    server = Server(compose_settings(overrides, (), "serve"), overrides, MODEL)
    good = [{"prompt": p, "chat": False, "max_tokens": 16, "seed": i} for i, p in enumerate(PROMPTS[:3])]
    bad = {"prompt": "Make 999 from 9 9 9.", "chat": False, "max_tokens": 16}
    with TestClient(create_app(server)) as client, concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client.post, *body_of(case)[:1], json=body_of(case)[1]) for case in [*good, bad]]
        responses = [f.result() for f in futures]
    assert responses[-1].status_code == 500 and "out of memory" in responses[-1].json()["error"]["message"]
    for case, response in zip(good, responses):
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == offline(model, case)[0]["text"]
        assert response.json()["usage"]["token_forwards"] == offline(model, case)[0]["token_forwards"]
