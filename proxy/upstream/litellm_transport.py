"""Upstreams of kind litellm: any provider litellm serves, in the client's own API.

The request body, as the request path forwards it in the client's API (chat completions,
Anthropic Messages or the Responses API), becomes the keyword arguments of litellm's interface
for that API (`acompletion`, `anthropic_messages`, `aresponses`: the routes of
`litellm_chat`, `litellm_messages`, `litellm_responses`); the answer goes back in that API,
as one body or as its stream's events relayed one by one as litellm yields them
(`litellm_answers`). Only the API's own fields reach litellm: a client can never set litellm's
arguments (`api_base`, `api_key`, `mock_response`, ...), so requests only go where the config
says.

litellm itself is imported and set up at start-up by `proxy.litellm_setup`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import orjson

from proxy.config import Config, Upstream
from proxy.errors import InvalidRequest, NotFound, UpstreamTimeout
from proxy.upstream.answer import UpstreamResponse
from proxy.upstream.client import UpstreamClient
from proxy.upstream.litellm_answers import (
    JSON_HEADERS,
    Encoder,
    Grammar,
    Streamed,
    Whole,
    aclose,
)
from proxy.upstream.litellm_chat import ChatRoute
from proxy.upstream.litellm_errors import failure
from proxy.upstream.litellm_messages import MessagesRoute
from proxy.upstream.litellm_responses import ResponsesRoute
from proxy.upstream.litellm_setup import (
    check_providers,
    close_clients,
    load_litellm,
    loaded,
    warm_up,
)

log = logging.getLogger("compaction_proxy")


class Route(Protocol):
    """One API through litellm: its fields, its call and how its answers are written."""

    grammar: Grammar
    fields: frozenset[str]  # passed to litellm
    ignored: frozenset[str]  # accepted and left out; any other field is a 400

    def shaped(
        self,
        arguments: dict[str, Any],
        reserved_output: int | None,
        marks: bool,
        headings: tuple[str, ...],
    ) -> dict[str, Any]:
        """The request's fields as litellm is to get them (caps, cache marks)."""
        ...

    def call(self, litellm: Any, arguments: dict[str, Any]) -> Any: ...

    def whole(self, answer: Any) -> bytes: ...

    def encoder(self, stream: Any, arguments: dict[str, Any]) -> Encoder: ...


ROUTES: dict[str, Route] = {
    "/chat/completions": ChatRoute(),
    "/messages": MessagesRoute(),
    "/responses": ResponsesRoute(),
}
# Anthropic's token count: not every provider has one, and litellm's does not take Messages.
_COUNT_PATH = "/messages/count_tokens"


class LiteLLMTransport:
    """`UpstreamClient.open` for upstreams of kind litellm (a `proxy.upstream.Transport`)."""

    def __init__(self, config: Config, headings: tuple[str, ...]) -> None:
        self.config = config
        # How the engine's own messages (summary, digest, anchors) begin: the stable prefix
        # marked for the provider's cache. Given by the caller: transports know no engine.
        self.headings = headings

    def load(self) -> None:
        """Import litellm and check the config's provider models (at start-up)."""
        check_providers(self.config)

    async def warm_up(self) -> None:
        await warm_up(self.config)

    async def close(self) -> None:
        await close_clients()

    async def open(
        self,
        upstream: Upstream,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        *,
        reserved_output: int | None,
    ) -> UpstreamResponse:
        """litellm's answer in the client's API; no client header goes to the provider."""
        route = ROUTES.get(path) if method == "POST" else None
        if route is None:
            # models, embeddings, files, counts...: each provider has its own, or none.
            grammar = MessagesRoute.grammar if path == _COUNT_PATH else ChatRoute.grammar
            served = ", ".join(f"POST /v1{p}" for p in ROUTES)
            return Whole.error(
                NotFound(
                    f"Invalid URL ({method} /v1{path}): upstream {upstream.name!r} is of kind "
                    f"litellm, which serves only {served}"
                ),
                grammar,
            )
        try:
            arguments = self.arguments(route, upstream, body or b"", reserved_output)
        except InvalidRequest as exc:
            return Whole.error(exc, route.grammar)
        litellm = loaded() or await asyncio.to_thread(load_litellm)
        stream = None
        try:
            async with asyncio.timeout(upstream.timeouts.first_byte):
                answer = await route.call(litellm, arguments)
                if not arguments.get("stream"):
                    return Whole(200, route.whole(answer), JSON_HEADERS)
                stream = answer
                first = await anext(stream, None)
        except TimeoutError:
            await aclose(stream)
            seconds = upstream.timeouts.first_byte
            timeout = UpstreamTimeout(
                f"upstream {upstream.name!r} sent no response within {seconds:g} s"
            )
            return Whole.error(timeout, route.grammar)
        except Exception as exc:
            await aclose(stream)
            log.info(
                "provider error", extra={"upstream": upstream.name, "error": type(exc).__name__}
            )
            return Whole.failed(failure(exc, upstream), route.grammar)
        except BaseException:  # cancelled: the client went away
            await aclose(stream)
            raise
        return Streamed(stream, first, route.encoder(stream, arguments), route.grammar, upstream)

    def arguments(
        self, route: Route, upstream: Upstream, body: bytes, reserved_output: int | None
    ) -> dict[str, Any]:
        """The keyword arguments of `route`'s litellm call for a request body."""
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            request = None
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            raise InvalidRequest("The request body must be a JSON object with a model.")
        # The model comes from the route.
        unknown = sorted(request.keys() - route.fields - route.ignored - {"model"})
        if unknown:
            raise InvalidRequest(
                f"Unrecognized request argument supplied: {', '.join(unknown)}", param=unknown[0]
            )
        model = self.config.provider_model(upstream, request["model"])
        # A client that marks its own cache breakpoints keeps them as they are.
        marks = upstream.caches_prompt(model) and b'"cache_control"' not in body
        fields = {k: v for k, v in request.items() if k in route.fields}
        arguments = route.shaped(fields, reserved_output, marks, self.headings)
        timeouts = upstream.timeouts
        return {
            **arguments,
            **upstream.provider_params,
            "model": model,
            "api_key": upstream.api_key,  # None: the provider's own from the environment
            "api_base": upstream.base_url or None,
            "timeout": timeouts.first_byte,
            "num_retries": 0,  # clients retry; the proxy does not multiply their attempts
            "max_retries": 0,
            "drop_params": True,  # what a provider does not support is left out
        }


def register(
    client: UpstreamClient, config: Config, headings: tuple[str, ...]
) -> LiteLLMTransport | None:
    """The transport of kind litellm on `client`, when the config has such an upstream (only
    then is litellm imported)."""
    if not any(u.kind == "litellm" for u in config.upstreams.values()):
        return None
    transport = client.transports["litellm"] = LiteLLMTransport(config, headings)
    return transport
