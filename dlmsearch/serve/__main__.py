"""``python -m dlmsearch.serve [model=...] +decoder=NAME [serve.port=...]``: start the server.

Composed by Hydra from ``conf/serve.yaml`` (``conf/config.yaml`` and the server's settings),
served by uvicorn on a socket bound here (``serve.port=0``: any free port; the line
``dlmsearch.serve: listening on http://HOST:PORT`` says which). SIGTERM or SIGINT drains: new
requests get 503 ``shutting_down``, what is queued or running has ``serve.grace_s`` to finish;
what is still unfinished then gets a 503 ``server_shutdown`` (a JSON body, or an error event and
``[DONE]`` on a stream) and one log line each, and the process exits 0 (a second signal exits
at once).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import hydra
from omegaconf import DictConfig

from dlmsearch.config import CONF_DIR, ConfigError
from dlmsearch.startup import fail, require_decoder, start


def _socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def serve(cfg: DictConfig, overrides: list[str], model_name: str) -> None:
    """Build the server, listen, and drain on SIGTERM."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"the server needs {', '.join(missing)} (the serve extra): pip install -e '.[serve]' in a clone of dlmsearch, or pip install 'dlmsearch-<version>.whl[serve]' for the wheel"
        )
    import uvicorn

    from dlmsearch.serve.app import Server, create_app

    server = Server(cfg, overrides, model_name)
    app = create_app(server)
    sock = _socket(str(cfg.serve.host), int(cfg.serve.port))
    host, port = sock.getsockname()[:2]

    class Draining(uvicorn.Server):
        """uvicorn's server whose first exit signal drains the decode loop before exiting."""

        draining = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.draining:  # a second signal: exit now
                super().handle_exit(sig, frame)
                return
            self.draining = True
            server.scheduler.drain()
            print(
                f"dlmsearch.serve: draining (new requests get 503; up to {server.grace_s:g} s for the running ones, serve.grace_s)",
                flush=True,
            )
            threading.Thread(target=self.finish, daemon=True).start()

        def finish(self) -> None:
            """Wait out the grace, answer what is still unfinished (before uvicorn would cancel its
            tasks: a cut connection and a traceback each), then exit."""
            deadline = time.monotonic() + server.grace_s
            while not server.scheduler.idle and time.monotonic() < deadline:
                time.sleep(0.05)
            if not server.scheduler.idle:
                server.cut_off()
            self.should_exit = True

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, lifespan="on")
    runner = Draining(config)
    where = f"[{host}]" if ":" in host else host
    print(
        f"dlmsearch.serve: {server.model_name} with {server.lanes.preset}; listening on http://{where}:{port}",
        flush=True,
    )
    runner.run(sockets=[sock])
    print("dlmsearch.serve: stopped", flush=True)


@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="serve")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    require_decoder(cfg)
    hydra_cfg = HydraConfig.get()
    try:
        serve(cfg, list(hydra_cfg.overrides.task), str(hydra_cfg.runtime.choices.get("model", "dlmsearch")))
    except (ConfigError, FileNotFoundError, ValueError, TypeError, OSError) as error:
        fail(error)


def main() -> None:
    """The command line is checked first (as ``python -m dlmsearch``'s): an unknown key, group or
    option is one line naming it and the closest valid names, exit 2."""
    start(_main, "serve")


if __name__ == "__main__":
    main()
