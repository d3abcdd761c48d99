"""`POST /v1/chat/completions`: the request path of DESIGN.md section 2.

Read, identify, route, compact (proxy.compactor), forward, relay the answer unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from .compactor import Chat, Compactor, Forward
from .config import Config
from .errors import UpstreamUnreachable
from .metrics import Metrics
from .requests import max_output_requested, parse_chat, query_string, read_body, wants_usage
from .sessions import session_id
from .streaming import Relay, usage_from_sse
from .tenants import Tenants
from .upstream import StreamBroken, UpstreamClient, body_chunks, relayable
from .upstream import read_body as read_upstream_body

log = logging.getLogger("compaction_proxy")

SSE_HEADERS = [("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")]
_SSE_NAMES = frozenset(name.lower() for name, _ in SSE_HEADERS)


class ChatHandler:
    def __init__(
        self,
        config: Config,
        tenants: Tenants,
        client: UpstreamClient,
        compactor: Compactor,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.client = client
        self.compactor = compactor
        self.metrics = metrics
        own = {config.sessions.header.lower(), config.sessions.policy_header.lower()}
        if tenants.enforced:
            own.add(config.auth.header.lower())
        # Our own headers stop here; the upstream is asked for an identity body so that
        # `usage` can be read on the way while the bytes are relayed unchanged.
        self.drop_headers = frozenset({*own, "accept-encoding"})

    async def __call__(self, request: Request) -> ASGIApp:
        started = time.perf_counter()
        tenant = self.tenants.tenant(request.headers)
        raw = await read_body(request, self.config.listen.max_body_bytes)
        body = parse_chat(raw)
        model: str = body["model"]
        policy_name = request.headers.get(self.config.sessions.policy_header)
        policy, upstream = self.config.route(model, policy_name)
        chat = Chat(
            tenant=tenant,
            session=session_id(request.headers.get(self.config.sessions.header), body),
            model=model,
            body=body,
            raw=raw,
            policy=policy,
            upstream=upstream,
            max_output=max_output_requested(body),
            credential=request.headers.get("authorization"),
        )
        forward = await self.compactor.prepare(chat)
        headers = relayable(request.headers.items(), self.drop_headers)
        query = query_string(request)
        headers.append(("Accept-Encoding", "identity"))
        overhead = time.perf_counter() - started
        self.metrics.overhead.observe(overhead)

        sent = time.perf_counter()
        response = await self.client.open(
            upstream, "POST", "/chat/completions", query, headers, forward.body
        )
        if response.status == 400 and forward.can_retry:
            error = await read_upstream_body(response, upstream.timeouts.stream_idle)
            if _is_context_length_exceeded(error):
                # Reactive path: the counter under-estimated; compact harder and retry once,
                # before any byte has gone to the client.
                forward = await self.compactor.retry_harder(chat, forward)
                response = await self.client.open(
                    upstream, "POST", "/chat/completions", query, headers, forward.body
                )
            else:
                return self._finish(chat, forward, response, error, overhead)
        self.metrics.upstream_latency.observe(time.perf_counter() - sent)

        if body.get("stream") and response.status == 200:
            return self._relay(chat, forward, response, overhead, upstream.timeouts.stream_idle)
        try:
            payload = await read_upstream_body(response, upstream.timeouts.stream_idle)
        except StreamBroken as exc:
            self.metrics.upstream_errors.labels("broken_body").inc()
            raise UpstreamUnreachable(f"upstream {upstream.name!r} broke off its answer") from exc
        return self._finish(chat, forward, response, payload, overhead)

    def _headers(
        self, forward: Forward, response: aiohttp.ClientResponse, overhead: float
    ) -> list[tuple[str, str]]:
        headers = relayable(response.headers.items())
        headers += forward.headers()
        headers.append(("x-compaction-overhead-ms", f"{overhead * 1000:.2f}"))
        return headers

    def _finish(
        self,
        chat: Chat,
        forward: Forward,
        response: aiohttp.ClientResponse,
        payload: bytes,
        overhead: float,
    ) -> Response:
        response.release()
        if response.status == 200:
            self.compactor.observe_usage(chat, forward, _usage_of(payload))
        self._count(forward, response.status)
        out = Response(payload, status_code=response.status)
        out.raw_headers = [
            (n.lower().encode("latin-1"), v.encode("latin-1"))
            for n, v in self._headers(forward, response, overhead)
        ]
        out.raw_headers.append((b"content-length", str(len(payload)).encode()))
        return out

    def _relay(
        self,
        chat: Chat,
        forward: Forward,
        response: aiohttp.ClientResponse,
        overhead: float,
        idle_timeout: float,
    ) -> Relay:
        headers = [
            h for h in self._headers(forward, response, overhead) if h[0].lower() not in _SSE_NAMES
        ]
        headers += SSE_HEADERS
        want_usage = wants_usage(chat.body)

        def on_end(tail: bytes, outcome: str) -> None:
            response.release() if outcome == "complete" else response.close()
            if outcome == "upstream_broken":
                self.metrics.upstream_errors.labels("broken_stream").inc()
            if want_usage and outcome == "complete":
                self.compactor.observe_usage(chat, forward, usage_from_sse(tail))

        self._count(forward, response.status)
        return Relay(response.status, headers, body_chunks(response, idle_timeout), on_end)

    def _count(self, forward: Forward, status: int) -> None:
        self.metrics.requests.labels("chat", str(status)).inc()
        self.metrics.actions.labels(forward.action).inc()
        self.metrics.tokens_before.observe(forward.tokens_before)
        self.metrics.tokens_after.observe(forward.tokens_after)
        log.info(
            "chat completion",
            extra={
                "session": forward.session_hash[:16],
                "status": status,
                "action": forward.action,
                "store": forward.store,
                "tokens_before": forward.tokens_before,
                "tokens_after": forward.tokens_after,
                "decisions": [dataclasses.asdict(d) for d in forward.decisions],
            },
        )


def _is_context_length_exceeded(payload: bytes) -> bool:
    try:
        error = orjson.loads(payload).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("code") == "context_length_exceeded"


def _usage_of(payload: bytes) -> dict[str, Any] | None:
    try:
        usage = orjson.loads(payload).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return usage if isinstance(usage, dict) else None
