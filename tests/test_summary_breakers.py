"""The summarizer's breakers are keyed by what failed: a caller whose key is refused or
rate-limited cools only that key, an upstream that fails cools that upstream for everyone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.conftest import config_for, metric
from tests.fake_upstream import FakeUpstream
from tests.harness import MODEL, WINDOW, Conversation, Summaries
from tests.servers import ServerThread, proxy_server

RATE_LIMITED = "sk-tenant-a"
COOLDOWN = 30.0  # longer than the test: whatever cools stays cool


class Gate:
    """In front of the fake upstream: answers 429 to the summary requests of one key, as a
    provider does when that key is over its tokens per minute; relays everything else."""

    def __init__(self, up: FakeUpstream) -> None:
        self.up = up
        self.refused = 0

    async def relay(self, request: Request) -> Response:
        body = await request.body()
        summary = request.headers.get("x-compaction-summary") == "1"
        if summary and request.headers.get("authorization") == f"Bearer {RATE_LIMITED}":
            self.refused += 1
            error = {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}
            return JSONResponse({"error": error}, status_code=429)
        headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                self.up.origin + request.url.path, content=body, headers=headers
            )
        return Response(answer.content, answer.status_code, media_type="application/json")


@contextlib.contextmanager
def gated() -> Iterator[tuple[FakeUpstream, Gate, Summaries, ServerThread]]:
    summaries = Summaries()
    settings = {"retries": 0, "cooldown_seconds": COOLDOWN}
    with FakeUpstream(windows={MODEL: 8192}, summarizer=summaries) as up:
        gate = Gate(up)
        app = Starlette(routes=[Route("/v1/{path:path}", gate.relay, methods=["POST"])])
        with ServerThread(app) as front:
            config = config_for(
                up,
                upstreams={"fake": {"base_url": front.url + "/v1"}},
                models=[{"match": MODEL, "context_window": WINDOW}],
                policies={"default": {"prepare_at": 0.85, "summarizer": settings}},
            )
            with proxy_server(config) as server:
                yield up, gate, summaries, server


def cooled(server: ServerThread, scope: str) -> float:
    with httpx.Client() as http:
        return metric(http, server, "compaction_proxy_summarizer_cooldowns_total", scope=scope)


def test_a_rate_limited_key_cools_only_itself() -> None:
    with gated() as (_, gate, summaries, server):
        tenant_a = Conversation(server.url, "a1", api_key=RATE_LIMITED, rounds=24)
        assert tenant_a.say()["x-compaction-action"] == "degraded"
        assert gate.refused == 1
        assert cooled(server, "credential") == 1 and cooled(server, "upstream") == 0

        # Another tenant's compaction still gets its summary.
        tenant_b = Conversation(server.url, "b1", api_key="sk-tenant-b", rounds=24)
        assert tenant_b.say()["x-compaction-action"] == "compacted"
        assert len(summaries.bodies) == 1

        # The refused key is cooling: its next compaction degrades without a call.
        again = Conversation(server.url, "a2", api_key=RATE_LIMITED, rounds=24)
        assert again.say()["x-compaction-action"] == "degraded"
        assert gate.refused == 1


def test_a_failing_upstream_cools_every_key() -> None:
    with gated() as (up, _, summaries, server):
        summaries.answer = lambda n: RuntimeError("boom")  # the fake answers 500
        tenant_b = Conversation(server.url, "b1", api_key="sk-tenant-b", rounds=24)
        assert tenant_b.say()["x-compaction-action"] == "degraded"
        assert cooled(server, "upstream") == 1 and cooled(server, "credential") == 0

        summaries.answer = lambda n: f"SUMMARY-{n}"
        tenant_c = Conversation(server.url, "c1", api_key="sk-tenant-c", rounds=24)
        assert tenant_c.say()["x-compaction-action"] == "degraded"
        assert up.summary_calls == 1
