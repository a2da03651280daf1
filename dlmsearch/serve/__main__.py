"""``python -m dlmsearch.serve [model=...] +decoder=NAME [serve.port=...] [serve.workers=N]``: start the server.

Composed by Hydra from ``conf/serve.yaml`` (``conf/config.yaml`` and the server's settings).
This process is the engine: it loads the model, builds the decode loop, binds and listens on
the socket (``serve.port=0``: any free port), then starts ``serve.workers`` front processes
(uvicorn over the one listening socket, :func:`~dlmsearch.serve.app.run_front`), each joined
to it by a pipe; once every front serves, the line ``dlmsearch.serve: listening on
http://HOST:PORT`` says where. SIGTERM or SIGINT to this process drains: new requests get 503
``shutting_down``, what is queued or running has ``serve.grace_s`` to finish; what is still
unfinished then gets a 503 ``server_shutdown`` (a JSON body, or an error event and ``[DONE]`` on
a stream) and one log line each, the fronts exit, and so does this process, 0 (a second signal
cuts the grace short). A front that dies is logged; when none is left the engine exits 1.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from typing import Any

import hydra
from omegaconf import DictConfig

from dlmsearch.config import CONF_DIR, ConfigError
from dlmsearch.hydra_job import discard_job_dir
from dlmsearch.startup import fail, require_decoder, start

FRONT_START_S = 300.0  # how long the fronts may take to import, load the tokenizer and listen
FRONT_EXIT_S = 15.0  # how long a front may take to send its last answers once told to stop
BACKLOG = 2048


def _socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)  # connections wait in the backlog until a front accepts them
    return sock


class _Signals:
    """The exit signals as a count the main thread reads (the handler itself does nothing else)."""

    def __init__(self) -> None:
        self.count = 0
        self.event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.handle)

    def handle(self, sig: int, frame: Any) -> None:
        self.count += 1
        self.event.set()


def _start_fronts(engine: Any, sock: socket.socket, workers: int) -> list[Any]:
    """Spawn the front processes, each with one end of a pipe to ``engine``, and wait until each serves."""
    import multiprocessing

    from dlmsearch.serve.app import run_front

    context = multiprocessing.get_context("spawn")  # nothing of the model's threads or memory is inherited
    fronts = []
    for index in range(workers):
        mine, theirs = context.Pipe()
        process = context.Process(
            target=run_front, args=(engine.settings, theirs, sock, index), name=f"dlmsearch-front-{index}", daemon=True
        )
        process.start()
        theirs.close()
        engine.attach(mine)
        fronts.append(process)
    deadline = time.monotonic() + FRONT_START_S
    for process, link in zip(fronts, engine.links):
        while not link.ready.wait(0.1):
            if not process.is_alive() or time.monotonic() > deadline:
                _stop_fronts(fronts, 0.0)
                raise OSError(f"front process {process.name} did not start (exit code {process.exitcode})")
    return fronts


def _stop_fronts(fronts: list[Any], timeout: float) -> None:
    """Wait up to ``timeout`` s for the fronts to exit; end those still running."""
    deadline = time.monotonic() + timeout
    for process in fronts:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in fronts:
        if process.is_alive():
            process.terminate()
            process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)


def _wait(engine: Any, fronts: list[Any], signals: _Signals) -> int:
    """Serve until a signal (then drain: 0) or until every front is gone (1)."""
    alive = set(range(len(fronts)))
    while not signals.event.wait(0.2):
        for index in sorted(alive):
            if not fronts[index].is_alive():
                alive.discard(index)
                print(f"dlmsearch.serve: front process {index} exited (code {fronts[index].exitcode})", flush=True)
        if not alive:
            engine.scheduler.stop()
            return 1
    _drain(engine, signals)
    _stop_fronts(fronts, FRONT_EXIT_S)
    engine.scheduler.stop()
    return 0


def _drain(engine: Any, signals: _Signals) -> None:
    """Stop admissions, give what runs ``serve.grace_s`` (a second signal cuts it short), answer
    what is left with ``server_shutdown``, then tell the fronts to exit (after those answers: one pipe keeps the order)."""
    engine.drain()
    print(
        f"dlmsearch.serve: draining (new requests get 503; up to {engine.grace_s:g} s for the running ones, serve.grace_s)",
        flush=True,
    )
    deadline = time.monotonic() + engine.grace_s
    while not engine.scheduler.idle and time.monotonic() < deadline and signals.count < 2:
        time.sleep(0.05)
    if not engine.scheduler.idle:
        engine.cut_off()
    engine.broadcast(("stop",))


def serve(cfg: DictConfig, overrides: list[str], model_name: str) -> None:
    """Build the engine, listen, start the fronts, and drain on SIGTERM."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"the server needs {', '.join(missing)} (the serve extra): pip install -e '.[serve]' in a clone of dlmsearch, or pip install 'dlmsearch-<version>.whl[serve]' for the wheel"
        )
    from dlmsearch.serve.engine import Engine

    engine = Engine(cfg, overrides, model_name)
    sock = _socket(str(cfg.serve.host), int(cfg.serve.port))
    host, port = sock.getsockname()[:2]
    signals = _Signals()
    fronts = _start_fronts(engine, sock, engine.limits.workers)
    engine.scheduler.start()
    where = f"[{host}]" if ":" in host else host
    workers = engine.limits.workers
    print(
        f"dlmsearch.serve: {engine.settings.model_name} with {engine.lanes.preset}, {workers} front process{'es' if workers > 1 else ''}; listening on http://{where}:{port}",
        flush=True,
    )
    code = _wait(engine, fronts, signals)
    sock.close()
    print("dlmsearch.serve: stopped", flush=True)
    if code:
        sys.exit(code)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="serve")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    require_decoder(cfg)
    hydra_cfg = HydraConfig.get()
    try:
        serve(cfg, list(hydra_cfg.overrides.task), str(hydra_cfg.runtime.choices.get("model", "dlmsearch")))
    except (ConfigError, FileNotFoundError, ValueError, TypeError, OSError) as error:
        discard_job_dir()  # as python -m dlmsearch: a start that failed leaves no run directory
        fail(error)


def main() -> None:
    """The command line is checked first (as ``python -m dlmsearch``'s): an unknown key, group or
    option is one line naming it and the closest valid names, exit 2."""
    start(_main, "serve", "python -m dlmsearch.serve")


if __name__ == "__main__":
    main()
