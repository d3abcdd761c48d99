"""How a connection to an upstream is made: the host's addresses raced (happy eyeballs, RFC
8305), through an egress proxy when there is one (proxy.config.egress), and TLS verified
against the system's certificates (SSL_CERT_FILE, where a TLS-intercepting egress proxy's CA
goes). Through a proxy, an https upstream is reached in a CONNECT tunnel with TLS to the
upstream inside it; a plain-HTTP one gets its requests in absolute form (the pool's part).

A connection that was never made raises `ConnectFailed` or `ConnectTimeout`: nothing was sent,
so it is safe to try again, unless `ConnectFailed.lasting` says it would fail the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import ipaddress
import itertools
import socket
import ssl
from asyncio import staggered
from collections.abc import Callable
from http import HTTPStatus
from typing import TypeVar

from proxy.config.egress import EgressProxy
from proxy.upstream.http1 import Connection, HTTPError

# The next address of a host is tried after this long while the previous one has not
# answered: a blackholed IPv6 address would otherwise cost the whole connect timeout.
HAPPY_EYEBALLS_DELAY = 0.25
MAX_TUNNEL_HEAD = 16 * 1024  # an egress proxy's answer to CONNECT

P = TypeVar("P", bound=asyncio.BaseProtocol)


class ConnectFailed(HTTPError):
    """No connection could be made (refused, unresolvable, TLS refused): nothing was sent.
    `lasting`: trying again cannot help (a certificate that failed verification, an egress
    proxy that refused for its credentials or its policy)."""

    def __init__(self, message: str, *, lasting: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting


class ConnectTimeout(HTTPError):
    """No connection within the connect timeout: nothing was sent."""


class EgressRefused(ConnectFailed):
    """The egress proxy refused to connect to the upstream (answering CONNECT, or a request
    in absolute form, with `status`). Said without the host: the 4xx of a proxy last (its
    credentials, its policy), its 5xx may not (it could not reach the upstream)."""

    def __init__(self, status: int) -> None:
        try:
            reason = f"{status} {HTTPStatus(status).phrase}"
        except ValueError:
            reason = str(status)
        super().__init__(
            f"the egress proxy refused the connection ({reason})", lasting=status < 500
        )
        self.status = status


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a pool's connections go: the upstream, and the egress proxy on the way."""

    host: str
    port: int
    tls: ssl.SSLContext | None  # TLS to the upstream (https)
    via: EgressProxy | None = None
    via_tls: ssl.SSLContext | None = None  # TLS to the egress proxy itself (https://)


def _host_port(host: str, port: int) -> str:
    """`host:port` as a request line or Host header spells it (an IPv6 address bracketed)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def connect(make: Callable[[], Connection], route: Route, within: float | None) -> Connection:
    """A connection made by `make`, along `route`, `within` seconds (None: no bound)."""
    via = route.via
    try:
        async with asyncio.timeout(within):
            if via is None:
                return (await _open(make, route.host, route.port, route.tls))[1]
            if route.tls is None:  # requests in absolute form, to the proxy
                return (await _open(make, via.host, via.port, route.via_tls))[1]
            return await _tunnel(make, route, via)
    except TimeoutError:
        raise ConnectTimeout(f"no connection within {within:g} s") from None
    except ssl.SSLCertVerificationError as exc:
        raise ConnectFailed(why_not(exc), lasting=True) from exc
    except OSError as exc:  # refused, unresolvable, TLS (ssl.SSLError is an OSError)
        raise ConnectFailed(why_not(exc)) from exc


# What went wrong, in words: an OS error's own message may name the host, and its class
# (`gaierror`) means nothing to most readers. The most specific class first.
_WHY = (
    (socket.gaierror, "its host name did not resolve"),
    (ssl.SSLCertVerificationError, "its TLS certificate failed verification"),
    (ssl.SSLError, "the TLS handshake failed"),
    (ConnectionRefusedError, "the connection was refused"),
    (ConnectionResetError, "the connection was reset"),
)
_UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH}


def why_not(exc: OSError) -> str:
    """Why no connection could be made, in a newcomer's words, never naming the host."""
    for kind, words in _WHY:
        if isinstance(exc, kind):
            return words
    if exc.errno in _UNREACHABLE:
        return "no route to its host"
    return f"the connection failed ({type(exc).__name__})"


async def _open(
    make: Callable[[], P], host: str, port: int, tls: ssl.SSLContext | None
) -> tuple[asyncio.Transport, P]:
    return await asyncio.get_running_loop().create_connection(
        make, sock=await _socket(host, port), ssl=tls, server_hostname=host if tls else None
    )


async def _tunnel(make: Callable[[], Connection], route: Route, via: EgressProxy) -> Connection:
    """CONNECT through `via`, then TLS to the upstream inside the tunnel."""
    loop = asyncio.get_running_loop()
    tunnel = _Tunnel()
    raw, _ = await _open(lambda: tunnel, via.host, via.port, route.via_tls)
    try:
        target = _host_port(route.host, route.port).encode()
        head = [b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n" % (target, target)]
        if via.authorization:
            head.append(b"Proxy-Authorization: %s\r\n" % via.authorization.encode())
        raw.write(b"".join(head) + b"\r\n")
        await tunnel.established
        connection = make()
        assert route.tls is not None
        inner = await loop.start_tls(raw, connection, route.tls, server_hostname=route.host)
    except BaseException:
        raw.close()
        raise
    assert inner is not None  # (None only for a transport closed meanwhile: it raised)
    connection.connection_made(inner)
    return connection


async def _socket(host: str, port: int) -> socket.socket:
    """A socket connected to `host`:`port`: its addresses in turn, families alternating, each
    next one started HAPPY_EYEBALLS_DELAY after the previous unless that failed first.

    The sockets are the race's own, so that none is left open when it is cancelled (asyncio's
    `create_connection(happy_eyeballs_delay=...)` can leave the winner's, Python 3.11)."""
    loop = asyncio.get_running_loop()
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        infos = [(family, address) for family, _, _, _, address in found]
    else:
        infos = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, (host, port))]
    families: dict[int, list[tuple[int, tuple[object, ...]]]] = {}
    for info in infos:
        families.setdefault(info[0], []).append(info)
    ordered = [info for row in itertools.zip_longest(*families.values()) for info in row if info]
    opened: list[socket.socket] = []

    async def attempt(family: int, address: tuple[object, ...]) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        opened.append(sock)
        sock.setblocking(False)
        await loop.sock_connect(sock, address)
        return sock

    winner = None
    try:
        winner, _, errors = await staggered.staggered_race(
            [functools.partial(attempt, *info) for info in ordered], HAPPY_EYEBALLS_DELAY
        )
    finally:
        for sock in opened:
            if sock is not winner:
                sock.close()
    if winner is None:
        raise next((e for e in errors if e is not None), OSError(f"no address for {host}"))
    return winner


class _Tunnel(asyncio.Protocol):
    """The egress proxy's answer to CONNECT: `established` once it is a 2xx."""

    def __init__(self) -> None:
        self.established: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._transport: asyncio.Transport | None = None
        self._head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.established.done():
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_TUNNEL_HEAD:
                self._fail(ConnectFailed("the egress proxy's answer to CONNECT is too long"))
            return
        version, _, rest = self._head[: self._head.find(b"\r\n")].partition(b" ")
        status = rest[:3]
        if not version.startswith(b"HTTP/1.") or len(status) != 3 or not status.isdigit():
            self._fail(ConnectFailed("the egress proxy's answer to CONNECT is not HTTP"))
        elif not 200 <= int(status) < 300:
            self._fail(EgressRefused(int(status)))
        elif end + 4 < len(self._head):  # a TLS server never speaks first
            self._fail(ConnectFailed("bytes after the egress proxy's answer to CONNECT"))
        else:
            assert self._transport is not None
            self._transport.pause_reading()  # what follows is TLS's, once it starts
            self.established.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.established.done():
            self._fail(ConnectFailed("the egress proxy closed the connection"))

    def _fail(self, error: ConnectFailed) -> None:
        if not self.established.done():
            self.established.set_exception(error)
        if self._transport is not None:
            self._transport.close()
