"""The summarizer's breakers are keyed by what failed: a caller whose key is refused or
rate-limited cools only that key, an upstream that fails cools that upstream for everyone."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import httpx
import openai
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.conftest import config_for, metric
from tests.fakes.openai import FakeUpstream
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


@dataclasses.dataclass
class Gated:
    up: FakeUpstream
    gate: Gate
    summaries: Summaries
    server: ServerThread
    stack: contextlib.ExitStack

    def tenant(self, api_key: str, session: str) -> Conversation:
        """A conversation of the tenant whose key this is, over the compaction level."""
        client = openai.OpenAI(base_url=self.server.url + "/v1", api_key=api_key, max_retries=0)
        return Conversation(self.stack.enter_context(client), session, rounds=24)

    def cooled(self, scope: str) -> float:
        with httpx.Client() as http:
            name = "compaction_proxy_summarizer_cooldowns_total"
            return metric(http, self.server, name, scope=scope)


@contextlib.contextmanager
def gated() -> Iterator[Gated]:
    summaries = Summaries()
    settings = {"retries": 0, "cooldown_seconds": COOLDOWN}
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(FakeUpstream(windows={MODEL: 8192}, summarizer=summaries))
        gate = Gate(up)
        app = Starlette(routes=[Route("/v1/{path:path}", gate.relay, methods=["POST"])])
        front = stack.enter_context(ServerThread(app))
        config = config_for(
            up,
            upstreams={"fake": {"base_url": front.url + "/v1"}},
            models=[{"match": MODEL, "context_window": WINDOW}],
            policies={"default": {"prepare_at": 0.85, "summarizer": settings}},
        )
        server = stack.enter_context(proxy_server(config))
        yield Gated(up, gate, summaries, server, stack)


def test_a_rate_limited_key_cools_only_itself() -> None:
    with gated() as g:
        assert g.tenant(RATE_LIMITED, "a1").say()["x-compaction-action"] == "degraded"
        assert g.gate.refused == 1
        assert g.cooled("credential") == 1 and g.cooled("upstream") == 0

        # Another tenant's compaction still gets its summary.
        assert g.tenant("sk-tenant-b", "b1").say()["x-compaction-action"] == "compacted"
        assert len(g.summaries.bodies) == 1

        # The refused key is cooling: its next compaction degrades without a call.
        assert g.tenant(RATE_LIMITED, "a2").say()["x-compaction-action"] == "degraded"
        assert g.gate.refused == 1


def test_a_failing_upstream_cools_every_key() -> None:
    with gated() as g:
        g.summaries.answer = lambda n: RuntimeError("boom")  # the fake answers 500
        assert g.tenant("sk-tenant-b", "b1").say()["x-compaction-action"] == "degraded"
        assert g.cooled("upstream") == 1 and g.cooled("credential") == 0

        g.summaries.answer = lambda n: f"SUMMARY-{n}"
        assert g.tenant("sk-tenant-c", "c1").say()["x-compaction-action"] == "degraded"
        assert g.up.summary_calls == 1
