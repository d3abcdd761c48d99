"""Provider compaction of the Responses API: relayed to the upstream, or served by the proxy.

`POST /v1/responses/compact` and a `compaction_trigger` item (the last of a `/v1/responses`
input) ask the provider to compact a conversation into an opaque `compaction` item. Under the
default policy (`provider_compaction: relay`) both go to the upstream. Under `serve` (for
upstreams that lack it: local servers) the proxy answers them itself, with a summary of the
conversation (the policy's summarizer; the mechanical digest when it fails) in a `compaction`
item of its own (`dialects.responses_compaction`).

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
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message

import policies
from policies import Summary, SummaryRequest
from proxy.compaction.compactor import SHADOW_HEADER, shown_action
from proxy.compaction.hooks import Hooks
from proxy.compaction.summarizer import Summarizers
from proxy.compaction.turn import ClientRequest, Turn
from proxy.config import Config, NoRoute, Policy, Upstream
from proxy.dialects import Dialect
from proxy.dialects.json_checks import invalid_type, load_object
from proxy.dialects.openai.responses import HELD_UPSTREAM
from proxy.dialects.openai.responses_compaction import MARKER, CompactionSeal, expand, is_proxy_item
from proxy.dialects.openai.responses_items import item_type
from proxy.errors import InvalidRequest, SummaryFailed
from proxy.models.limits import ModelLimits
from proxy.observability.metrics import Metrics, RequestLabels
from proxy.server.handler import SSE_HEADERS, Handler
from proxy.server.incoming import IncomingRequest, read_body
from proxy.server.tenants import Tenants
from proxy.sessions.sessions import Loaded
from proxy.sessions.state import SessionState

log = logging.getLogger("compaction_proxy")

Headers = list[tuple[str, str]]
# Forwards a request (its body read) to a path of an upstream, with headers of the proxy's
# own added to the answer, and relays the answer.
Relayer = Callable[[Request, Upstream, str, bytes, Headers], Awaitable[ASGIApp]]
COMPACT_PATH = "/v1/responses/compact"
_UPSTREAM_COMPACT_PATH = COMPACT_PATH.removeprefix("/v1")
TRIGGER = "compaction_trigger"
ACTION = "provider_compaction"  # the x-compaction-action of a provider compaction
_SHADOWED = [("x-compaction-action", shown_action(ACTION, shadow=True)), SHADOW_HEADER]
# One scan of a body tells that it holds no compaction or compaction_trigger item (both
# types start so); only then the two longer, slower ones. A JSON string may spell any of
# its characters as a \u escape, so a body that spells a printable ASCII character so (all
# the markers' are) is always read. Escaped non-ASCII text (Python's json.dumps writes
# all of it so) is not: that would parse every such body twice. (A regex: ~0.1 ms on
# 400 KB of plain text, ~0.35 ms on 700 KB of escaped CJK text.)
_ITEMS = b'"compaction'
_TRIGGER = b'"' + TRIGGER.encode() + b'"'
_ESCAPE = re.compile(rb"\\u00[2-7][0-9A-Fa-f]")
MIN_SUMMARY_TOKENS = 256  # a summary cap below this says too little to go on from


class ProviderCompaction:
    """`POST /v1/responses` in front of its handler, and `POST /v1/responses/compact`."""

    def __init__(
        self,
        config: Config,
        tenants: Tenants,
        handler: Handler,
        relay: Relayer,
        summarizers: Summarizers,
        hooks: Hooks,
        limits: ModelLimits,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.handler = handler
        self.dialect: Dialect = handler.dialect
        self.relay = relay
        self.summarizers = summarizers
        self.hooks = hooks
        self.limits = limits
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
        if may_hold_items(raw):
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
        return await self.handler(_replayed(request, raw))

    async def compact(self, request: Request) -> ASGIApp:
        """`POST /v1/responses/compact`: served under `serve`, else relayed (the proxy's items
        expanded) to the upstream the body's model routes to."""
        raw = await read_body(request, self.config.listen.max_body_bytes)
        read = self._expanded(self._routed(request, raw))
        if not read.serves:
            # Under shadow mode the headers say what the proxy would have done.
            own = _SHADOWED if read.shadow and read.policy.provider_compaction == "serve" else []
            return await self.relay(request, read.upstream, _UPSTREAM_COMPACT_PATH, read.raw, own)
        served = await self._serve(request, read, read.items)
        kept = [_user_message(item) for item in _listed(read.body.get("input"))]
        answer = {
            "id": _new_id("resp"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*filter(None, kept), served.item],
            "usage": served.usage,
        }
        self._count("compact", served)
        return Response(orjson.dumps(answer), media_type="application/json", headers=served.headers)

    def _routed(self, request: Request, raw: bytes) -> _Read:
        """The body read and routed, or OpenAI's 400 naming what is wrong with it."""
        headers = request.headers
        tenant = self.tenants.tenant(headers)
        body = load_object(raw)
        given = body.get("input")
        if not isinstance(given, list | str | None):
            raise invalid_type("input", "a string or an array of input items", given)
        try:
            policy, upstream = self.config.route(
                self.dialect.name, body["model"], headers.get(self.config.sessions.policy_header)
            )
        except NoRoute as exc:
            raise InvalidRequest(str(exc), param="model") from None
        shadow = self.handler.shadow(headers.get(self.config.sessions.shadow_header), policy)
        return _Read(raw, body, _listed(given), tenant, policy, upstream, shadow)

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
        """The proxy's compaction of `items`: a summary by the policy's summarizer (the
        pre_compact hook asked first), the mechanical digest when it fails (the answer is
        never lost to a failing summarizer); post_compact told the outcome."""
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
        turn = self._turn(client_request)
        counter = turn.limits.counter
        messages = parsed.messages
        tokens = turn.tokens_before
        cap = _summary_cap(read.policy.compaction, turn.budget, tokens)
        summarizer = self.summarizers.for_request(client_request)
        try:
            if summarizer is None:
                raise SummaryFailed("the credential may pay for no summary")
            hooked = self.hooks.summarizer(turn, summarizer, ahead=False)
            asked = SummaryRequest(None, messages, cap, None, end=len(turn.chain.digests))
            summary = Summary(await hooked(asked), "llm")
        except SummaryFailed as failed:
            log.warning(
                "provider compaction summary failed: the mechanical digest stands in",
                extra={"api": self.dialect.name, "reason": str(failed)},
            )
            text = policies.digest(None, messages, max_tokens=cap, counter=counter)
            summary = Summary(text, "digest")
        content = self.seal.seal(self._owner(read), summary)
        item = {"id": _new_id("cmp"), "type": "compaction", "encrypted_content": content}
        served = _Served(
            item,
            summary.kind,
            client_request.key,
            tokens,
            counter.text(summary.shown),
            self.handler.labels(client_request),
        )
        self._told(turn, served, summary)
        return served

    def _turn(self, request: ClientRequest) -> Turn:
        """The request as the hooks see a compaction's: its history alone, no session state
        (a provider compaction stores none)."""
        limits = self.limits.limits(request.parsed.model, request.upstream)
        counter = limits.counter
        budget = request.policy.compaction.budget(limits.window, limits.max_output, None)
        counts = [counter.message(m) for m in request.messages]
        chain = policies.Chain.of(request.messages)
        loaded = Loaded(SessionState(), 0, "ok")  # no session read: the hooks read none
        return Turn(request, limits, budget, 0, counts, chain, loaded, None)

    def _told(self, turn: Turn, served: _Served, summary: Summary) -> None:
        """post_compact told of a provider compaction: the whole history became the summary."""
        covered = len(turn.chain.digests)
        role = turn.request.policy.compaction.summary_role
        header = policies.header_message(summary, None, role)
        result = policies.Compaction(
            plan=policies.Plan(cut=covered, summary=summary, covered=covered),
            view=[] if header is None else [header],
            decisions=(),
            tokens_before=served.input_tokens,
            tokens_after=served.output_tokens,
            fits=True,
            anchors_complete=True,
            degraded=summary.kind == "digest",
            floor_tokens=0,
        )
        action = "degraded" if result.degraded else "compacted"
        self.hooks.compacted(
            turn, result, action=action, tokens_before=served.input_tokens, reactive=False
        )

    def _triggered(self, body: dict[str, Any], served: _Served) -> Response:
        """The answer to a `compaction_trigger`: a completed response whose one output item is
        the compaction item, streamed when the request streams."""
        item = served.item
        response = {
            "id": _new_id("resp"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata") or {},
            "model": body["model"],
            "output": [item],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "store": body.get("store", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": served.usage,
        }
        self._count("trigger", served)
        headers = served.headers
        if not body.get("stream"):
            return Response(orjson.dumps(response), media_type="application/json", headers=headers)
        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        # As the API streams it: no events between these two, its content only when done.
        opened = {k: v for k, v in item.items() if k != "encrypted_content"}
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": opening}),
            ("response.in_progress", {"response": opening}),
            ("response.output_item.added", {"output_index": 0, "item": opened}),
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": response}),
        ]
        frames = [
            f"event: {kind}\ndata: ".encode()
            + orjson.dumps({"type": kind, "sequence_number": n, **fields})
            + b"\n\n"
            for n, (kind, fields) in enumerate(events)
        ]
        return Response(
            b"".join(frames),
            media_type="text/event-stream",
            headers=dict(SSE_HEADERS) | headers,
        )

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
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }

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


def may_hold_items(raw: bytes) -> bool:
    """Whether a Responses body may hold a compaction_trigger or a proxy's compaction item:
    it holds their markers as such, or a \\u escape of a printable ASCII character (which may
    spell them otherwise)."""
    return (_ITEMS in raw and (MARKER in raw or _TRIGGER in raw)) or _ESCAPE.search(raw) is not None


def _summary_cap(policy: policies.Policy, budget: policies.Budget, tokens: int) -> int:
    """The summary's cap as the policy's summarize layer sets it: a share of what it covers,
    and of the target."""
    params = next(
        (p for name, p in policy.layers if isinstance(p, policies.SummarizeParams)),
        policies.SummarizeParams(),
    )
    target = budget.target_tokens
    cap = min(int(params.input_share * tokens), int(params.target_share * target))
    return max(MIN_SUMMARY_TOKENS, cap)


def _listed(given: Any) -> list[Any]:
    """`input` as a list of items (a string is one user message)."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    return given if isinstance(given, list) else []


def _is_trigger(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == TRIGGER


def _user_message(item: Any) -> dict[str, Any] | None:
    """A user message of the input as the compact endpoint answers it (an item with an id,
    its content as parts); None for every other item."""
    if not (isinstance(item, dict) and item_type(item) == "message" and item.get("role") == "user"):
        return None
    content = item.get("content")
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    message = {"id": _new_id("msg"), "type": "message", "status": "completed", "role": "user"}
    return message | {"content": content}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(16).hex()}"


def _replayed(request: Request, body: bytes) -> Request:
    """`request` with `body` as its body (read once already): what comes after the body (the
    client's disconnect) is still received from the client."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await request.receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return IncomingRequest(request.scope, receive)
