"""One keep-alive connection to an upstream, an asyncio protocol that feeds each answer to
httptools' parser (the one the proxy's server side uses), and the answer it feeds: status and
headers first, then the body as it comes, read no faster than it is taken.

Where a failure leaves the request says the error's class: the connection broke before the
answer's head (`Disconnected`: safe only on a pooled connection the upstream had closed
meanwhile), or the answer was not HTTP (`BadAnswer`). A body that breaks off or stalls raises
the proxy's `StreamBroken`. The pool that makes the connections and lends them out is
proxy.upstream.pool.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Protocol

import httptools

from proxy.errors import StreamBroken

# A body read faster than the client takes it is held up to this much, then the upstream's
# socket is no longer read until the client has taken half of it.
_HIGH_WATER = 1 << 20
_LOW_WATER = _HIGH_WATER // 2
# An answer's status line and headers larger than this are refused (aiohttp's limit was 8 KiB
# a line): a bigger head is an upstream gone wrong, and parsing it costs more as it grows.
MAX_HEAD = 64 * 1024


class HTTPError(Exception):
    """A request to an upstream failed."""


class Disconnected(HTTPError):
    """The connection broke or closed before the answer's head had come; `answer_begun`: some
    of the answer had (the upstream had taken the request: never to be sent again)."""

    def __init__(self, message: str, *, answer_begun: bool) -> None:
        super().__init__(message)
        self.answer_begun = answer_begun


class BadAnswer(HTTPError):
    """What came back is not an HTTP/1.1 answer."""


class Owner(Protocol):
    """What a connection tells the pool it belongs to."""

    def put_back(self, connection: Connection) -> None:
        """The connection is free for the next request."""

    def forget(self, connection: Connection) -> None:
        """The connection closed: its place is free."""


class Connection(asyncio.Protocol):
    """One connection, one answer at a time; its parser reads one answer after another and
    gives each to the request waiting for it."""

    def __init__(self, pool: Owner) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.dropped = False
        self.idle_since = 0.0
        self._answer: Response | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._stray = False  # bytes came after the answer: never to be used again

    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    async def send(self, data: bytes, body: bytes | None, *, head_only: bool) -> Response:
        assert self.transport is not None
        answer = self._answer = Response(self, head_only)
        if body and len(body) < 65536:
            self.transport.write(data + body)  # one write: one packet for a short request
        else:
            self.transport.write(data)
            if body:
                self.transport.write(body)  # not copied into one buffer with the head
        await answer.head
        return answer

    def drop(self) -> None:
        """Close the connection and free its place (once)."""
        if self.dropped:
            return
        self.dropped = True
        if self.transport is not None:
            self.transport.close()
        self.pool.forget(self)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.complete:
            self.drop()  # bytes nobody asked for: the connection can't be trusted again
            return
        answer.begun = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # (An upgrade is no parser error to httptools: the bytes after the head are the
            # new protocol's. None is ever asked for: head_done refuses a 101.)
            if not answer.complete:
                answer.fail(BadAnswer(f"not an HTTP answer: {exc}"))
            self.drop()  # an answer complete before the error keeps what it had
            return
        if answer.status == 0 and not answer.complete:  # its head is still to come
            answer.head_bytes += len(data)
            if answer.head_bytes > MAX_HEAD:
                answer.fail(BadAnswer(f"an answer's head larger than {MAX_HEAD} bytes"))
        if self._stray or (answer.complete and answer.status == 0):  # its head refused
            self.drop()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        answer, self._answer = self._answer, None
        if answer is not None and not answer.complete:
            answer.lost()
        if not self.dropped:
            self.dropped = True
            self.pool.forget(self)

    # httptools' callbacks, for the answer under way (after it: bytes nobody asked for, and
    # the connection is dropped)

    def on_message_begin(self) -> None:
        if self._answer is None or self._answer.complete:
            self._stray = True

    def on_header(self, name: bytes, value: bytes) -> None:
        # Not after the head: a chunked body's trailer fields are no headers to relay.
        if self._answer is not None and self._answer.status == 0:
            self._answer.header(name, value)

    def on_headers_complete(self) -> None:
        if self._answer is not None and not self._answer.complete:
            self._answer.head_done(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self._answer is not None and not self._answer.complete:
            self._answer.body_part(body)

    def on_message_complete(self) -> None:
        if self._answer is not None and not self._answer.complete:
            self._answer.message_done(self._parser.should_keep_alive())


class Response:
    """An answer: its status and headers, and its body as it comes."""

    def __init__(self, connection: Connection, head_only: bool) -> None:
        self.connection = connection
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.complete = False
        self.begun = False  # a byte of it came
        self.head_bytes = 0  # read before the head was whole (a head may never end)
        self._head_only = head_only
        self._fields = 0  # the bytes of its header fields (a head may end in the read it began)
        self._framed = False  # a length or chunks say where the body ends (else: at EOF)
        self._keep_alive = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._paused = False
        self._error: HTTPError | StreamBroken | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._released = False

    # the connection's

    def header(self, name: bytes, value: bytes) -> None:
        self._fields += len(name) + len(value)
        lowered = name.lower()
        if lowered == b"content-length" or lowered == b"transfer-encoding":
            self._framed = True
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def head_done(self, status: int) -> None:
        if self._fields > MAX_HEAD:
            self.fail(BadAnswer(f"an answer's head larger than {MAX_HEAD} bytes"))
            return
        if status == 101:  # its body would be another protocol, for a client that never asked
            self.fail(BadAnswer("101 Switching Protocols, though no upgrade was asked for"))
            return
        if 100 <= status < 200:
            self.headers = []  # informational (100 Continue, 103 Early Hints): the answer follows
            self._framed = False
            return
        self.status = status
        if not self.head.done():
            self.head.set_result(None)
        if self._head_only:  # no body follows; the parser would wait for one
            self._end(keep_alive=False)

    def body_part(self, body: bytes) -> None:
        self._chunks.append(body)
        self._held += len(body)
        if self._held > _HIGH_WATER and not self._paused and self.connection.transport:
            self._paused = True
            self.connection.transport.pause_reading()
        self._wake()

    def message_done(self, keep_alive: bool) -> None:
        if self.status != 0:  # else the end of an informational answer: the parser reads on
            self._end(keep_alive=keep_alive)

    def fail(self, error: HTTPError | StreamBroken) -> None:
        self._error = error
        self.complete = True
        if not self.head.done():
            self.head.set_exception(error)
        self._wake()

    def lost(self) -> None:
        """The connection closed before the answer's end."""
        if not self.head.done():
            message = "the connection closed before the answer's head"
            self.fail(Disconnected(message, answer_begun=self.begun))
        elif not self._framed:
            self._end(keep_alive=False)  # its body ran to the connection's end
        else:
            self.fail(StreamBroken("the connection closed before the answer's end"))

    def _end(self, *, keep_alive: bool) -> None:
        self.complete = True
        self._keep_alive = keep_alive
        self._wake()

    def _wake(self) -> None:
        waiter = self._wakeup
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # the reader's

    async def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        """The body as it comes; StreamBroken when it breaks off or nothing comes for
        `idle_timeout` seconds."""
        while True:
            while self._chunks:
                yield self._take()
            if self._error is not None:
                raise StreamBroken(str(self._error))
            if self.complete:
                return
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(idle_timeout):
                    await self._wakeup
            except TimeoutError:
                raise StreamBroken(f"no data for {idle_timeout:g} s") from None

    def release(self) -> None:
        """Done with a body read to its end: the connection serves the next request."""
        if self._released:
            return
        self._released = True
        connection = self.connection
        if self.complete and self._keep_alive and self._error is None and connection.usable():
            connection._answer = None
            if self._paused:  # read whole while held back: the next answer must be read
                self._paused = False
                connection.transport.resume_reading()  # type: ignore[union-attr]
            connection.pool.put_back(connection)
        else:
            connection.drop()

    def close(self) -> None:
        """Done early: the connection is closed."""
        self._released = True
        self.connection.drop()

    def _take(self) -> bytes:
        chunk = self._chunks.popleft()
        self._held -= len(chunk)
        if self._paused and self._held <= _LOW_WATER and self.connection.transport:
            self._paused = False
            self.connection.transport.resume_reading()
        return chunk
