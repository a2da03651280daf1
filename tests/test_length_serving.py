"""A length policy behind the server (issue 50): a request's ``max_tokens`` is the ceiling, the decode
starts at the server's ``task.gen_length``, and the usage reports the length the decode came to."""

from __future__ import annotations

from pathlib import Path

import httpx
from serving import running_server

PROBLEM = "Make 54 from 10, 4, 16."


def test_max_tokens_is_the_ceiling_and_the_length_used_is_reported(tmp_path: Path) -> None:
    overrides = ["model=countdown", "+decoder=rho_eos", "task.gen_length=8"]
    with running_server(overrides, cwd=str(tmp_path)) as (_, url, lines):
        lengths = {}
        for ceiling in (16, 40):
            body = {"model": "countdown", "messages": [{"role": "user", "content": PROBLEM}], "max_tokens": ceiling}
            response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
            assert response.status_code == 200, (response.text, lines[-10:])
            usage = response.json()["usage"]
            assert usage["preset"] == "rho_eos", usage
            assert 0 <= usage["length"] <= ceiling and usage["completion_tokens"] <= ceiling, usage
            lengths[ceiling] = usage["length"]
        too_long = {"model": "countdown", "messages": [{"role": "user", "content": PROBLEM}], "max_tokens": 4000}
        refused = httpx.post(url + "/v1/chat/completions", json=too_long, timeout=60)
        assert refused.status_code == 400 and "maximum length of 128" in refused.text, refused.text
    assert lengths[16] != 8 or lengths[40] != 8, lengths  # the decode moved away from its initial length
