"""Run an app with uvicorn in a background thread on a free loopback port (tests, scripts).

Example::

    with LiveServer(app) as server:
        httpx.get(server.url + "/health")
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


class LiveServer:
    """``app`` served on ``127.0.0.1:<free port>`` until the ``with`` block ends."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", startup_timeout_s: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((host, 0))  # the OS picks a free port; uvicorn serves on this very socket
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self._startup_timeout_s = startup_timeout_s

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self.sock.close()
