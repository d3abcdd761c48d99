"""The HTTP client towards the configured upstreams.

aiohttp rather than httpx: measured on this kind of machine it adds a third of httpx's latency
to a relayed request (bench/README.md). Bodies are relayed as bytes: no decompression, no
redirects, and the URL is always the configured upstream's, whatever the client sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

import aiohttp
from yarl import URL

from .config import Upstream
from .errors import StreamBroken, UpstreamTimeout, UpstreamUnreachable

# RFC 9110 section 7.6.1, plus the legacy Proxy-Connection.
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
# Recomputed by whoever sends the body next.
_FRAMING = frozenset({"content-length", "host"})
# Where clients put their upstream credential: OpenAI, Azure, Anthropic.
CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


def credential_header(upstream: Upstream) -> tuple[str, str] | None:
    """The header that carries the upstream's own key, in its kind's form."""
    if not upstream.api_key:
        return None
    if upstream.kind == "anthropic":
        return ("x-api-key", upstream.api_key)
    return ("Authorization", f"Bearer {upstream.api_key}")


def relayable(
    headers: Iterable[tuple[str, str]], drop: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """Headers minus hop-by-hop ones (and those the Connection header names) and `drop`."""
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name.lower() == "connection"
        for token in value.split(",")
    }
    skip = HOP_BY_HOP | _FRAMING | named | drop
    return [(n, v) for n, v in pairs if n.lower() not in skip]


class UpstreamResponse(Protocol):
    """An upstream's answer as the request path uses it, whatever carried it."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> list[tuple[str, str]]: ...

    def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        """The body as it arrives; a stalled or broken body raises StreamBroken."""
        ...

    async def read(self, idle_timeout: float) -> bytes:
        """The whole body (non-streamed answers, error bodies); closes it on failure."""
        ...

    def release(self) -> None:
        """Done with a body read to its end: its connection may be reused."""

    def close(self) -> None:
        """Done early: drop the connection."""


class HTTPResponse:
    """An answer over HTTP, relayed as bytes."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> list[tuple[str, str]]:
        return list(self._response.headers.items())

    def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        return body_chunks(self._response, idle_timeout)

    async def read(self, idle_timeout: float) -> bytes:
        try:
            return b"".join([chunk async for chunk in self.chunks(idle_timeout)])
        except BaseException:
            self._response.close()
            raise

    def release(self) -> None:
        self._response.release()

    def close(self) -> None:
        self._response.close()


class Transport(Protocol):
    """Carries the requests to upstreams of one kind by other means than HTTP relaying."""

    async def open(
        self,
        upstream: Upstream,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        *,
        reserved_output: int | None,
    ) -> UpstreamResponse: ...


class UpstreamClient:
    """One pooled aiohttp session for every upstream, and the transports of other kinds."""

    def __init__(self, session: aiohttp.ClientSession | None = None) -> None:
        self._session = session
        # By upstream kind: litellm (proxy.litellm_transport), registered by the app.
        self.transports: dict[str, Transport] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open(
        self,
        upstream: Upstream,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        *,
        reserved_output: int | None = None,
    ) -> UpstreamResponse:
        """Send a request and wait for the response head (the first byte), within the timeouts.

        `path` is relative to the upstream's base URL (the part after `/v1`).
        `reserved_output` is the output the proxy reserved in the window for a request that
        sets no max_tokens: transports whose providers require a cap send it.
        """
        transport = self.transports.get(upstream.kind)
        if transport is not None:
            return await transport.open(
                upstream, method, path, query, headers, body, reserved_output=reserved_output
            )
        url = upstream.base_url.rstrip("/") + path + (f"?{query}" if query else "")
        own = credential_header(upstream)
        if own is not None:
            # The upstream's key replaces whatever credential the client sent, in any header.
            headers = [(n, v) for n, v in headers if n.lower() not in CREDENTIAL_HEADERS]
            headers.append(own)
        timeouts = upstream.timeouts
        try:
            async with asyncio.timeout(timeouts.first_byte):
                response = await self.session.request(
                    method,
                    URL(url, encoded=True),  # the path as the client encoded it, not re-quoted
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
                )
        except TimeoutError:
            raise UpstreamTimeout(
                f"upstream {upstream.name!r} sent no response within {timeouts.first_byte:g} s"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamUnreachable(
                f"upstream {upstream.name!r} is unreachable: {type(exc).__name__}"
            ) from None
        return HTTPResponse(response)


async def body_chunks(
    response: aiohttp.ClientResponse, idle_timeout: float
) -> AsyncIterator[bytes]:
    """The response body as it arrives; a stalled or broken stream raises StreamBroken."""
    try:
        while True:
            async with asyncio.timeout(idle_timeout):
                chunk = await response.content.readany()
            if not chunk:
                return
            yield chunk
    except TimeoutError:
        raise StreamBroken(f"no data for {idle_timeout:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise StreamBroken(type(exc).__name__) from None
