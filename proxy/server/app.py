"""The ASGI application: the proxy's parts wired from the config (`Proxy`), its routes, and
the app that serves them (`create_app`), with its store and HTTP client injectable."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

import policies
from proxy.compaction.compactor import Compactor
from proxy.compaction.exact_count import ExactCounts
from proxy.compaction.hooks import Hooks
from proxy.compaction.kept_originals import KeptOriginals, results_kept
from proxy.compaction.prepared import PreparedSummaries
from proxy.compaction.provider_summaries import ProviderSummaries
from proxy.compaction.summarizer import Summarizers
from proxy.config import Config
from proxy.dialects import DIALECTS, Dialect, TokenCounting
from proxy.dialects.openai.responses import Responses
from proxy.models.calibration import Calibration
from proxy.models.limits import ModelLimits
from proxy.models.tokens import configure_offline_encodings
from proxy.observability.labels import ModelLabels
from proxy.observability.metrics import Metrics
from proxy.observability.retrieval_metrics import RetrievalMetrics
from proxy.observability.worker_metrics import Worker, WorkerMetrics
from proxy.server.admin import Admin, admin_off
from proxy.server.count_endpoint import CountEndpoint
from proxy.server.dashboard import dashboard_routes, turn_ledger
from proxy.server.disconnects import Endpoint, WatchedEndpoint
from proxy.server.error_shapes import error_shape
from proxy.server.gate import Gate
from proxy.server.guard import Shape, by_request, guarded
from proxy.server.handler import Handler
from proxy.server.originals_api import OriginalsAPI
from proxy.server.passthrough import Passthrough, not_found
from proxy.server.probes import Probes
from proxy.server.provider_compaction import COMPACT_PATH, ProviderCompaction
from proxy.server.responses_socket import ResponsesSocket
from proxy.server.retrieval_rounds import RetrievalRounds
from proxy.server.tenants import Tenants
from proxy.server.upgrades import websocket_refusal
from proxy.sessions.cache_usage import CacheLedger
from proxy.sessions.sessions import Sessions
from proxy.sessions.store import SessionStore, open_store
from proxy.upstream import litellm_transport
from proxy.upstream.client import UpstreamClient

ANY = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class Proxy:
    """The proxy's parts, built once from the config."""

    def __init__(
        self,
        config: Config,
        store: SessionStore,
        client: UpstreamClient,
        metrics: Metrics,
    ) -> None:
        config = results_kept(config)  # the retrieval tool's results out of the layers' reach
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
        self.kept = kept_originals(config, store)
        self.compactor = Compactor(
            self.sessions,
            self.limits,
            self.prepared,
            self.calibration,
            max_branches=config.store.max_branches,
            exact_counts=ExactCounts(client, self.calibration, metrics, max_sessions),
            kept=self.kept,
        )
        # The proxy's own headers stop here.
        sessions = config.sessions
        drop = {sessions.header, sessions.policy_header, sessions.shadow_header}
        drop = {name.lower() for name in drop}
        if self.tenants.enforced:
            drop.add(config.auth.header.lower())
        own = frozenset(drop)
        models = ModelLabels(config, self.limits.catalog)
        rounds = (
            None if self.kept is None else RetrievalRounds(self.kept, RetrievalMetrics(metrics))
        )
        self.handlers = [
            Handler(d, config, self.tenants, own, client, self.compactor, metrics, models, rounds)
            for d in DIALECTS
        ]
        self.passthrough = Passthrough(config, self.tenants, client, metrics, own)
        self.litellm = litellm_transport.register(client, config, policies.HEADINGS)
        responses = next(h for h in self.handlers if isinstance(h.dialect, Responses))
        self.provider_compaction = ProviderCompaction(
            config,
            self.tenants,
            responses,
            self.passthrough.relay,
            ProviderSummaries(summarizers, self.prepared.hooks, self.limits),
            metrics,
        )
        self.gate = Gate(
            config.listen.max_concurrent_requests,
            metrics,
            lambda scope, error: error_shape(scope["path"], scope["headers"]).error_response(error),
        )
        self.probes = Probes(store, self.limits, self.gate, metrics)


def kept_originals(config: Config, store: SessionStore) -> KeptOriginals | None:
    """The sessions' kept originals, when a policy has the retrieval tool (else none kept)."""
    if not any(policy.retrieval.enabled for policy in config.policies.values()):
        return None
    limits = config.store.originals
    return KeptOriginals(store.originals(limits), limits)


def create_app(
    config: Config,
    *,
    store: SessionStore | None = None,
    client: UpstreamClient | None = None,
    metrics: Metrics | None = None,
    freeze_heap: bool = False,
    worker: Worker | None = None,
) -> Starlette:
    """Build the app. Parts not given are made from the config and closed on shutdown.
    `freeze_heap` is for the process that serves the app, not for one that builds many;
    `worker` for one of several serving one listener (its /metrics shows them all)."""
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
    siblings = WorkerMetrics(metrics, worker) if worker is not None else None
    if siblings is not None:
        proxy.probes.exposition = siblings.render

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
        if siblings is not None:
            await siblings.start()
        yield
        if siblings is not None:
            await siblings.close()
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
        path: str, endpoint: Endpoint, methods: list[str], shape: Dialect | Shape = by_request
    ) -> Route:
        app = WatchedEndpoint(guarded(endpoint, metrics, shape), metrics)
        if methods == ["POST"]:
            posts[path] = app
        return Route(path, app, methods=methods)

    provider_compaction = proxy.provider_compaction
    responses = provider_compaction.dialect
    probes = proxy.probes
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
            route(d.count_path, CountEndpoint(h, d), ["POST"], d)
            for h in proxy.handlers
            if isinstance(d := h.dialect, TokenCounting)
        ),
        *([] if proxy.kept is None else OriginalsAPI(proxy.kept, proxy.tenants, config).routes()),
        route("/v1/{path:path}", proxy.passthrough, ANY, proxy.passthrough.error_shape),
        Route("/healthz", probes.healthz, methods=["GET"]),
        Route("/readyz", probes.readyz, methods=["GET"]),
        Route("/metrics", probes.metrics_endpoint, methods=["GET"]),
        WebSocketRoute("/{path:path}", websocket_refusal(metrics)),
    ]
    if config.listen.websockets:
        sockets = ResponsesSocket(
            responses, proxy.tenants, proxy.gate, metrics, config.listen.websocket_history_bytes
        )
        routes.insert(-1, WebSocketRoute(responses.path, sockets))
    admin = Admin(proxy.sessions.failing_closed())
    routes += admin.routes(config.admin.token) + dashboard_routes(config, admin)
    if not config.admin.token:  # its paths say it is off, and how to turn it on
        routes.append(route("/admin/{path:path}", admin_off, ANY))
    routes.append(route("/{path:path}", not_found, ANY))
    app = ProxyApp(routes, lifespan, proxy.gate, posts)
    app.state.proxy = proxy
    return app


class ProxyApp(Starlette):
    """The routes behind the gate (`proxy.gate`). A POST to an API's path, nearly every
    request, goes straight to its endpoint by one look-up of its path (`FastPath`), inside
    any middleware added to the app (`add_middleware`): Starlette's own two middlewares and
    its router are for the rest (they would only pass such a request on, at a tenth of its
    own work; its endpoint turns every failure into an answer itself, `guarded`)."""

    def __init__(
        self,
        routes: list[BaseRoute],
        lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]],
        gate: Gate,
        posts: dict[str, ASGIApp],
    ) -> None:
        super().__init__(routes=routes, lifespan=lifespan)
        self._gated = gate.around(super().__call__)
        self._posts = posts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._gated(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        """Built at the app's first call (its lifespan's): the middleware added by then, around
        the fast path, around Starlette's own stack (its error page, its router) without that
        middleware. So a failing middleware gets uvicorn's 500, not Starlette's: the same
        plain-text answer."""
        added, self.user_middleware = self.user_middleware, []
        try:
            app: ASGIApp = FastPath(self._posts, super().build_middleware_stack())
        finally:
            self.user_middleware = added
        for cls, args, kwargs in reversed(added):
            app = cls(app, *args, **kwargs)
        return app


class FastPath:
    """An API's POST to its endpoint (`posts`, by path); every other request to `rest`."""

    def __init__(self, posts: dict[str, ASGIApp], rest: ASGIApp) -> None:
        self.posts = posts
        self.rest = rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.posts.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.rest(scope, receive, send)
