"""The HTTP/1.1 client towards the upstreams: a bounded pool of keep-alive connections per
upstream, each an asyncio protocol that feeds the answer to httptools' parser (the one the
proxy's server side uses).

Our own rather than aiohttp's because of what a request costs: a bare relay of a small request
takes 0.74 M instructions with aiohttp's client and 0.40 M with one like this, and the proxy
went from 1.24 to 0.95 M (bench/README.md). It does only what relaying to a configured
upstream needs: one request at a time per connection, bodies as bytes (never decompressed,
never redirected), TLS by asyncio, no proxies, no cookies.

Where a failure leaves the request says the error's class: the connection was never made
(`ConnectFailed`, `ConnectTimeout`: safe to try again), or it broke before the answer's head
(`Disconnected`: safe only on a pooled connection the upstream had closed meanwhile), or the
answer was not HTTP (`BadAnswer`). A body that breaks off or stalls raises the proxy's
`StreamBroken`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from proxy.errors import StreamBroken

# A body read faster than the client takes it is held up to this much, then the upstream's
# socket is no longer read until the client has taken half of it.
_HIGH_WATER = 1 << 20
_LOW_WATER = _HIGH_WATER // 2
# An answer's status line and headers larger than this are refused (aiohttp's limit was 8 KiB
# a line): a bigger head is an upstream gone wrong, and parsing it costs more as it grows.
MAX_HEAD = 64 * 1024
# An idle connection is not used after this long (aiohttp's default): a load balancer or NAT
# may have forgotten it without a word, and a request sent on it would wait for nothing.
IDLE_SECONDS = 15.0


class HTTPError(Exception):
    """A request to an upstream failed."""


class ConnectFailed(HTTPError):
    """No connection could be made (refused, unresolvable, TLS refused): nothing was sent."""


class ConnectTimeout(HTTPError):
    """No connection within the connect timeout: nothing was sent."""


class Disconnected(HTTPError):
    """The connection broke or closed before the answer's head had come; `answer_begun`: some
    of the answer had (the upstream had taken the request: never to be sent again)."""

    def __init__(self, message: str, *, answer_begun: bool) -> None:
        super().__init__(message)
        self.answer_begun = answer_begun


class BadAnswer(HTTPError):
    """What came back is not an HTTP/1.1 answer."""


@dataclasses.dataclass
class Progress:
    """How far one attempt got: the phase a timeout is named after, and whether the
    connection came from the pool (a stale one is safe to retry)."""

    phase: str = "connect"  # "pool" while every connection is busy, "first_byte" once connected
    reused: bool = False


class Pool:
    """At most `max_connections` connections to the upstream at `base_url` (http or https),
    idle ones kept for the next request, the most recently used first."""

    def __init__(
        self,
        base_url: str,
        max_connections: int,
        connect_timeout: float | None = None,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        default = 443 if self._tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = (host if self.port == default else f"{host}:{self.port}").encode()
        self._idle: list[_Connection] = []
        self._open = 0  # connections made or being made, idle ones included
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    async def request(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        progress: Progress,
    ) -> Response:
        """Send `method target` (the path below the base URL, with its query) and wait for the
        answer's head."""
        if not target.startswith("/"):
            target = "/" + target  # a request's target is a path, whatever the client sent
        head = [f"{method} {self.prefix}{target} HTTP/1.1\r\n".encode("latin-1")]
        head.append(b"Host: " + self._host_header + b"\r\n")
        for name, value in headers:
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(b"Content-Length: %d\r\n" % len(body or b""))
        head.append(b"\r\n")
        data = b"".join(head)
        # A CR or LF inside a name, a value or the target would start a line of its own.
        if data.count(b"\n") != len(head) or data.count(b"\r") != len(head):
            raise ValueError("a line break inside the request's target or headers")
        connection = await self._acquire(progress)
        progress.phase = "first_byte"
        try:
            return await connection.send(data, body, head_only=method == "HEAD")
        except BaseException:
            connection.drop()
            raise

    def close(self) -> None:
        """Close every idle connection; busy ones close when their answers are done."""
        self._closed = True
        for connection in list(self._idle):
            connection.drop()

    async def _acquire(self, progress: Progress) -> _Connection:
        while True:
            now = asyncio.get_running_loop().time()
            while self._idle:
                connection = self._idle.pop()
                if connection.usable() and now - connection.idle_since < self.idle_seconds:
                    progress.reused = True
                    return connection
                connection.drop()
            if self._open < self.max_connections:
                break
            progress.phase = "pool"
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # the turn it was given goes to the next one waiting
                raise
        self._open += 1
        progress.phase = "connect"
        made: list[_Connection] = []  # the place is the connection's once it is made
        try:
            return await self._connect(made)
        except BaseException:
            # Cancelled as the connection was made, asyncio closes it: it frees the place
            # itself, once (`drop`).
            if made:
                made[0].drop()
            else:
                self._freed()
            raise

    async def _connect(self, made: list[_Connection]) -> _Connection:
        loop = asyncio.get_running_loop()

        def connection() -> _Connection:
            made.append(_Connection(self))
            return made[0]

        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connected = await loop.create_connection(
                    connection,
                    self.host,
                    self.port,
                    ssl=self._tls,
                    server_hostname=self.host if self._tls else None,
                )
        except TimeoutError:
            raise ConnectTimeout(f"no connection within {self.connect_timeout:g} s") from None
        except OSError as exc:  # refused, unresolvable, TLS (ssl.SSLError is an OSError)
            raise ConnectFailed(type(exc).__name__) from exc
        return connected

    def _put_back(self, connection: _Connection) -> None:
        if self._closed:
            connection.drop()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        self._idle.append(connection)
        self._wake()

    def _forget(self, connection: _Connection) -> None:
        """A connection closed: its place is free."""
        if connection in self._idle:
            self._idle.remove(connection)
        self._freed()

    def _freed(self) -> None:
        self._open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class _Connection(asyncio.Protocol):
    """One connection, one answer at a time; its parser reads one answer after another and
    gives each to the request waiting for it."""

    def __init__(self, pool: Pool) -> None:
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
        self.pool._forget(self)

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
        except httptools.HttpParserError as exc:
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
            self.pool._forget(self)

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

    def __init__(self, connection: _Connection, head_only: bool) -> None:
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
        if 100 <= status < 200 and status != 101:
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

    async def read(self, idle_timeout: float) -> bytes:
        """The whole body; the connection is closed when it breaks off."""
        if self.complete and self._error is None:  # it all came with the head
            body = b"".join(self._chunks)
            self._chunks.clear()
            return body
        try:
            return b"".join([chunk async for chunk in self.chunks(idle_timeout)])
        except BaseException:
            self.close()
            raise

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
            connection.pool._put_back(connection)
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
