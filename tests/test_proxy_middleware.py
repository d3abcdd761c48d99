"""Middleware added to the app (`add_middleware`) sees every request: an API's POST, which
the app sends to its endpoint past Starlette's router, as well as the rest."""

from __future__ import annotations

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.server.app import create_app
from tests.conftest import config_for
from tests.fakes.openai import FakeUpstream
from tests.servers import served

HELLO = [{"role": "user", "content": "hi"}]


class Marking:
    """Notes each HTTP request's method and path, and marks its answer with a header."""

    def __init__(self, app: ASGIApp, seen: list[tuple[str, str]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.seen.append((scope["method"], scope["path"]))

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-marked", b"1")]}
            await send(message)

        await self.app(scope, receive, marked)


def test_middleware_added_after_construction_sees_every_call(
    http: httpx.Client, upstream: FakeUpstream
) -> None:
    config = config_for(upstream)
    app = create_app(config)
    seen: list[tuple[str, str]] = []
    app.add_middleware(Marking, seen=seen)
    calls = [
        ("POST", "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": HELLO}),
        ("POST", "/v1/responses", {"model": "gpt-4o-mini", "input": "hi"}),
        ("POST", "/v1/chat/completions", {"model": "gpt-4o-mini"}),  # refused: 400
        ("GET", "/v1/models", None),
        ("GET", "/healthz", None),
        ("GET", "/nowhere", None),
    ]
    with served(app, config) as server:
        answers = [http.request(m, server.url + path, json=body) for m, path, body in calls]
    assert [a.status_code for a in answers] == [200, 200, 400, 200, 200, 404]
    assert all(a.headers.get("x-marked") == "1" for a in answers)
    assert seen == [(method, path) for method, path, _ in calls]
