"""How a connection to an upstream is made: the host's addresses raced (happy eyeballs, RFC
8305), and TLS verified against the system's certificates (SSL_CERT_FILE).

A connection that was never made raises `ConnectFailed` or `ConnectTimeout`: nothing was sent,
so it is safe to try again, unless `ConnectFailed.lasting` says it would fail the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ipaddress
import itertools
import socket
import ssl
from asyncio import staggered
from collections.abc import Callable

from proxy.upstream.http1 import Connection, HTTPError

# The next address of a host is tried after this long while the previous one has not
# answered: a blackholed IPv6 address would otherwise cost the whole connect timeout.
HAPPY_EYEBALLS_DELAY = 0.25


class ConnectFailed(HTTPError):
    """No connection could be made (refused, unresolvable, TLS refused): nothing was sent.
    `lasting`: trying again cannot help (a certificate that failed verification)."""

    def __init__(self, message: str, *, lasting: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting


class ConnectTimeout(HTTPError):
    """No connection within the connect timeout: nothing was sent."""


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a pool's connections go."""

    host: str
    port: int
    tls: ssl.SSLContext | None  # TLS to the upstream (https)


async def connect(make: Callable[[], Connection], route: Route, within: float | None) -> Connection:
    """A connection made by `make`, along `route`, `within` seconds (None: no bound)."""
    try:
        async with asyncio.timeout(within):
            return await _open(make, route.host, route.port, route.tls)
    except TimeoutError:
        raise ConnectTimeout(f"no connection within {within:g} s") from None
    except ssl.SSLCertVerificationError as exc:
        raise ConnectFailed(type(exc).__name__, lasting=True) from exc
    except OSError as exc:  # refused, unresolvable, TLS (ssl.SSLError is an OSError)
        raise ConnectFailed(type(exc).__name__) from exc


async def _open(
    make: Callable[[], Connection], host: str, port: int, tls: ssl.SSLContext | None
) -> Connection:
    loop = asyncio.get_running_loop()
    _, made = await loop.create_connection(
        make, sock=await _socket(host, port), ssl=tls, server_hostname=host if tls else None
    )
    return made


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
