"""The Responses API over a WebSocket (`GET /v1/responses`, upgraded), as Codex CLI's
built-in provider speaks it (`dialects.openai.responses_socket`).

Each `response.create` frame becomes a `POST /v1/responses` of the whole history, which the
app itself answers, through its gate: the same authentication and tenancy (from the
upgrade's headers), sessions, compaction, limits (`listen.max_body_bytes` for the rebuilt
body, the concurrency cap for each request), metrics and logs as over HTTP, and the same
upstream request, over HTTP with SSE. Its answer goes back as frames: each event of the
stream, or an `error` event with the answer's status.

A connection is refused at the upgrade as a request would be (401 without a valid proxy key
where `auth.keys` names callers). Its frames are answered one at a time: one that comes while
an answer is under way waits for it. A warm-up (`generate: false`: Codex's first request,
with an empty input) is answered here, without the upstream: the HTTP API has no such
request (a strict upstream refuses the field, a lenient one would answer, and bill, a whole
response), and what it warms, the connection and the history it keeps, is the proxy's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from proxy.dialects import Dialect
from proxy.dialects.openai import responses_socket as wire
from proxy.dialects.sse import EventStream
from proxy.errors import APIError, InvalidRequest, ShuttingDown, UpstreamUnreachable
from proxy.observability.metrics import Metrics
from proxy.server.gate import Gate
from proxy.server.guard import refused
from proxy.server.incoming import RequestHeaders
from proxy.server.tenants import Tenants

log = logging.getLogger("compaction_proxy")

# The upgrade's own headers, which no POST carries; the body's are the rebuilt body's.
_OF_THE_UPGRADE = frozenset(
    {b"connection", b"upgrade", b"content-type", b"content-length", b"accept", b"openai-beta"}
)
_BETA = "responses_websockets="  # OpenAI-Beta's token that asks for this protocol
_FRAME_HEADERS = frozenset({"content-length", "content-type"})
Frames = asyncio.Queue[Message | None]  # the client's, then None once it has gone
# An answer that ended before its last event, or that was no stream of events.
_BROKEN = UpstreamUnreachable("The upstream broke off its answer.")


class ResponsesSocket:
    """The ASGI app of the Responses API's WebSocket path."""

    def __init__(
        self,
        dialect: Dialect,
        tenants: Tenants,
        gate: Gate,
        metrics: Metrics,
        history_bytes: int,
    ) -> None:
        self.dialect = dialect
        self.tenants = tenants
        self.gate = gate
        self.metrics = metrics
        self.history_bytes = history_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # websocket.connect
        try:
            self.tenants.tenant(RequestHeaders(scope["headers"]))
        except APIError as exc:
            refused(self.metrics, self.dialect, exc)
            await self.dialect.error_response(exc)(scope, receive, send)
            return
        await send({"type": "websocket.accept"})
        self.metrics.websockets.inc()
        log.info("websocket opened", extra={"path": scope["path"]})
        frames: Frames = asyncio.Queue(maxsize=1)
        gone = asyncio.Event()
        reader = asyncio.ensure_future(_read(receive, frames, gone))
        connection = _Connection(self, scope, send, gone)
        try:
            while (frame := await frames.get()) is not None and not gone.is_set():
                await connection.answer(frame)
        except OSError:
            pass  # the client went away while it was answered
        finally:
            reader.cancel()
            self.metrics.websockets.dec()
            log.info("websocket closed", extra={"path": scope["path"], "frames": connection.frames})


class _Connection:
    """One connection: its history (`wire.Chain`), and each of its frames answered."""

    def __init__(self, socket: ResponsesSocket, scope: Scope, send: Send, gone: asyncio.Event):
        self.socket = socket
        self.scope = scope
        self.send = send
        self.gone = gone
        self.chain = wire.Chain(socket.history_bytes)
        self.headers = _post_headers(scope["headers"])
        self.frames = 0  # taken so far

    async def answer(self, frame: Message) -> None:
        self.frames += 1
        socket = self.socket
        try:
            text = frame.get("text")
            if text is None:
                raise InvalidRequest("Send each event as a text frame of JSON.")
            create = wire.read_create(text)
            given = self.chain.input(create)
        except APIError as exc:
            refused(socket.metrics, socket.dialect, exc)
            await self._send(wire.error_event(exc.status_code, socket.dialect.error_body(exc)))
            return
        answer = wire.Answer()
        relayed = _Relayed(self.send, answer)
        if create.generate:
            body = wire.request_body(create, given)
            app: Any = self.scope["app"]  # the whole app: its gate, middleware and routes
            await app(self._post(len(body)), _receive(body, self.gone), relayed)
        else:
            socket.metrics.answered("websocket_warmup", 200)
            warmed = Response(wire.warm_up(create), media_type="text/event-stream")
            await warmed(self._post(0), _receive(b"", self.gone), relayed)
        if answer.ended is None and not relayed.refused:
            draining = socket.gate.draining
            ended = ShuttingDown("The proxy shut down.") if draining else _BROKEN
            await self._send(wire.error_event(ended.status_code, socket.dialect.error_body(ended)))
        elif not self.chain.keep(given, answer):
            socket.metrics.websocket_histories_dropped.inc()

    def _post(self, length: int) -> Scope:
        """The scope of a `POST` of `length` bytes to the same path, as the upgrade's."""
        scope = self.scope
        return {
            "type": "http",
            "asgi": scope["asgi"],
            "http_version": "1.1",
            "method": "POST",
            "scheme": "https" if scope["scheme"] == "wss" else "http",
            "path": scope["path"],
            "root_path": scope.get("root_path", ""),
            "query_string": scope.get("query_string", b""),
            "headers": [*self.headers, (b"content-length", str(length).encode())],
            "client": scope.get("client"),
            "server": scope.get("server"),
            "state": dict(scope.get("state", {})),
        }

    async def _send(self, text: str) -> None:
        await self.send({"type": "websocket.send", "text": text})


class _Relayed:
    """The ASGI `send` of an HTTP answer that sends it on as frames: each event of a stream,
    else one `error` event with the answer's status, its error and its headers."""

    def __init__(self, send: Send, answer: wire.Answer) -> None:
        self.send = send
        self.answer = answer
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.events: EventStream | None = None
        self.body = b""
        self.refused = False  # an error event was sent

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = [
                (name.decode("latin-1").lower(), value.decode("latin-1"))
                for name, value in message.get("headers", [])
            ]
            media = dict(self.headers).get("content-type", "")
            if self.status == 200 and media.startswith("text/event-stream"):
                self.events = EventStream()
            return
        body: bytes = message.get("body", b"")
        if self.events is not None:
            for event in self.events.feed(body):
                self.answer.saw(event)
                await self.send({"type": "websocket.send", "text": event.decode()})
            return
        self.body += body
        if not message.get("more_body", False):
            self.refused = True
            headers = [(n, v) for n, v in self.headers if n not in _FRAME_HEADERS]
            status = self.status if self.status >= 400 else _BROKEN.status_code
            text = wire.error_event(status, self.body, headers)
            await self.send({"type": "websocket.send", "text": text})


def _post_headers(upgrade: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers of each request of a connection: the upgrade's (its credentials, its
    session's names), less those of the upgrade itself."""
    headers = [
        (name, value)
        for name, value in upgrade
        if name.lower() not in _OF_THE_UPGRADE and not name.lower().startswith(b"sec-websocket-")
    ]
    for name, value in upgrade:
        if name.lower() == b"openai-beta":
            tokens = [t.strip() for t in value.decode("latin-1").split(",")]
            kept = ", ".join(t for t in tokens if t and not t.startswith(_BETA))
            if kept:
                headers.append((name, kept.encode("latin-1")))
    headers += [(b"content-type", b"application/json"), (b"accept", b"text/event-stream")]
    return headers


def _receive(body: bytes, gone: asyncio.Event) -> Receive:
    """The ASGI `receive` of a POST of `body` whose client goes when the connection does."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive


async def _read(receive: Receive, frames: Frames, gone: asyncio.Event) -> None:
    """Read the client's frames into `frames` as they are taken, until it goes away."""
    while (message := await receive())["type"] == "websocket.receive":
        await frames.put(message)
    gone.set()
    await frames.put(None)
