"""The proxy under uvicorn: its settings, and how it stops on SIGTERM or SIGINT.

uvicorn alone stops accepting at once, then waits without end for every open response (an
endless stream keeps the process alive) and exits by re-raising the signal. Here the first
signal makes /readyz answer 503 while the proxy goes on accepting for
`listen.shutdown_delay_seconds`, so that a load balancer sees it and stops sending; then the
listener closes and in-flight requests have `listen.shutdown_grace_seconds` to finish; the
gate ends those still running (their upstream connections closed), and the process exits 0.
SIGINT (Ctrl-C) skips the delay; a second signal skips what is left of both waits.
A WebSocket is closed (1012, service restart) when the listener closes, or, when a request
of its is under way then, once that is over (`DrainingWebSocket`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from proxy.config import Config, Listen
from proxy.server.gate import Gate
from proxy.server.protocol import protocol_for

log = logging.getLogger("compaction_proxy")


def server_config(app: ASGIApp, config: Config, **overrides: object) -> uvicorn.Config:
    """uvicorn's settings for the proxy: uvloop and httptools when installed, and the
    upstream's own Date and Server headers relayed instead of uvicorn's. The gate ends what is
    left when the shutdown's grace is over; uvicorn's own bound only backs it up."""
    options: dict[str, object] = {
        "host": config.listen.host,
        "port": config.listen.port,
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "date_header": False,
        # Nothing reads the client's address or scheme: X-Forwarded-* need not be read.
        "proxy_headers": False,
        "lifespan": "on",
        "http": protocol_for(config.listen),  # httptools', its heads bounded
        "timeout_graceful_shutdown": math.ceil(config.listen.shutdown_grace_seconds) + 5,
        # A WebSocket's frame is a request body: the same bound (uvicorn closes the
        # connection, 1009, on a larger one).
        "ws_max_size": config.listen.max_body_bytes,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)  # type: ignore[arg-type]


class Server(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        gate: Gate,
        listen: Listen,
        facts: Mapping[str, Any] | None = None,
    ) -> None:
        config.ws = draining_websockets(gate)
        super().__init__(config)
        self.gate = gate
        self.listen = listen
        self.facts = facts or {}  # said with where it listens: version, store, upstreams…
        self._signalled_at: float | None = None
        self._delay = 0.0
        self._announced = False
        self._hurry = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: it sets flags for the loop to act on, and the signal is not
        # re-raised after the shutdown (uvicorn's way), so that the exit status is 0.
        if self._signalled_at is None:
            # No load balancer waits on an interrupt from a terminal: Ctrl-C skips the delay.
            delay = 0.0 if sig == signal.SIGINT else self.listen.shutdown_delay_seconds
            self._signalled_at = time.monotonic()
            self._delay = delay
            self.gate.draining = True
            return
        self._hurry = self.should_exit = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._end)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        # Where it listens, once it does (uvicorn's own line is below its log level).
        for bound in (s.getsockname() for server in self.servers for s in server.sockets):
            host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            log.info("listening", extra={"url": f"http://{host}:{bound[1]}", **self.facts})

    async def on_tick(self, counter: int) -> bool:
        signalled = self._signalled_at
        if signalled is not None and not self.should_exit:
            if not self._announced:
                self._announced = True
                log.info("draining: not ready", extra={"delay_seconds": self._delay})
            self.should_exit = time.monotonic() - signalled >= self._delay
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown (stop accepting, close idle connections, wait for the rest),
        with the in-flight requests ended when the grace period is over."""
        log.info("shutting down", extra={"in_flight": self.gate.in_flight})
        grace = 0.0 if self._hurry else self.listen.shutdown_grace_seconds
        ending = asyncio.get_running_loop().call_later(grace, self._end)
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()

    def _end(self) -> None:
        ended = self.gate.end_all()
        if ended:
            log.warning("shutdown grace over: requests ended", extra={"ended": ended})


def draining_websockets(gate: Gate) -> type[WebSocketsSansIOProtocol]:
    """uvicorn's WebSocket protocol, that at shutdown lets a request under way finish first:
    uvicorn's own closes every WebSocket at once, cutting off the answer it is sending."""

    class DrainingWebSocket(WebSocketsSansIOProtocol):
        _task: asyncio.Task[object] | None = None  # the app's, once the handshake is in

        async def run_asgi(self) -> None:
            self._task = asyncio.current_task()
            await super().run_asgi()

        def shutdown(self) -> None:
            close = super().shutdown
            # Once the request is over, and what the app sends on its way out (an error
            # event for an answer cut short) has gone.
            if self._task is None or not gate.after(self._task, lambda: self.loop.call_soon(close)):
                close()

    return DrainingWebSocket
