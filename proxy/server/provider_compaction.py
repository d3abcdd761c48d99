"""Provider compaction of the Responses API: relayed to the upstream, or served by the proxy.

`POST /v1/responses/compact` and a `compaction_trigger` item (the last of a `/v1/responses`
input) ask the provider to compact a conversation into an opaque `compaction` item. Under the
default policy (`provider_compaction: relay`) both go to the upstream. Under `serve` (for
upstreams that lack it: local servers) the proxy answers them itself, as the API would
(`dialects.openai.responses_answers`), with a summary of the conversation
(`compaction.provider_summaries`) in a `compaction` item of its own
(`dialects.openai.responses_compaction`).

Whatever the policy, an item of the proxy's that comes back in a request is expanded into its
summary message before the request goes on (to the request path, or relayed), so that no
upstream ever receives an item it cannot read. A body without one goes on as received. Under
shadow mode both are relayed (the client gets what the upstream answers), but the proxy's
items are still expanded: no upstream can read them.

A relayed compact goes to the upstream that the body's model routes to, as `/v1/responses`
does; so it needs a body the proxy can read (else a 400 naming what is wrong).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message

from proxy.compaction.forward import SHADOW_HEADER, shown_action
from proxy.compaction.provider_summaries import ProviderSummaries
from proxy.config import Config, NoRoute, Policy, Upstream
from proxy.dialects import Dialect
from proxy.dialects.json_checks import load_object, optional_bool
from proxy.dialects.openai import responses_answers as answers
from proxy.dialects.openai.responses import (
    COMPACTION_TRIGGER,
    HELD_UPSTREAM,
    Responses,
    input_items,
)
from proxy.dialects.openai.responses_compaction import CompactionSeal, expand, is_proxy_item
from proxy.dialects.openai.responses_prescan import Prescan
from proxy.errors import InvalidRequest
from proxy.observability.metrics import Metrics, RequestLabels
from proxy.server.handler import SSE_HEADERS, Handler
from proxy.server.incoming import IncomingRequest, read_body
from proxy.server.tenants import Tenants

log = logging.getLogger("compaction_proxy")

Headers = list[tuple[str, str]]
# Forwards a request (its body read) to a path of an upstream, with headers of the proxy's
# own added to the answer, and relays the answer.
Relayer = Callable[[Request, Upstream, str, bytes, Headers], Awaitable[ASGIApp]]
COMPACT_PATH = "/v1/responses/compact"
_UPSTREAM_COMPACT_PATH = COMPACT_PATH.removeprefix("/v1")
TRIGGER = COMPACTION_TRIGGER
ACTION = "provider_compaction"  # the x-compaction-action of a provider compaction


class ProviderCompaction:
    """`POST /v1/responses` in front of its handler, and `POST /v1/responses/compact`."""

    def __init__(
        self,
        config: Config,
        tenants: Tenants,
        handler: Handler,
        relay: Relayer,
        summaries: ProviderSummaries,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.handler = handler
        self.dialect: Dialect = handler.dialect
        assert isinstance(self.dialect, Responses)
        self.prescan = Prescan(self.dialect.known.bodies)
        self.relay = relay
        self.summaries = summaries
        self.metrics = metrics
        key = config.compaction_items.signing_key
        if key is None and any(p.provider_compaction == "serve" for p in config.policies.values()):
            log.warning(
                "compaction_items.signing_key is not set: the compaction items this proxy"
                " issues are valid only until it restarts, and only at this replica"
            )
        self.seal = CompactionSeal(key.encode() if key else os.urandom(32))

    async def responses(self, request: Request) -> ASGIApp:
        """`POST /v1/responses`: the proxy's items expanded, a trigger served under `serve`;
        then the request path, with the body as received when nothing was expanded."""
        raw = await read_body(request, self.config.listen.max_body_bytes)
        found = self.prescan.scan(raw)
        if found.holds:
            try:
                routed = self._routed(request, raw)
            except InvalidRequest:
                routed = None  # the request path says what is wrong with the body
            if routed is not None:
                read = self._expanded(routed)
                triggers = [i for i, item in enumerate(read.items) if _is_trigger(item)]
                if triggers and read.serves:
                    if triggers != [len(read.items) - 1]:
                        raise InvalidRequest(
                            f"A {TRIGGER} item must be the final input item.",
                            param=f"input[{triggers[0]}]",
                        )
                    served = await self._serve(request, read, read.items[:-1])
                    return self._triggered(read.body, served)
                raw = read.raw
        answer = await self.handler(_replayed(request, raw))
        self.prescan.read(raw, found)
        return answer

    async def compact(self, request: Request) -> ASGIApp:
        """`POST /v1/responses/compact`: served under `serve`, else relayed (the proxy's items
        expanded) to the upstream the body's model routes to."""
        raw = await read_body(request, self.config.listen.max_body_bytes)
        read = self._expanded(self._routed(request, raw))
        if not read.serves:
            # The upstream compacts: the proxy changed nothing. Under shadow mode the headers
            # say what it would have done.
            would = ACTION if read.policy.provider_compaction == "serve" else "none"
            own = self._session(request, read)
            own.append(("x-compaction-action", shown_action(would, shadow=read.shadow)))
            own += [SHADOW_HEADER] if read.shadow else []
            return await self.relay(request, read.upstream, _UPSTREAM_COMPACT_PATH, read.raw, own)
        served = await self._serve(request, read, read.items)
        self._count("compact", served)
        answer = answers.compacted(input_items(read.body.get("input")), served.item, served.usage)
        return Response(answer, media_type="application/json", headers=served.headers)

    def _routed(self, request: Request, raw: bytes) -> _Read:
        """The body read and routed, or OpenAI's 400 naming what is wrong with it."""
        headers = request.headers
        tenant = self.tenants.tenant(headers)
        body = load_object(raw)
        items = input_items(body.get("input"))
        try:
            policy, upstream = self.config.route(
                self.dialect.name, body["model"], headers.get(self.config.sessions.policy_header)
            )
        except NoRoute as exc:
            raise InvalidRequest(str(exc), param="model") from None
        shadow = self.handler.shadow(headers.get(self.config.sessions.shadow_header), policy)
        return _Read(raw, body, items, tenant, policy, upstream, shadow)

    def _session(self, request: Request, read: _Read) -> Headers:
        """The session header of a compact relayed, as its `/v1/responses` turns have it;
        none when the proxy cannot read its history (the upstream judges it)."""
        try:
            parsed = self.dialect.parse(read.raw)
        except InvalidRequest:
            return []
        key = self.handler.client_request(request.headers, read.tenant, parsed).key
        return [("x-compaction-session", key)]

    def _owner(self, read: _Read) -> str:
        """Whom an item is bound to: the inbound key's id where `auth.keys` names callers (an
        identity that outlives a rotated credential); else no one but the signing key, since
        a credential's hash changes with every rotated key or refreshed token, and an item
        that no longer opens would end the conversation that holds it."""
        return read.tenant if self.tenants.enforced else ""

    def _expanded(self, read: _Read) -> _Read:
        """`read` with the proxy's items expanded (itself when there is none)."""
        opened = functools.partial(self.seal.open, self._owner(read))
        role = read.policy.compaction.summary_role
        expanded = expand(read.items, opened, self.dialect.summary_items, role)
        if expanded is None:
            return read
        self.metrics.compaction_items_expanded.inc(sum(map(is_proxy_item, read.items)))
        log.debug("compaction items of the proxy expanded", extra={"api": self.dialect.name})
        raw = orjson.dumps({**read.body, "input": expanded})
        return dataclasses.replace(read, raw=raw, items=expanded)

    async def _serve(self, request: Request, read: _Read, items: list[Any]) -> _Served:
        """The proxy's compaction of `items`: their summary in a compaction item of its own."""
        held = next((k for k in HELD_UPSTREAM if read.body.get(k)), None)
        if held is not None:
            raise InvalidRequest(
                "This proxy compacts only the history given in input, not one held upstream"
                f" ({held}): send the whole history in input.",
                param=held,
            )
        if not items:
            raise InvalidRequest(
                "There is no history to compact: input holds no item"
                + (f" before the {TRIGGER} item." if read.items else "."),
                param="input",
            )
        parsed = self.dialect.parse(orjson.dumps({**read.body, "input": items}))
        client_request = self.handler.client_request(request.headers, read.tenant, parsed)
        made = await self.summaries.summarize(client_request)
        content = self.seal.seal(self._owner(read), made.summary)
        return _Served(
            answers.compaction_item(content),
            made.summary.kind,
            client_request.key,
            made.tokens_before,
            made.tokens_after,
            self.handler.labels(client_request),
        )

    def _triggered(self, body: dict[str, Any], served: _Served) -> Response:
        """The answer to a `compaction_trigger`: a completed response whose one output item is
        the compaction item, streamed when the request streams."""
        self._count("trigger", served)
        response = answers.completed(body, [served.item], served.usage)
        if not optional_bool(body, "stream"):
            json = orjson.dumps(response)
            return Response(json, media_type="application/json", headers=served.headers)
        headers = dict(SSE_HEADERS) | served.headers
        return Response(answers.events(response), media_type="text/event-stream", headers=headers)

    def _count(self, via: str, served: _Served) -> None:
        self.metrics.answered("provider_compaction", 200, served.labels)
        self.metrics.provider_compactions.labels(via, served.kind).inc()
        log.info(
            "provider compaction served",
            extra={"api": self.dialect.name, "via": via, "summary": served.kind},
        )


@dataclasses.dataclass(frozen=True)
class _Read:
    """A Responses body routed (its policy, its upstream, whether under shadow mode); once
    `_expanded`, with the proxy's items expanded (`raw` says so in bytes: the body as
    received when there was none)."""

    raw: bytes
    body: dict[str, Any]
    items: list[Any]
    tenant: str
    policy: Policy
    upstream: Upstream
    shadow: bool

    @property
    def serves(self) -> bool:
        """Whether the proxy answers a provider compaction itself: under `serve`, but not
        under shadow mode (which never changes what the upstream would answer)."""
        return self.policy.provider_compaction == "serve" and not self.shadow


@dataclasses.dataclass(frozen=True)
class _Served:
    """A compaction the proxy made: its item, what stands for the history (llm, digest), and
    the proxy's own token counts (no upstream counted this answer)."""

    item: dict[str, Any]
    kind: str
    session: str  # the x-compaction-session key
    input_tokens: int
    output_tokens: int
    labels: RequestLabels  # those of the request's metrics

    @property
    def usage(self) -> dict[str, Any]:
        return answers.usage(self.input_tokens, self.output_tokens)

    @property
    def headers(self) -> dict[str, str]:
        return {
            "x-compaction-session": self.session,
            "x-compaction-action": ACTION,
            "x-compaction-summary-kind": self.kind,
            # The history's tokens, and the summary's that stands for it from now on.
            "x-compaction-tokens-before": str(self.input_tokens),
            "x-compaction-tokens-after": str(self.output_tokens),
        }


def _is_trigger(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == TRIGGER


def _replayed(request: Request, body: bytes) -> Request:
    """`request` with `body` as its body (read once already, and decoded: its
    Content-Encoding goes): what comes after the body (the client's disconnect) is still
    received from the client."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await request.receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() != b"content-encoding"]
    return IncomingRequest({**request.scope, "headers": headers}, receive)
