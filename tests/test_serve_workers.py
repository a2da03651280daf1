"""``serve.workers=2``: two front processes on one loopback port, fed by the one engine process.

Requests sent at once through the one port come back equal to offline decoding; ``/metrics``
(asked of whichever front accepts the connection) counts the engine's work, the same from
both; SIGTERM drains, the engine exits 0 and no front process outlives it.
"""

from __future__ import annotations

import concurrent.futures
import signal
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
pytest.importorskip("openai")

from serving import metric, running_server, wait_until
from test_serve import PROMPTS, offline, served

from dlmsearch.api import Model


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux' /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting to be reaped does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def answer_alone(url: str, case: dict) -> list[dict]:
    """A case's answer over a connection of its own."""
    with httpx.Client(base_url=url) as client:
        return served(client, case)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_two_fronts_serve_one_port_then_exit_with_the_engine(tmp_path) -> None:
    model = Model.load("countdown")
    cases = [
        {"prompt": PROMPTS[0], "chat": True, "max_tokens": 16, "seed": 1},
        {"prompt": PROMPTS[1], "chat": False, "max_tokens": 24, "seed": 2, "temperature": 0.8, "top_k": 20},
        {"prompt": PROMPTS[2], "chat": True, "max_tokens": 16, "seed": 3, "n": 2, "temperature": 1.0},
        {"prompt": PROMPTS[3], "chat": False, "max_tokens": 8, "seed": 4},
    ]
    with running_server(["+decoder=fast_dllm", "serve.workers=2"], cwd=str(tmp_path)) as (process, url, lines):
        fronts = children(process.pid)
        assert len([pid for pid in fronts if alive(pid)]) >= 2, f"two front processes: {fronts}"
        # Separate connections, so that both fronts may accept them.
        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            got = list(pool.map(lambda case: answer_alone(url, case), cases))
        for case, answer in zip(cases, got):
            expected = offline(model, case)
            assert answer == (expected if case.get("n", 1) == 1 else [{"text": e["text"]} for e in expected]), case
        counts = {metric(url, 'dlmsearch_requests_total{outcome="ok"}') for _ in range(6)}
        assert counts == {len(cases)}, f"every front reports the engine's one count: {counts}"
        assert metric(url, "dlmsearch_steps_total") > 0
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, "\n".join(lines)
    wait_until(lambda: not any(alive(pid) for pid in fronts), "the engine's children to exit", timeout_s=15)
    assert "Traceback" not in "\n".join(lines), "\n".join(lines)
