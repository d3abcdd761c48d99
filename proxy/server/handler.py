"""The request path, the same for every wire format (dialect).

Read, identify (tenant, session), route, compact (proxy.compactor), forward, relay the answer
unchanged. Before any byte has gone to the client, an upstream answer that says the prompt is
over the window is sent again once with what can make it pass, else relayed (the reactive
path, `overflows`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from proxy.compaction.compactor import Compactor
from proxy.compaction.forward import Forward, dashboard_turn
from proxy.compaction.turn import ClientRequest
from proxy.config import Config, NoRoute, Policy, Upstream
from proxy.dialects import (
    Dialect,
    Entitlements,
    Parsed,
    StreamOverflow,
    StreamStartUsage,
    Usage,
)
from proxy.errors import (
    APIError,
    InvalidRequest,
    StreamBroken,
    UpstreamUnreachable,
)
from proxy.observability.labels import ModelLabels
from proxy.observability.metrics import Metrics, RequestLabels
from proxy.server.incoming import query_string, read_body
from proxy.server.overflows import retried as overflow_retry
from proxy.server.overflows import stream_head
from proxy.server.relay import Relay, after, relayed, whole_response
from proxy.server.retrieval_rounds import RetrievalRounds, Settled, whole_answers
from proxy.server.tenants import Tenants
from proxy.sessions.sessions import session_id
from proxy.upstream.answer import ERROR_BYTES, Unread, UpstreamResponse, read_bounded
from proxy.upstream.client import CREDENTIAL_HEADERS, UpstreamClient, relayable

log = logging.getLogger("compaction_proxy")

SSE_HEADERS = [("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")]
_SHADOW_VALUES = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}
_SSE_NAMES = frozenset(name.lower() for name, _ in SSE_HEADERS)
_SSE_TYPED = _SSE_NAMES | {"content-type"}
SSE_TYPE = "text/event-stream; charset=utf-8"
MAX_ROUTES = 1_024  # (model, policy header) pairs whose route a handler remembers


class Handler:
    """`POST` of one dialect's path."""

    def __init__(
        self,
        dialect: Dialect,
        config: Config,
        tenants: Tenants,
        own_headers: frozenset[str],
        client: UpstreamClient,
        compactor: Compactor,
        metrics: Metrics,
        models: ModelLabels,
        rounds: RetrievalRounds | None = None,
    ) -> None:
        self.dialect = dialect
        self.config = config
        self.tenants = tenants
        self.client = client
        self.compactor = compactor
        self.metrics = metrics
        self.models = models
        self.rounds = rounds  # None: no policy has the retrieval tool
        # The upstream is asked for an identity body so that `usage` can be read on the way
        # while the bytes are relayed unchanged; the request's goes decoded (`read_body`).
        self.drop_headers = own_headers | {"accept-encoding", "content-encoding"}
        # What the request's own summary call carries: the credential, and its API's headers.
        self.carried = CREDENTIAL_HEADERS | dialect.call_headers.keys()
        self._routes: dict[tuple[str, str | None], tuple[Policy, Upstream]] = {}

    async def __call__(self, request: Request) -> ASGIApp:
        started = time.perf_counter()
        headers = request.headers
        tenant = self.tenants.tenant(headers)
        raw = await read_body(request, self.config.listen.max_body_bytes)
        parsed = self.dialect.parse(raw)
        client_request = self.client_request(headers, tenant, parsed)
        if self.rounds is not None and client_request.policy.retrieval.enabled:
            restored, index = await self.rounds.restore(client_request)  # hidden rounds back
            if restored is not None:
                parsed = self.dialect.parse(restored)
                client_request = self.client_request(headers, tenant, parsed)
            client_request = dataclasses.replace(client_request, originals=index)
        upstream = client_request.upstream
        labels = self.labels(client_request)
        forward = await self.compactor.prepare(client_request)
        if parsed.opaque_reason is not None:
            self.metrics.held_upstream.labels(*labels, parsed.opaque_reason).inc()
            log.debug(
                "history held upstream: forwarded unchanged",
                extra={"api": self.dialect.name, "reason": parsed.opaque_reason},
            )
        send_headers = [*client_request.headers, ("Accept-Encoding", "identity")]
        query = query_string(request)
        path = self.dialect.upstream_path
        overhead = time.perf_counter() - started
        self.metrics.overhead.labels(*labels).observe(overhead)

        async def send(forward: Forward) -> UpstreamResponse:
            try:
                return await self.client.open(
                    upstream,
                    "POST",
                    path,
                    query,
                    send_headers,
                    forward.body,
                    reserved_output=forward.reserved_output,
                )
            except APIError as exc:  # unreachable, no answer in time: the session still holds
                exc.headers = forward.session_headers()
                raise

        sent = time.perf_counter()
        response = await send(forward)
        idle = upstream.timeouts.stream_idle
        chunks = response.chunks(idle)
        head = error = b""
        if response.status >= 400 and forward.can_retry:
            read = await read_bounded(response, idle, ERROR_BYTES)
            if isinstance(read, Unread):  # larger than any overflow's error
                return self._pass_on(client_request, labels, forward, read, overhead, idle)
            error = read
            if not self.dialect.is_overflow(response.status, error):
                return self._finish(client_request, labels, forward, response, error, overhead)
            overflow = True
        elif (
            parsed.stream
            and response.status == 200
            and forward.can_retry
            and isinstance(self.dialect, StreamOverflow)
        ):
            head, overflow = await stream_head(
                self.dialect, response, chunks, upstream, self.metrics
            )
        else:
            overflow = False
        if overflow:
            # Reactive path, before any byte has gone to the client: sent again once, with
            # what can make it pass, else the overflow is relayed as it came.
            retried = await overflow_retry(self.compactor, client_request, forward, error)
            if retried is None:
                forward = dataclasses.replace(forward, overflow="relayed")
                if not head:
                    return self._finish(client_request, labels, forward, response, error, overhead)
            else:
                response.close()
                head = b""
                forward = retried
                reason = "max_tokens" if retried.overflow == "max_tokens" else "overflow"
                self.metrics.upstream_retries.labels(upstream.name, reason).inc()
                response = await send(forward)
                chunks = response.chunks(idle)
        self.metrics.upstream_latency.labels(*labels).observe(time.perf_counter() - sent)

        rounds = self.rounds if forward.retrieval and response.status == 200 else None

        again = whole_answers(
            lambda body: send(dataclasses.replace(forward, body=body)), idle, upstream
        )

        if parsed.stream and response.status == 200:
            body = after(head, chunks) if head else chunks
            if rounds is not None:
                held = await rounds.hold(client_request, forward.body, body, again)
                if held.settled is not None:
                    return self._finish(
                        client_request, labels, forward, response, b"", overhead, held.settled
                    )
                body = held.stream or chunks
            return self._relay(client_request, labels, forward, response, body, overhead)
        try:
            payload = await read_bounded(response, idle, upstream.max_answer_bytes)
        except StreamBroken as exc:
            self.metrics.upstream_errors.labels(upstream.name, "broken_body").inc()
            raise UpstreamUnreachable(f"upstream {upstream.name!r} broke off its answer") from exc
        if isinstance(payload, Unread):
            return self._pass_on(client_request, labels, forward, payload, overhead, idle)
        if rounds is not None:
            settled = await rounds.settle(client_request, forward.body, payload, again)
            return self._finish(client_request, labels, forward, response, b"", overhead, settled)
        return self._finish(client_request, labels, forward, response, payload, overhead)

    def client_request(
        self, headers: Mapping[str, str], tenant: str, parsed: Parsed
    ) -> ClientRequest:
        """The request routed, with its session and what its own summary call may carry."""
        sessions = self.config.sessions
        given = headers.items()
        policy, upstream = self.route(parsed.model, headers.get(sessions.policy_header))
        return ClientRequest(
            dialect=self.dialect,
            parsed=parsed,
            tenant=tenant,
            session=session_id(
                headers.get(sessions.header),
                self.dialect.session_hint(headers, parsed),
                parsed.messages,
            ),
            policy=policy,
            upstream=upstream,
            credentials=tuple(
                (name, value)
                for name, value in given
                if name in self.carried and name not in self.drop_headers
            ),
            window=self.dialect.window(headers) if isinstance(self.dialect, Entitlements) else None,
            headers=tuple(relayable(given, self.drop_headers)),
            shadow=self.shadow(headers.get(sessions.shadow_header), policy),
        )

    def route(self, model: str, policy_header: str | None) -> tuple[Policy, Upstream]:
        """`Config.route` for this dialect, remembered for the models asked for last: it
        matches globs, and every request of a session asks the same."""
        key = (model, policy_header)
        found = self._routes.get(key)
        if found is None:
            try:
                found = self.config.route(self.dialect.name, model, policy_header)
            except NoRoute as exc:
                raise InvalidRequest(str(exc), param="model") from None
            if len(self._routes) >= MAX_ROUTES:
                self._routes.clear()  # models named by clients: any number of them
            self._routes[key] = found
        return found

    def shadow(self, value: str | None, policy: Policy) -> bool:
        """Shadow mode as the request's header asks (on or off), else as its policy says."""
        if value is None:
            return policy.shadow
        shadow = _SHADOW_VALUES.get(value.strip().lower())
        if shadow is None:
            raise InvalidRequest(
                f"the {self.config.sessions.shadow_header} header must be 1 (shadow mode: "
                "compaction computed and reported, the request forwarded unchanged) or 0, "
                f"not {value[:40]!r}"
            )
        return shadow

    def labels(self, request: ClientRequest) -> RequestLabels:
        """The labels of the request's metrics."""
        model = self.models.label(request.parsed.model, request.upstream)
        return RequestLabels(self.dialect.name, request.policy.name, request.upstream.name, model)

    def _headers(
        self, forward: Forward, response: UpstreamResponse, overhead: float
    ) -> list[tuple[str, str]]:
        headers = relayable(response.headers)
        headers += forward.headers()
        headers.append(("x-compaction-overhead-ms", f"{overhead * 1000:.2f}"))
        return headers

    def _finish(
        self,
        request: ClientRequest,
        labels: RequestLabels,
        forward: Forward,
        response: UpstreamResponse,
        payload: bytes,
        overhead: float,
        settled: Settled | None = None,
    ) -> Response:
        """The whole answer; with `settled`, after the proxy's own tool calls in it were
        answered (calibrated by the first upstream answer: the one to the forwarded body).
        Calibrated and counted once it went out."""
        response.release()
        status = response.status if settled is None else settled.status
        if settled is not None:
            payload = settled.payload
        first = payload if settled is None else settled.first
        calibrated = response.status == 200

        def answered() -> None:
            if calibrated:
                self._calibrate(request, labels, forward, self.dialect.usage(first))
            self._count(request, labels, forward, status)

        headers = self._headers(forward, response, overhead)
        if settled is not None:
            headers.append(("x-compaction-retrievals", str(settled.retrievals)))
            if request.parsed.stream:  # the events written whole, or the error of a round
                sse = status == 200
                headers = [h for h in headers if h[0].lower() not in _SSE_TYPED]
                headers += SSE_HEADERS if sse else []
                headers.append(("content-type", SSE_TYPE if sse else "application/json"))
        return whole_response(payload, status, headers, answered)

    def _relay(
        self,
        request: ClientRequest,
        labels: RequestLabels,
        forward: Forward,
        response: UpstreamResponse,
        chunks: AsyncIterator[bytes],
        overhead: float,
    ) -> Relay:
        headers = [
            h for h in self._headers(forward, response, overhead) if h[0].lower() not in _SSE_NAMES
        ]
        headers += SSE_HEADERS
        parsed: Parsed = request.parsed
        dialect = self.dialect
        want_usage = dialect.wants_usage(parsed)

        def on_end(head: bytes, tail: bytes, outcome: str) -> None:
            if outcome == "upstream_broken":
                self.metrics.upstream_errors.labels(request.upstream.name, "broken_stream").inc()
            if want_usage and outcome == "complete":
                start = (
                    dialect.stream_start_usage(head)
                    if isinstance(dialect, StreamStartUsage)
                    else None
                )
                usage = start or dialect.stream_usage(tail)
                self._calibrate(request, labels, forward, usage)

        started = functools.partial(self._count, request, labels, forward, response.status)
        return relayed(response, headers, chunks, on_end, started)

    def _pass_on(
        self,
        request: ClientRequest,
        labels: RequestLabels,
        forward: Forward,
        response: Unread,
        overhead: float,
        idle: float,
    ) -> Relay:
        """An answer too large to hold, relayed as it comes (its usage unread)."""
        started = functools.partial(self._count, request, labels, forward, response.status)
        headers = self._headers(forward, response, overhead)
        return relayed(response, headers, response.chunks(idle), started=started)

    def _calibrate(
        self, request: ClientRequest, labels: RequestLabels, forward: Forward, usage: Usage | None
    ) -> None:
        """Calibrate the counter by the upstream's own count of what was forwarded, and count
        what the upstream's prompt cache read and wrote."""
        if usage is None:
            return
        self.compactor.count_cache(request, usage)
        if request.parsed.opaque_reason is None:  # else the upstream counted unseen history
            self.compactor.calibrate(request, forward, usage.prompt_tokens)
        self.metrics.upstream_prompt_tokens.labels(*labels).inc(usage.prompt_tokens)
        # Counted where the usage reports them, a cache that missed as 0: a share of 0, not none.
        if usage.cached_tokens is not None:
            self.metrics.cached_prompt_tokens.labels(*labels).inc(usage.cached_tokens)
        if usage.cache_creation_tokens is not None:
            self.metrics.cache_creation_tokens.labels(*labels).inc(usage.cache_creation_tokens)

    def _count(
        self, request: ClientRequest, labels: RequestLabels, forward: Forward, status: int
    ) -> None:
        turns = self.compactor.sessions.turns
        if turns is not None:  # the dashboard is on
            turns.observe(request.key, *dashboard_turn(request, forward))
        self.metrics.answered(labels.dialect, status, labels)
        self.metrics.forwarded(labels, forward.applied, forward.tokens_before, forward.tokens_sent)
        if forward.shadow:
            self.metrics.shadow_actions.labels(forward.action).inc()
            saved = forward.tokens_before - forward.tokens_after
            self.metrics.shadow_tokens_saved.inc(max(0, saved))
        log.info(
            "request forwarded",
            extra={
                "api": self.dialect.name,
                "session": forward.session_hash[:16],
                "status": status,
                "action": forward.action,
                "shadow": forward.shadow,
                "store": forward.store,
                "tokens_before": forward.tokens_before,
                "tokens_after": forward.tokens_after,
                "decisions": [dataclasses.asdict(d) for d in forward.decisions],
            },
        )
