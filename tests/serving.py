"""Starting the real server for tests and benchmarks: ``python -m dlmsearch.serve`` in a
subprocess on an ephemeral loopback port, its address read from its start-up line; and reading
its metrics while it runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LISTENING = re.compile(r"listening on (http://\S+)")


@contextmanager
def running_server(
    overrides: list[str], cwd: str | None = None, timeout_s: float = 120.0, threads: int = 1
) -> Iterator[tuple[subprocess.Popen, str, list[str]]]:
    """The server process (run in ``cwd``, where Hydra writes nothing), its base URL and its output lines so far (still collected)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlmsearch.serve",
            "serve.host=127.0.0.1",
            "serve.port=0",
            "hydra.run.dir=.",
            "hydra.output_subdir=null",
            *overrides,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
    )
    lines: list[str] = []
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            match = LISTENING.search(line)
            if match and not found:
                found.append(match.group(1))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not found:
            if process.poll() is not None:
                reader.join(2)
                raise RuntimeError("the server exited before listening:\n" + "\n".join(lines[-30:]))
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start in time:\n" + "\n".join(lines[-30:]))
            time.sleep(0.05)
        yield process, found[0], lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def metric(server: str, name: str) -> float:
    """One sample of ``GET /metrics`` (the first with that name)."""
    import httpx

    for line in httpx.get(server + "/metrics", timeout=10).text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; a failure, never a hang, when it does not."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.02)
