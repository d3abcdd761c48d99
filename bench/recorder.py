"""A recording relay on loopback, between a client and the proxy: what the client sent (method,
path, headers, body) and what it got back (status, headers), the body streamed through as it
comes. bench/agent_clients.py puts it in front of the proxy to keep the real clients' requests.

    with Recorder("http://127.0.0.1:8080") as recorder:
        ...  # the client at recorder.origin; then recorder.exchanges
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from tests.fakes.base import FakeServer, RecordedRequest

# Hop-by-hop headers, and the framing the relay sets anew.
_HOP = frozenset(("host", "content-length", "transfer-encoding", "connection", "keep-alive"))


@dataclasses.dataclass(frozen=True)
class Exchange:
    request: RecordedRequest
    status: int
    headers: Mapping[str, str]  # the answer's, case-insensitive


class Recorder(FakeServer[RecordedRequest]):
    """Relays every request to `target` (an origin) and records it with its answer's head."""

    def __init__(self, target: str, max_body_bytes: int = 64 * 2**20) -> None:
        super().__init__(max_body_bytes=max_body_bytes)
        self.target = target.rstrip("/")
        self._exchanges: list[Exchange] = []
        self._session: aiohttp.ClientSession | None = None

    @property
    def exchanges(self) -> list[Exchange]:
        """The requests relayed and the heads of their answers, in the order answered."""
        with self._changed:
            return list(self._exchanges)

    def stop(self) -> None:
        if self._loop is not None and self._session is not None:
            closing = asyncio.run_coroutine_threadsafe(self._session.close(), self._loop)
            closing.result(timeout=10)
            self._session = None
        super().stop()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw, _, recorded = await self._receive(request)
        if self._session is None:  # made on the server's own loop
            timeout = aiohttp.ClientTimeout(total=None, sock_read=900)
            self._session = aiohttp.ClientSession(auto_decompress=False, timeout=timeout)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        async with self._session.request(
            request.method,
            self.target + request.raw_path,
            data=raw,
            headers=headers,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        ) as answer:
            if recorded is not None:
                with self._changed:
                    self._exchanges.append(Exchange(recorded, answer.status, answer.headers))
            response = web.StreamResponse(status=answer.status)
            for name, value in answer.headers.items():
                if name.lower() not in _HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            try:
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:
                pass  # the client had what it wanted (a stream's last event) and went away
            return response
