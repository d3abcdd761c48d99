"""The calls the proxy does not read: any other path below /v1 forwarded untouched, and
relayed back as it comes; any path outside /v1 not found."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp

from proxy.config import Config, Upstream
from proxy.dialects import DIALECTS, Dialect
from proxy.errors import NotFound
from proxy.observability.metrics import UNROUTED, Metrics
from proxy.server.error_shapes import MESSAGES, anthropic_client, error_shape
from proxy.server.incoming import check_path, query_string, read_sent
from proxy.server.relay import Relay
from proxy.server.tenants import Tenants
from proxy.upstream.client import UpstreamClient, relayable


class Passthrough:
    """Forwards a request to an upstream, and relays its answer."""

    def __init__(
        self,
        config: Config,
        tenants: Tenants,
        client: UpstreamClient,
        metrics: Metrics,
        drop: frozenset[str],
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.client = client
        self.metrics = metrics
        self.drop = drop  # the proxy's own headers: they stop here
        defaults = (config.default_upstream_for(d.name) for d in DIALECTS)
        self._default = config.upstreams[next(n for n in defaults if n)]
        messages = config.default_upstream_for("messages")
        anthropic = config.upstreams.get(messages or "")
        self._anthropic = (
            anthropic if anthropic is not None and anthropic.serves("messages") else None
        )

    async def __call__(self, request: Request) -> ASGIApp:
        """Any other /v1/* call: forwarded untouched to the default upstream (of chat
        completions when defaults are set per API), or to the default Anthropic Messages
        upstream when it comes from an Anthropic client (every call of the Anthropic API
        carries an `anthropic-version` header)."""
        self.tenants.tenant(request.headers)
        upstream = self._upstream_for(request)
        body = await read_sent(request, self.config.listen.max_body_bytes)
        return await self.relay(request, upstream, _relative_path(request), body, [])

    def _upstream_for(self, request: Request) -> Upstream:
        if self._anthropic is not None and anthropic_client(request.headers.raw):
            return self._anthropic  # an Anthropic client's call: count_tokens, models
        return self._default

    def error_shape(self, request: Request) -> Dialect:
        """The proxy's own errors in the shape of the API the call is for: Anthropic's for an
        Anthropic client's call or one to an Anthropic upstream, else OpenAI's."""
        if self._upstream_for(request).kind == "anthropic":
            return MESSAGES
        return error_shape(request.url.path, request.headers.raw)

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
        headers = relayable(request.headers.items(), self.drop)
        response = await self.client.open(
            upstream, request.method, path, query_string(request), headers, body or None
        )
        routed = UNROUTED._replace(upstream=upstream.name)
        self.metrics.answered("passthrough", response.status, routed)

        def on_end(head: bytes, tail: bytes, outcome: str) -> None:
            response.release() if outcome == "complete" else response.close()

        chunks = response.chunks(upstream.timeouts.stream_idle)
        return Relay(response.status, relayable(response.headers) + own_headers, chunks, on_end)


def _relative_path(request: Request) -> str:
    """The request's path below /v1, still percent-encoded as the client sent it, so that it
    stays below the upstream's base URL (`check_path`)."""
    check_path(request)
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    return raw.decode("latin-1").partition("?")[0].removeprefix("/v1")


async def not_found(request: Request) -> ASGIApp:
    """Any path outside /v1 but the proxy's own."""
    raise NotFound(f"Invalid URL ({request.method} {request.url.path})")
