"""The server through the one continuous batcher (dlmsearch/search/batcher.py): the padding bound,
the rounds' bound and the fallback, on the same path as the CLI's, against offline decoding.

A request whose prompt is far narrower than what decodes waits until that decode has drained;
a request that fails alone (here: past the rounds' bound) decodes again with the server's
``fallback`` preset and says so in its usage; one the fallback cannot decode either gets one
500 naming both errors. Everything runs in-process (the recovery tests' gated admission).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from test_serve import MODEL
from test_serve_recovery import MATE, QUICK, STALLED, Faults, check_as_offline, model, serving, side_by_side

from dlmsearch.api import Model, compose_settings
from dlmsearch.search.batcher import Admission
from dlmsearch.search.decode.intake import DecodeRequest
from dlmsearch.search.session import DecodeSession

__all__ = ["model", "serving"]  # the fixtures, used here as in test_serve_recovery

# Far wider than QUICK's prompt: the padding it would add to QUICK's canvas is past the slack.
WIDE = {"prompt": "Make 24 from " + " ".join(["3 4 6 2"] * 5) + ".", "chat": False, "max_tokens": 8}
NEAR = {"prompt": "Make 10 from 2 5 1.", "chat": False, "max_tokens": 8}  # about QUICK's width


class Unit:
    """A stand-in unit for the admission rule: ``samples`` prompts of ``width`` tokens, 8 generated."""

    def __init__(self, width: int, samples: int = 1, rows: int = 1) -> None:
        self.samples, self.rows, self.width = samples, rows, width

    def requests(self) -> list[DecodeRequest]:
        return [
            DecodeRequest(uid=i, prompt=torch.zeros(self.width, dtype=torch.long), generation=torch.zeros(8))
            for i in range(self.samples)
        ]


def test_the_admission_bounds_samples_rows_and_padding() -> None:
    admission = Admission(batch_size=4, max_rows=6, padding_slack=0.25)
    assert admission.allows(Unit(40, samples=9, rows=99), samples=0, rows=0, width=10), "nothing runs: always"
    assert admission.allows(Unit(12), samples=3, rows=3, width=10)
    assert not admission.allows(Unit(12, samples=2), samples=3, rows=3, width=10), "batch size"
    assert not admission.allows(Unit(12, rows=4), samples=1, rows=3, width=10), "rows budget"
    assert not admission.allows(Unit(2), samples=1, rows=1, width=10), "8 columns of padding on a 10-column canvas"
    assert not admission.allows(Unit(20), samples=1, rows=1, width=10), "it would pad the running decode by 10"
    assert admission.allows(Unit(2), samples=1, rows=1, width=None), "a decode of its own: no padding"
    assert Admission(padding_slack=None).allows(Unit(2), samples=1, rows=1, width=100)


@pytest.fixture
def widths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The samples of every step the server takes (while a test runs)."""
    seen: list[int] = []
    stepped = DecodeSession.step

    def step(session: DecodeSession) -> list:
        seen.append(len(session.uids))
        return stepped(session)

    monkeypatch.setattr(DecodeSession, "step", step)
    return seen


def test_a_far_wider_prompt_waits_for_the_decode_to_drain(
    serving: tuple[Any, Faults], model: Model, widths: list[int]
) -> None:
    """Queued together, QUICK and a far wider prompt never share a step; both decode as offline."""
    client, faults = serving
    quick, wide = side_by_side(client, faults, [{**QUICK, "n": 1}, WIDE])
    assert max(widths) == 1, widths
    check_as_offline(model, {**QUICK, "n": 1}, quick)
    check_as_offline(model, WIDE, wide)


def test_prompts_of_about_one_width_share_the_steps(
    serving: tuple[Any, Faults], model: Model, widths: list[int]
) -> None:
    """The control: the same gate puts prompts of about one width in one decode."""
    client, faults = serving
    _quick, near = side_by_side(client, faults, [{**QUICK, "n": 1}, NEAR])
    assert max(widths) == 2, widths
    check_as_offline(model, NEAR, near)


@pytest.fixture(scope="module")
def falling_back(model: Model) -> Iterator[tuple[Any, Faults]]:
    """A server of ``+decoder=fast_dllm fallback=llada`` with the recovery tests' faults (the stall
    stops fast_dllm's threshold rule only: llada commits by confidence rank)."""
    from fastapi.testclient import TestClient

    from dlmsearch.serve.app import Server, create_app

    token = lambda word: int(model.tokenizer.convert_tokens_to_ids(word))
    faults = Faults(token("999"), token("777"))
    with pytest.MonkeyPatch.context() as monkeypatch:
        faults.patch(monkeypatch)
        overrides = ["+decoder=fast_dllm", "fallback=llada"]
        server = Server(compose_settings(overrides, (), "serve"), overrides, MODEL)
        with TestClient(create_app(server)) as client:
            yield client, faults


def test_a_request_past_the_rounds_bound_falls_back(falling_back: tuple[Any, Faults], model: Model) -> None:
    """The stalled request fails alone at the rounds' bound, then llada decodes it as offline (marked);
    its batch-mate is served by the server's own preset."""
    client, faults = falling_back
    good = {**QUICK, "n": 1}
    stalled, answered = side_by_side(client, faults, [STALLED, good])
    check_as_offline(model, {**STALLED, "preset": "llada"}, stalled)
    assert stalled.json()["usage"]["fallback"] == "llada"
    check_as_offline(model, good, answered)
    assert "fallback" not in answered.json()["usage"]


def test_a_request_the_fallback_fails_too_gets_both_errors(
    falling_back: tuple[Any, Faults], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, faults = falling_back
    poison = faults.poison
    stepped = DecodeSession.step

    def step(session: DecodeSession) -> list:
        if session.state is not None and bool((session.state.canvas.tokens == poison).any()):
            raise RuntimeError(f"{session.decoder.name} cannot decode this")
        return stepped(session)

    monkeypatch.setattr(DecodeSession, "step", step)
    response = client.post("/v1/completions", json={"model": MODEL, "prompt": MATE["prompt"], "max_tokens": 8})
    assert response.status_code == 500, response.text
    message = response.json()["error"]["message"]
    assert "fast_dllm cannot decode this" in message and "fallback llada" in message, message
    assert "llada cannot decode this" in message.split("fallback llada")[1], message
