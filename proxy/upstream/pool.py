"""The HTTP/1.1 client towards the upstreams: a bounded pool of keep-alive connections per
upstream (each a proxy.upstream.http1 connection), lent one request at a time.

Our own rather than aiohttp's because of what a request costs: a bare relay of a small request
takes 0.74 M instructions with aiohttp's client and 0.40 M with one like this, and the proxy
went from 1.24 to 0.95 M (bench/README.md). It does only what relaying to a configured
upstream needs: one request at a time per connection, bodies as bytes (never decompressed,
never redirected), TLS by asyncio, egress proxies as curl reads them, no cookies.

How connections are made, and their errors, is proxy.upstream.connect's; what can fail once
one is made, proxy.upstream.http1's.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import re
import ssl
from urllib.parse import urlsplit

from proxy.config.egress import egress_proxy
from proxy.upstream.connect import EgressRefused, Route, connect
from proxy.upstream.http1 import Connection, Response

# An idle connection is not used after this long (aiohttp's default): a load balancer or NAT
# may have forgotten it without a word, and a request sent on it would wait for nothing.
IDLE_SECONDS = 15.0
# RFC 9110 section 7.6.1, plus the legacy Proxy-Connection: they speak for one connection.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Set by whoever sends the body next (for a request: the pool); and Expect, since the pool
# sends a request's body with its head, without waiting for a 100 Continue.
FRAMING = frozenset({"content-length", "host", "expect"})
_NOT_SENT = HOP_BY_HOP | FRAMING  # of a caller's headers: the pool frames each request itself
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110 section 5.1)


@dataclasses.dataclass
class Progress:
    """How far one attempt got: the phase a timeout is named after, and whether the
    connection came from the pool (a stale one is safe to retry)."""

    phase: str = "connect"  # "pool" while every connection is busy, "first_byte" once connected
    reused: bool = False


class Pool:
    """At most `max_connections` connections to the upstream at `base_url` (http or https),
    idle ones kept for the next request, the most recently used first; through the egress
    proxy `proxy` says (proxy.config.egress: a URL, `none`, None for the environment's)."""

    def __init__(
        self,
        base_url: str,
        max_connections: int,
        connect_timeout: float | None = None,
        idle_seconds: float = IDLE_SECONDS,
        proxy: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        via = egress_proxy(parts, proxy)
        via_tls = ssl.create_default_context() if via and via.tls else None
        self._route = Route(host, port, tls, via, via_tls)
        shown = f"[{host}]" if ":" in host else host
        default = 443 if tls else 80
        self._host_header = (shown if port == default else f"{shown}:{port}").encode()
        # A plain-HTTP request through a proxy names its upstream (absolute form), and
        # carries the proxy's credentials; an https one goes in a tunnel, as if straight.
        self._origin = ""
        self._proxy_authorization = b""
        if via is not None and tls is None:
            self._origin = f"http://{self._host_header.decode()}"
            if via.authorization:
                self._proxy_authorization = f"Proxy-Authorization: {via.authorization}\r\n".encode()
        self._idle: list[Connection] = []
        self._open = 0  # connections made or being made, idle ones included
        # Those waiting, in the order they came; each is handed a connection, or None: a place.
        self._waiting: collections.deque[asyncio.Future[Connection | None]] = collections.deque()
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
        answer's head. `headers` are sent but for those that frame the request or speak for
        the connection (Host, Content-Length, Transfer-Encoding, Connection, Upgrade...): the
        pool sets those itself. ValueError for a header name that is not a token."""
        if not target.startswith("/"):
            target = "/" + target  # a request's target is a path, whatever the client sent
        head = [f"{method} {self._origin}{self.prefix}{target} HTTP/1.1\r\n".encode("latin-1")]
        head.append(b"Host: " + self._host_header + b"\r\n")
        if self._proxy_authorization:
            head.append(self._proxy_authorization)
        for name, value in headers:
            if _TOKEN.fullmatch(name) is None:
                raise ValueError("a header name that is not a token")
            if name.lower() not in _NOT_SENT:
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
            response = await connection.send(data, body, head_only=method == "HEAD")
        except BaseException:
            connection.drop()
            raise
        if self._origin and response.status == 407:  # the proxy's own: the request never left
            response.close()
            raise EgressRefused(407)
        return response

    def close(self) -> None:
        """Close every idle connection; busy ones close when their answers are done."""
        self._closed = True
        for connection in list(self._idle):
            connection.drop()

    async def _acquire(self, progress: Progress) -> Connection:
        again = False
        while True:
            handed = await self._turn(progress, again)
            if handed is None:
                break
            if handed.usable():
                progress.reused = True
                return handed
            handed.drop()  # it closed as it was handed over (its place went on)
            again = True
        progress.phase = "connect"
        made: list[Connection] = []  # the place is the connection's once it is made
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

    async def _turn(self, progress: Progress, again: bool) -> Connection | None:
        """An idle connection, or None: a place to make one in (counted). Those waiting are
        served in the order they came, each handed what is freed: a newcomer never takes it
        from them (under saturation they would time out). `again`: first in line, its turn
        came and went with a connection that closed."""
        loop = asyncio.get_running_loop()
        if not self._in_line():
            now = loop.time()
            while self._idle:
                connection = self._idle.pop()
                if connection.usable() and now - connection.idle_since < self.idle_seconds:
                    return connection
                connection.drop()
            if self._open < self.max_connections:
                self._open += 1
                return None
        progress.phase = "pool"
        waiter: asyncio.Future[Connection | None] = loop.create_future()
        if again:
            self._waiting.appendleft(waiter)
        else:
            self._waiting.append(waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._pass_on(waiter.result())  # what it was handed goes to the next one
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
            raise

    async def _connect(self, made: list[Connection]) -> Connection:
        def connection() -> Connection:
            made.append(Connection(self))
            return made[0]

        return await connect(connection, self._route, self.connect_timeout)

    def put_back(self, connection: Connection) -> None:
        if self._closed:
            connection.drop()
        elif self._in_line():
            self._waiting.popleft().set_result(connection)
        else:
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.append(connection)

    def forget(self, connection: Connection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)
        self._freed()

    def _freed(self) -> None:
        """A place is free: the first one waiting makes a connection in it."""
        if self._in_line():
            self._waiting.popleft().set_result(None)
        else:
            self._open -= 1

    def _in_line(self) -> bool:
        """Whether one is waiting; the first is still waiting (one cancelled leaves the line
        when its task next runs: until then it is passed over)."""
        while self._waiting and self._waiting[0].done():
            self._waiting.popleft()
        return bool(self._waiting)

    def _pass_on(self, handed: Connection | None) -> None:
        if handed is None:
            self._freed()
        elif handed.usable():
            self.put_back(handed)
        else:
            handed.drop()
