"""Real servers on loopback for the tests: the proxy under uvicorn in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

from proxy.config import Config
from proxy.server.app import create_app
from proxy.server.runner import server_config


def proxy_server(config: Config, **kwargs: object) -> ServerThread:
    """The proxy built from `config`, served as `compaction-proxy serve` would serve it;
    entered once it is ready (its tokenizer loaded)."""
    return served(create_app(config, **kwargs), config)  # type: ignore[arg-type]


def served(app: Starlette, config: Config) -> ServerThread:
    """`app`, made by `create_app` from `config`, served as `proxy_server` serves it."""
    return ServerThread(app, server_config(app, config), ready=lambda: app.state.proxy.limits.warm)


class ServerThread:
    """Runs an ASGI app with uvicorn on 127.0.0.1 on a free port, in its own thread and loop."""

    def __init__(
        self,
        app: ASGIApp,
        config: uvicorn.Config | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.ready = ready
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        config = config or uvicorn.Config(app, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})
        self.thread.daemon = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        # Generous: a proxy in front of litellm imports it first (~8 s with the suite's other
        # workers beside it); a server that fails to start ends its thread at once.
        deadline = time.monotonic() + 60
        while not (self.server.started and self.ready()):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
