"""The server's HTTP/1.1: uvicorn's httptools protocol, with two things it lacks.

A request's head is bounded (`listen.max_head_bytes`, `listen.max_header_fields`). httptools
holds a header field whole before it hands it on, and uvicorn keeps every field: one request
with a 64 MiB header took 300 MiB before any check of the proxy's ran, and was forwarded
whole. Here a head is fed to the parser no more than the bound at a time, and one that has not
ended within the bound, or has too many fields, gets a 431 in the error shape of its API
(`error_shapes`, by the fields read so far), before authentication and before it is
forwarded anywhere.

A body is read as it comes, up to its bound (`listen.max_body_bytes`): uvicorn stops reading
at 64 KiB until the app has taken what came, and the proxy reads every body whole, so each stop
only cost a turn of the event loop and a copy of the body so far (0.2 ms of a 400 KB history).

An HTTP/1.0 client knows no chunked encoding: an answer of unknown length (a stream) goes to
it delimited by the end of the connection, where uvicorn would chunk it.

An answer's head goes out with the first part of its body, in one write, when that part is
sent in the same step of the event loop (a whole answer, or a stream whose first chunk came
with the upstream's head): uvicorn writes each alone, and the client then reads the head and
its first bytes in two packets, waking twice. A head whose body is not there yet goes out
alone at the loop's next step (`HeldHead`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, ClassVar

from uvicorn.config import Config as UvicornConfig
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from proxy.config import Listen
from proxy.errors import HeadTooLarge
from proxy.server.error_shapes import error_shape

log = logging.getLogger("compaction_proxy")

# After a refusal the client may still be sending its head: what comes is read and dropped for
# this long, so that the 431 is not lost to a reset (closing with unread data sends one).
LINGER_SECONDS = 2.0
# A body part shorter than this goes out in one write with its answer's head.
JOINED = 64 * 1024


def protocol_for(listen: Listen) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's `http` setting, with `listen`'s bounds."""
    bounds = {
        "max_head_bytes": listen.max_head_bytes,
        "max_fields": listen.max_header_fields,
        "max_body_bytes": listen.max_body_bytes,
    }
    return type("ClientProtocol", (ClientProtocol,), bounds)


class ClientProtocol(HttpToolsProtocol):
    """One client connection (`protocol_for` sets the bounds)."""

    max_head_bytes: ClassVar[int] = Listen.max_head_bytes
    max_fields: ClassVar[int] = Listen.max_header_fields
    max_body_bytes: ClassVar[int] = Listen.max_body_bytes

    def __init__(
        self,
        config: UvicornConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.url = b""  # uvicorn's, set as a request begins: read when a refusal comes first
        self._in_head = True  # a head is awaited or under way (rather than a body)
        self._heads = 0  # requests ended: which head is under way
        self._head_bytes = 0  # of the head under way, fed so far
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped until the connection closes
        rest = memoryview(data)
        while rest and self._in_head and self._feeding():
            # Never more than the bound of a head at once: the parser holds what it is given.
            room = self.max_head_bytes - self._head_bytes
            piece, rest = rest[:room], rest[room:]
            head = self._heads
            super().data_received(piece)  # type: ignore[arg-type]  # httptools takes a view
            if self._in_head and self._heads == head and not self._refused:
                self._head_bytes += len(piece)
                if self._head_bytes >= self.max_head_bytes:  # and the head goes on
                    self._refuse(f"a head larger than {self.max_head_bytes} bytes")
            # A head that began behind a body in the same piece is counted from the next one;
            # its fields are counted whole when it ends (`on_headers_complete`).
        if rest and self._feeding():
            super().data_received(rest)  # type: ignore[arg-type]

    def _feeding(self) -> bool:
        """Whether the parser is still to be fed: not after a refusal, an error (uvicorn's
        400 closes the connection) or an upgrade (the connection has another protocol)."""
        transport = self.transport
        return not (self._refused or transport.is_closing() or transport.get_protocol() is not self)

    def on_headers_complete(self) -> None:
        fields = self.headers
        # As on the wire, but for the request line's method and version.
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in fields)
        if len(fields) > self.max_fields:
            raise self._refuse(f"more than {self.max_fields} header fields")  # stops the parser
        if size > self.max_head_bytes:
            raise self._refuse(f"a head larger than {self.max_head_bytes} bytes")
        self._in_head = False
        self._head_bytes = 0
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            # uvicorn makes its cycle by name: this one, as 1.0's when it is
            one_oh = self.scope["http_version"] == "1.0"
            cycle.__class__ = CloseDelimited if one_oh else Cycle
            cycle.transport = HeldHead(cycle.transport, self.loop)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self.flow.read_paused and len(self.cycle.body) <= self.max_body_bytes:
            self.flow.resume_reading()  # uvicorn's stop at 64 KiB: read on, up to the bound

    def on_message_complete(self) -> None:
        self._in_head = True
        self._heads += 1
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # else the parser stopped at a refusal, answered already
            super().send_400_response(msg)

    def _refuse(self, reason: str) -> HeadTooLarge:
        """A 431 in its path's API's error shape, and the connection closed once it is read;
        just closed while an answer is under way on it (the 431 would be read as part of it)."""
        self._refused = True
        error = HeadTooLarge(f"The request's head is too large: {reason}.")
        facts = {"status": error.status_code, "code": error.code, "reason": reason}
        log.info("request refused", extra=facts)
        transport = self.transport
        if self.cycle is not None and not self.cycle.response_complete:
            transport.close()
            return error
        path = self.url.decode("latin-1").partition("?")[0]
        body = error_shape(path, self.headers).error_body(error)
        head = (
            b"content-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        transport.write(STATUS_LINE[error.status_code] + head + body)
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, transport.close)
        return error


class HeldHead(asyncio.Transport):
    """A cycle's transport: a write made while `holding` (the answer's head) is held until the
    next write, and goes out with it in one; else alone at the loop's next step."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.transport = transport
        self.loop = loop
        self.holding = False
        self._held: bytes | bytearray | memoryview = b""
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.holding:
            self._held = data
            self._flush = self.loop.call_soon(self.flush)
        elif self._held:
            held, self._held = self._held, b""
            self._flush.cancel()  # type: ignore[union-attr]
            if len(data) < JOINED:  # one write, one packet
                self.transport.write(b"".join((held, data)))
            else:  # a large body is not copied for it: its head goes just before it
                self.transport.write(held)
                self.transport.write(data)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, b""
        if held and not self.transport.is_closing():
            self.transport.write(held)

    def close(self) -> None:
        if self._held:
            self._flush.cancel()  # type: ignore[union-attr]
            self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class Cycle(RequestResponseCycle):
    """One request and its answer, the answer's head held for its body's first part."""

    transport: HeldHead

    def send(self, message: Any) -> Coroutine[Any, Any, None]:
        # No coroutine of its own but for the head: uvicorn's send is awaited as it is.
        if message["type"] == "http.response.start":
            return self._send_head(message)
        return super().send(message)

    async def _send_head(self, message: Any) -> None:
        self.transport.holding = True
        try:
            await super().send(message)
        finally:
            self.transport.holding = False


class CloseDelimited(Cycle):
    """A request/answer cycle of an HTTP/1.0 client (whose connection ends with the answer):
    a body of unknown length is written as it comes, and the connection's end ends it."""

    _by_close = False

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            names = {name.lower() for name, _ in message.get("headers", ())}
            if b"content-length" not in names:
                self._by_close = True
                self.chunked_encoding = False  # uvicorn's framing, decided: no chunks
        elif message["type"] == "http.response.body" and self._by_close:
            # uvicorn checks each part against a length: each part is its own.
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)
