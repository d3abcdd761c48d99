"""In front of every route: the cap on concurrent requests, and the requests a shutdown waits
for and, once its grace period is over, ends.

Past `listen.max_concurrent_requests` a request is refused at once, before its body is read,
with a 429 and `Retry-After` in the error shape of its API (`error_shapes`). The probes (/healthz,
/readyz, /metrics) are neither refused nor counted: a busy proxy must still say how it is.
A WebSocket connection is not a request: each request over it comes through the gate as a POST
(`server.responses_socket`), and `after` tells when the one under way is over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import APIError, Overloaded, ShuttingDown
from proxy.observability.metrics import Metrics

log = logging.getLogger("compaction_proxy")

PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
RETRY_AFTER_SECONDS = 1

# The proxy's own error for a request (its scope), in the shape of its API.
Render = Callable[[Scope, APIError], Response]


class Gate:
    """ASGI middleware: `gate.around(app)` is `app` behind the gate."""

    def __init__(self, limit: int, metrics: Metrics, render: Render) -> None:
        self.limit = limit
        self.metrics = metrics
        self.render = render
        self.draining = False  # set on shutdown: /readyz then answers 503
        self._app: ASGIApp | None = None
        self._running: set[asyncio.Task[object]] = set()
        self._ended: set[asyncio.Task[object]] = set()
        self._then: dict[asyncio.Task[object], Callable[[], object]] = {}
        metrics.in_flight.set_function(lambda: self.in_flight)  # read when scraped

    def around(self, app: ASGIApp) -> ASGIApp:
        self._app = app
        return self

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def end_all(self) -> int:
        """End every request still running: one not yet answered gets a 503, a stream is cut
        off (its upstream connection closed, as when its client goes away). How many."""
        ending = self._running - self._ended
        for task in ending:
            self._ended.add(task)
            task.cancel()
        return len(ending)

    def after(self, task: asyncio.Task[object], then: Callable[[], object]) -> bool:
        """Call `then` once the request that `task` runs is over; false, and nothing done,
        when it runs none (a WebSocket between two requests)."""
        if task not in self._running:
            return False
        self._then[task] = then
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self._app is not None, "Gate.around was not called"
        if scope["type"] != "http" or scope["path"] in PROBES:
            await self._app(scope, receive, send)
            return
        if len(self._running) >= self.limit:
            refusal = Overloaded(
                f"The proxy is handling {self.limit} requests, its limit; retry shortly."
            )
            self.metrics.refused("overloaded", refusal)
            await self._answer(scope, receive, send, refusal, RETRY_AFTER_SECONDS)
            return
        task = asyncio.current_task()
        assert task is not None
        started = False

        def watched(message: Message) -> Awaitable[None]:
            # No coroutine of its own: the server's send is awaited as it is, every chunk.
            nonlocal started
            started = started or message["type"] == "http.response.start"
            return send(message)

        self._running.add(task)
        try:
            await self._app(scope, receive, watched)
        except asyncio.CancelledError:
            if task not in self._ended:
                raise
            task.uncancel()  # ended by the gate, not by the server: answer if still possible
            if not started:
                ended = ShuttingDown("The proxy shut down.")
                self.metrics.refused("error", ended)
                await self._answer(scope, receive, send, ended)
        finally:
            self._running.discard(task)
            self._ended.discard(task)
            then = self._then.pop(task, None)
            if then is not None:
                then()

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send, error: APIError, retry_after: int = 0
    ) -> None:
        response = self.render(scope, error)
        if retry_after:
            response.headers["Retry-After"] = str(retry_after)
        await response(scope, receive, send)
