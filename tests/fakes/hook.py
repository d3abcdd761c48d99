"""A compaction hook on loopback (docs/config.md, `hooks`), for the tests: it records every call
and answers as told."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.base import FakeServer, RecordedRequest


class FakeHook(FakeServer[RecordedRequest]):
    """Serves any path: each call is recorded (its JSON in `calls`), then answered after `delay`
    seconds with `status` and `answer` as JSON (an empty body when None)."""

    def __init__(self) -> None:
        super().__init__(max_body_bytes=16 * 1024 * 1024)
        self.answer: Any = None
        self.status = 200
        self.delay = 0.0

    def url(self, path: str) -> str:
        return self.origin + path

    def calls(self, path: str) -> list[dict[str, Any]]:
        """The payloads POSTed to `path`, oldest first."""
        return [r.json for r in self.requests if r.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await self._receive(request)
        await asyncio.sleep(self.delay)
        body = b"" if self.answer is None else orjson.dumps(self.answer)
        return web.Response(body=body, status=self.status, content_type="application/json")


def closed_port_url(path: str) -> str:
    """A URL on loopback where nothing listens: a hook that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"
