"""Run the dashboard inside another program: uvicorn in a background thread.

Used by the tests and handy in notebooks; ``leap dashboard`` runs uvicorn in the foreground.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from types import TracebackType

import uvicorn
from starlette.applications import Starlette


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    """``with BackgroundServer(app) as url:`` serves ``app`` until the block ends.

    Parameters
    ----------
    app
        The ASGI app (see :func:`leap.dashboard.app.create_app`).
    host, port
        Where to listen; port 0 picks a free one.
    ready_path
        Polled until it answers 200 (e.g. ``/healthz``: the Kafka partitions are assigned).
    timeout
        Seconds to wait for ``ready_path``.
    """

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0, ready_path: str = "/healthz",
                 timeout: float = 30.0) -> None:
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="leap-dashboard-server", daemon=True)
        self.ready_path = ready_path
        self.timeout = timeout

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + self.timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.thread.is_alive():
                raise RuntimeError(f"dashboard server exited during start-up on {self.url}")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as resp:
                    if resp.status == 200:
                        return self.url
            except (urllib.error.URLError, ConnectionError) as exc:
                last = str(exc)
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"{self.url}{self.ready_path} not ready within {self.timeout}s ({last})")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
