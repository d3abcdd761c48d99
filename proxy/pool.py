"""Connection pools towards HTTP upstreams: one aiohttp session per upstream, its connections
bounded, no cookie jar (a cookie set on one tenant's answer would go out with another tenant's
request), and a connector that notes how far each attempt got, for the retries and the
timeouts' messages.
"""

from __future__ import annotations

import contextvars
import dataclasses
import weakref

import aiohttp
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace


def pooled_session(
    max_connections: int, connect_timeout: float | None = None
) -> aiohttp.ClientSession:
    """A session for one upstream: bodies as bytes, no timeouts of its own but for making a
    connection (the others are the proxy's: first byte, idle), no default headers, no
    cookies."""
    return aiohttp.ClientSession(
        connector=_Connector(max_connections),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
    )


@dataclasses.dataclass
class Progress:
    """How far one attempt got: the phase a timeout is named after, and whether the
    connection came from the pool (a stale one is safe to retry)."""

    phase: str = "connect"  # "pool" while every connection is busy, "first_byte" once connected
    reused: bool = False


# The attempt under way in this task, for the connector to note its progress in. (aiohttp's
# tracing would tell the same, at ten times the cost per request.)
_ATTEMPT: contextvars.ContextVar[Progress] = contextvars.ContextVar("upstream_attempt")


class _Connector(aiohttp.TCPConnector):
    """A TCPConnector that notes in the current attempt whether it waited for a free
    connection and whether the one it got had served a request before."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit=limit, ttl_dns_cache=300)
        self._served: weakref.WeakSet[object] = weakref.WeakSet()

    async def connect(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
    ) -> Connection:
        progress = _ATTEMPT.get(None) or Progress()
        if self._available_connections(req.connection_key) <= 0:
            progress.phase = "pool"
        connection = await super().connect(req, traces, timeout)
        progress.phase = "first_byte"
        progress.reused = connection.protocol in self._served
        if not progress.reused:
            self._served.add(connection.protocol)
        return connection


def attempting(progress: Progress) -> None:
    """Make `progress` the attempt that this task's next connection is noted in."""
    _ATTEMPT.set(progress)
