"""A client that goes away: the handler waiting for the upstream cancelled, and the answer
nobody reads counted (as nginx does, 499)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.observability.metrics import Metrics
from proxy.server.incoming import IncomingRequest
from proxy.server.relay import Relay, Watch

# A handler of the proxy's: a request in, any ASGI app (a Response or a Relay) out.
Endpoint = Callable[[Request], Awaitable[ASGIApp]]


def client_gone(metrics: Metrics) -> Response:
    """The answer to a client that went away: nobody reads it, the metrics count it."""
    metrics.answered("error", 499)
    return Response(status_code=499)


class WatchedEndpoint:
    """Adapts a handler to a route, and watches the client's connection while it runs.

    Once the request body is in, a client that goes away cancels the handler, and with it the
    upstream request it waits on: an upstream that hangs before its first byte is not left
    holding a connection until the first-byte timeout.
    """

    def __init__(self, handler: Endpoint, metrics: Metrics) -> None:
        self.handler = handler
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body_read = asyncio.Event()

        async def receive_body() -> Message:
            message = await receive()
            if not message.get("more_body", False):
                body_read.set()
            return message

        # The handler runs in this task; a watch of the connection cancels it when the client
        # goes away, and goes on watching while a stream is relayed.
        watch = Watch(receive, body_read)
        try:
            app = await self.handler(IncomingRequest(scope, receive_body, send))
        except asyncio.CancelledError:
            if not watch.gone:
                watch.stop()
                raise  # the shutdown ended it
            watch.task.uncancel()
            app = client_gone(self.metrics)
        except BaseException:
            watch.stop()
            raise
        if isinstance(app, Relay) and body_read.is_set():
            await app.relay(send, watch)
            return
        watch.stop()
        await app(scope, receive, send)
