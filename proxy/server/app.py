"""The ASGI application, built by a factory with its store and HTTP client injectable."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

import policies
from proxy.compaction.compactor import Compactor
from proxy.compaction.exact_count import ExactCounts
from proxy.compaction.hooks import Hooks
from proxy.compaction.prepared import PreparedSummaries
from proxy.compaction.summarizer import Summarizers
from proxy.config import Config, Upstream
from proxy.dialects import DIALECTS, Dialect
from proxy.dialects.openai.chat import Chat
from proxy.dialects.openai.responses import Responses
from proxy.errors import APIError, NotFound, StreamBroken, UpstreamUnreachable
from proxy.models.calibration import Calibration
from proxy.models.limits import ModelLimits
from proxy.models.tokens import configure_offline_encodings
from proxy.observability.labels import ModelLabels
from proxy.observability.metrics import CONTENT_TYPE_LATEST, UNROUTED, Metrics
from proxy.server.admin import Admin
from proxy.server.dashboard import dashboard_routes, turn_ledger
from proxy.server.gate import Gate
from proxy.server.handler import Handler
from proxy.server.incoming import IncomingRequest, query_string, read_body
from proxy.server.provider_compaction import COMPACT_PATH, ProviderCompaction
from proxy.server.relay import Relay, until_disconnect
from proxy.server.tenants import Tenants
from proxy.sessions.cache_usage import CacheLedger
from proxy.sessions.sessions import Sessions
from proxy.sessions.store import SessionStore, open_store
from proxy.upstream import litellm_transport
from proxy.upstream.client import UpstreamClient, relayable

log = logging.getLogger("compaction_proxy")

Endpoint = Callable[[Request], Awaitable[ASGIApp]]
# The proxy's own errors outside any wire format's path (passthrough, 404) use OpenAI's shape.
OPENAI = Chat()


class Proxy:
    """The proxy's parts, built once from the config, and its own endpoints as methods."""

    def __init__(
        self,
        config: Config,
        store: SessionStore,
        client: UpstreamClient,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.store = store
        self.client = client
        self.metrics = metrics
        self.tenants = Tenants(config.auth)
        self.limits = ModelLimits(config)
        max_sessions = config.store.max_sessions  # also bounds each per-session ledger
        # Prompt-cache figures not yet written, for both Sessions.
        self.cache = CacheLedger(max_sessions)
        fail_open, turns = config.store.fail_open, turn_ledger(config)
        self.sessions = Sessions(store, metrics, fail_open=fail_open, cache=self.cache, turns=turns)
        summarizers = Summarizers(config, client, self.limits, metrics)
        self.prepared = PreparedSummaries(
            self.sessions, summarizers, metrics, Hooks(config.hooks, metrics)
        )
        self.calibration = Calibration(max_sessions)
        self.compactor = Compactor(
            self.sessions,
            self.limits,
            self.prepared,
            self.calibration,
            max_branches=config.store.max_branches,
            exact_counts=ExactCounts(client, self.calibration, metrics, max_sessions),
        )
        # The proxy's own headers stop here.
        sessions = config.sessions
        drop = {sessions.header, sessions.policy_header, sessions.shadow_header}
        drop = {name.lower() for name in drop}
        if self.tenants.enforced:
            drop.add(config.auth.header.lower())
        self._drop = frozenset(drop)
        models = ModelLabels(config, self.limits.catalog)
        self.handlers = [
            Handler(d, config, self.tenants, self._drop, client, self.compactor, metrics, models)
            for d in DIALECTS
        ]
        defaults = (config.default_upstream_for(d.name) for d in DIALECTS)
        self._passthrough = config.upstreams[next(n for n in defaults if n)]
        self.litellm = litellm_transport.register(client, config, policies.HEADINGS)
        responses = next(h for h in self.handlers if isinstance(h.dialect, Responses))
        self.provider_compaction = ProviderCompaction(
            config,
            self.tenants,
            responses,
            self.relay,
            summarizers,
            self.prepared.hooks,
            self.limits,
            metrics,
        )
        messages = config.default_upstream_for("messages")
        anthropic = config.upstreams.get(messages or "")
        self._anthropic = (
            anthropic if anthropic is not None and anthropic.serves("messages") else None
        )
        by_path = {h.dialect.path: h.dialect for h in self.handlers}
        self.gate = Gate(
            config.listen.max_concurrent_requests,
            metrics,
            lambda path, error: by_path.get(path, OPENAI).error_response(error),
        )

    async def passthrough(self, request: Request) -> ASGIApp:
        """Any other /v1/* call: forwarded untouched to the default upstream (of chat
        completions when defaults are set per API), or to the default Anthropic Messages
        upstream when it comes from an Anthropic client (every call of the Anthropic API
        carries an `anthropic-version` header)."""
        self.tenants.tenant(request.headers)
        upstream = self._passthrough
        if "anthropic-version" in request.headers and self._anthropic is not None:
            upstream = self._anthropic  # an Anthropic client's call: count_tokens, models
        body = await read_body(request, self.config.listen.max_body_bytes)
        return await self.relay(request, upstream, _relative_path(request), body, [])

    async def relay(
        self,
        request: Request,
        upstream: Upstream,
        path: str,
        body: bytes,
        own_headers: list[tuple[str, str]],
    ) -> ASGIApp:
        """`request` (its body read: `body`) forwarded to `path` of `upstream`, and the answer
        relayed as it comes, with `own_headers` (the proxy's) added."""
        headers = relayable(request.headers.items(), self._drop)
        response = await self.client.open(
            upstream, request.method, path, query_string(request), headers, body or None
        )
        routed = UNROUTED._replace(upstream=upstream.name)
        self.metrics.answered("passthrough", response.status, routed)

        def on_end(head: bytes, tail: bytes, outcome: str) -> None:
            response.release() if outcome == "complete" else response.close()

        chunks = response.chunks(upstream.timeouts.stream_idle)
        return Relay(response.status, relayable(response.headers) + own_headers, chunks, on_end)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready when the store answers, the tokenizer is loaded and no shutdown has begun."""
        store = await self.store.ping()
        warm = self.limits.warm
        ready = store and warm and not self.gate.draining
        status = "ready" if ready else "draining" if self.gate.draining else "degraded"
        body = {
            "status": status,
            "store": "ok" if store else "unavailable",
            "tokenizer": "loaded" if warm else "loading",
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def not_found(self, request: Request) -> ASGIApp:
        raise NotFound(f"Invalid URL ({request.method} {request.url.path})")


async def refuse_websocket(websocket: WebSocket) -> None:
    """The proxy speaks HTTP only: a WebSocket upgrade (Codex CLI tries one on /v1/responses
    first) is refused at once, with a 403, and the client falls back to HTTP."""
    await websocket.close()


def _relative_path(request: Request) -> str:
    """The request's path below /v1, still percent-encoded as the client sent it, so that it
    stays below the upstream's base URL: dot segments (encoded or not) are refused."""
    if any(segment in (".", "..") for segment in request.scope["path"].split("/")):
        raise NotFound(f"Invalid URL ({request.method} {request.scope['path']})")
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    return raw.decode("latin-1").partition("?")[0].removeprefix("/v1")


def guarded(endpoint: Endpoint, metrics: Metrics, dialect: Dialect = OPENAI) -> Endpoint:
    """Every failure becomes a clear error in the dialect's shape; never a traceback."""

    async def guarded_endpoint(request: Request) -> ASGIApp:
        try:
            return await endpoint(request)
        except APIError as exc:
            metrics.refused("error", exc)
            # The proxy's own words only (never a message's text, never a credential).
            log.log(
                logging.WARNING if exc.status_code >= 500 else logging.INFO,
                "request refused",
                extra={
                    "status": exc.status_code,
                    "code": exc.code,
                    "api": dialect.name,
                    "reason": exc.message[:300],
                },
            )
            return dialect.error_response(exc)
        except ClientDisconnect:
            return client_gone(metrics)
        except StreamBroken:
            broken = UpstreamUnreachable("the upstream broke off its answer")
            metrics.refused("error", broken)
            return dialect.error_response(broken)
        except Exception as exc:
            log.exception("unexpected error", extra={"error": type(exc).__name__})
            metrics.answered("error", 500)
            return dialect.error_response(APIError("The proxy failed to handle this request."))

    return guarded_endpoint


def client_gone(metrics: Metrics) -> Response:
    """The answer to a client that went away: nobody reads it, the metrics count it (as
    nginx does, 499)."""
    metrics.answered("error", 499)
    return Response(status_code=499)


class _Endpoint:
    """Adapts a handler that returns any ASGI app (a Response or a Relay) to a route.

    Once the request body is in, a client that goes away cancels the handler, and with it the
    upstream request it waits on: an upstream that hangs before its first byte is not left
    holding a connection until the first-byte timeout.
    """

    def __init__(self, handler: Endpoint, metrics: Metrics) -> None:
        self.handler = handler
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body_read = asyncio.Event()

        async def receive_body() -> Message:
            message = await receive()
            if not message.get("more_body", False):
                body_read.set()
            return message

        # The handler runs in this task; a watch of the connection cancels it when the client
        # goes away (one task a request, not two and a wait).
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch_connection() -> None:
            nonlocal gone
            await body_read.wait()
            await until_disconnect(receive)
            gone = True
            task.cancel()

        watch = asyncio.ensure_future(watch_connection())
        try:
            app = await self.handler(IncomingRequest(scope, receive_body, send))
        except asyncio.CancelledError:
            if not gone:
                raise  # the shutdown ended it
            task.uncancel()
            app = client_gone(self.metrics)
        finally:
            watch.cancel()
        await app(scope, receive, send)


ANY = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def create_app(
    config: Config,
    *,
    store: SessionStore | None = None,
    client: UpstreamClient | None = None,
    metrics: Metrics | None = None,
    freeze_heap: bool = False,
) -> Starlette:
    """Build the app. Parts not given are made from the config and closed on shutdown.
    `freeze_heap` is for the process that serves the app, not for one that builds many."""
    configure_offline_encodings()
    owns_store = store is None
    owns_client = client is None
    store = store or open_store(
        config.store.url,
        ttl_seconds=config.store.ttl_seconds,
        key_prefix=config.store.key_prefix,
        timeout_seconds=config.store.timeout_seconds,
        max_sessions=config.store.max_sessions,
    )
    metrics = metrics or Metrics()
    client = client or UpstreamClient(metrics)
    for upstream in config.upstreams.values():
        if upstream.kind != "litellm":
            client.pool(upstream)  # now: an https upstream's TLS settings take 20 ms to load
    proxy = Proxy(config, store, client, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Tokenizers load in the background: /healthz answers at once, and a first request
        # that needs an encoding waits for it in tiktoken. litellm is imported before the
        # proxy answers at all, so that no request pays for it (and a provider it does not
        # know fails the start).
        loop = asyncio.get_running_loop()
        warming = loop.run_in_executor(None, proxy.limits.warm_up)
        if proxy.litellm is not None:
            await loop.run_in_executor(None, proxy.litellm.load)
            await proxy.litellm.warm_up()
        if freeze_heap:
            # What start-up made (modules, the model map, tokenizers) lives as long as the
            # process: frozen, the garbage collector no longer walks it whenever requests
            # trigger a full collection (milliseconds a request on long histories).
            warming.add_done_callback(lambda _: gc.freeze())
        yield
        await warming
        await proxy.prepared.close()
        await proxy.prepared.hooks.close()
        await proxy.sessions.close()
        if proxy.litellm is not None:
            await proxy.litellm.close()
        if owns_client:
            await client.close()
        if owns_store:
            await store.close()

    posts: dict[str, ASGIApp] = {}

    def route(
        path: str, endpoint: Endpoint, methods: list[str], dialect: Dialect = OPENAI
    ) -> Route:
        app = _Endpoint(guarded(endpoint, metrics, dialect), metrics)
        if methods == ["POST"]:
            posts[path] = app
        return Route(path, app, methods=methods)

    provider_compaction = proxy.provider_compaction
    responses = provider_compaction.dialect
    routes: list[BaseRoute] = [
        *(
            route(h.dialect.path, h, ["POST"], h.dialect)
            for h in proxy.handlers
            if h.dialect is not responses
        ),
        # The Responses API's path goes through provider compaction first.
        route(responses.path, provider_compaction.responses, ["POST"], responses),
        route(COMPACT_PATH, provider_compaction.compact, ["POST"], responses),
        *(
            route(h.dialect.count_path, h.count_tokens, ["POST"], h.dialect)
            for h in proxy.handlers
            if h.dialect.count_path
        ),
        route("/v1/{path:path}", proxy.passthrough, ANY),
        Route("/healthz", proxy.healthz, methods=["GET"]),
        Route("/readyz", proxy.readyz, methods=["GET"]),
        Route("/metrics", proxy.metrics_endpoint, methods=["GET"]),
        WebSocketRoute("/{path:path}", refuse_websocket),
    ]
    admin = Admin(proxy.sessions.failing_closed())
    routes += admin.routes(config.admin.token) + dashboard_routes(config, admin)
    routes.append(route("/{path:path}", proxy.not_found, ANY))
    app = ProxyApp(routes, lifespan, proxy.gate, posts)
    app.state.proxy = proxy
    return app


class ProxyApp(Starlette):
    """The routes behind the gate (`proxy.gate`). A POST to an API's path, nearly every
    request, goes straight to its endpoint by one look-up of its path: Starlette's middleware
    and router are for the rest (they would only pass such a request on, at a tenth of its
    own work). Its endpoint turns every failure into an answer itself (`guarded`); middleware
    added to this app (`add_middleware`) does not see those requests."""

    def __init__(
        self,
        routes: list[BaseRoute],
        lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]],
        gate: Gate,
        posts: dict[str, ASGIApp],
    ) -> None:
        super().__init__(routes=routes, lifespan=lifespan)
        self._gated = gate.around(self._dispatch)
        self._posts = posts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._gated(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self._posts.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def server_config(app: ASGIApp, config: Config, **overrides: object) -> uvicorn.Config:
    """uvicorn's settings for the proxy: uvloop and httptools when installed, and the
    upstream's own Date and Server headers relayed instead of uvicorn's. The gate ends what is
    left when the shutdown's grace is over; uvicorn's own bound only backs it up."""
    options: dict[str, object] = {
        "host": config.listen.host,
        "port": config.listen.port,
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "date_header": False,
        # Nothing reads the client's address or scheme: X-Forwarded-* need not be read.
        "proxy_headers": False,
        "lifespan": "on",
        "timeout_graceful_shutdown": math.ceil(config.listen.shutdown_grace_seconds) + 5,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)  # type: ignore[arg-type]
