"""Provider compaction of the Responses API: relayed to the upstream, or served by the proxy.

`POST /v1/responses/compact` and a `compaction_trigger` item (the last of a `/v1/responses`
input) ask the provider to compact a conversation into an opaque `compaction` item. Under the
default policy (`provider_compaction: relay`) both go to the upstream. Under `serve` (for
upstreams that lack it: local servers) the proxy answers them itself, with a summary of the
conversation (the policy's summarizer; the mechanical digest when it fails) in a `compaction`
item of its own (`dialects.responses_compaction`).

Whatever the policy, an item of the proxy's that comes back in a request is expanded into its
summary message before the request goes on (to the request path, or relayed), so that no
upstream ever receives an item it cannot read. A body without one goes on as received.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message

import policies
from policies import Summary, SummaryRequest

from .config import Config, NoRoute, Policy
from .dialects import Dialect
from .dialects.responses import HELD_UPSTREAM
from .dialects.responses_compaction import MARKER, CompactionSeal, expand, is_proxy_item
from .dialects.responses_items import item_type
from .errors import InvalidRequest, SummaryFailed
from .handler import SSE_HEADERS, Handler
from .limits import ModelLimits
from .metrics import Metrics, RequestLabels
from .requests import read_body
from .summarizer import Summarizers
from .tenants import Tenants

log = logging.getLogger("compaction_proxy")

Endpoint = Callable[[Request], Awaitable[ASGIApp]]
COMPACT_PATH = "/v1/responses/compact"
TRIGGER = "compaction_trigger"
# One scan of a body tells that it holds no compaction or compaction_trigger item (both
# types start so); only then the two longer, slower ones.
_ITEMS = b'"compaction'
_TRIGGER = b'"' + TRIGGER.encode() + b'"'
MIN_SUMMARY_TOKENS = 256  # a summary cap below this says too little to go on from


class ProviderCompaction:
    """`POST /v1/responses` in front of its handler, and `POST /v1/responses/compact`."""

    def __init__(
        self,
        config: Config,
        tenants: Tenants,
        handler: Handler,
        passthrough: Endpoint,
        summarizers: Summarizers,
        limits: ModelLimits,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.handler = handler
        self.dialect: Dialect = handler.dialect
        self.passthrough = passthrough
        self.summarizers = summarizers
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
        if _ITEMS in raw and (MARKER in raw or _TRIGGER in raw):
            read = self._read(request, raw)
            if read is not None:
                triggers = [i for i, item in enumerate(read.items) if _is_trigger(item)]
                if triggers and read.policy.provider_compaction == "serve":
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
        """`POST /v1/responses/compact`: served under `serve`, else relayed as every other
        `/v1/*` call is (the proxy's items expanded)."""
        raw = await read_body(request, self.config.listen.max_body_bytes)
        read = self._read(request, raw)
        if read is None or read.policy.provider_compaction != "serve":
            return await self.passthrough(_replayed(request, read.raw if read else raw))
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

    def _read(self, request: Request, raw: bytes) -> _Read | None:
        """The request routed, the proxy's items expanded; None when the body is not one the
        proxy can route (the request path, or the upstream, says what is wrong with it)."""
        tenant = self.tenants.tenant(request.headers)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return None
        given = body.get("input")
        if not isinstance(given, list | str | None):
            return None
        try:
            policy, _ = self.config.route(
                self.dialect.name,
                body["model"],
                request.headers.get(self.config.sessions.policy_header),
            )
        except NoRoute:
            return None
        items = _listed(given)
        opened = functools.partial(self.seal.open, tenant)
        role = policy.compaction.summary_role
        expanded = expand(items, opened, self.dialect.summary_items, role)
        if expanded is None:
            return _Read(raw, body, items, tenant, policy)
        self.metrics.compaction_items_expanded.inc(sum(map(is_proxy_item, items)))
        log.debug("compaction items of the proxy expanded", extra={"api": self.dialect.name})
        return _Read(orjson.dumps({**body, "input": expanded}), body, expanded, tenant, policy)

    async def _serve(self, request: Request, read: _Read, items: list[Any]) -> _Served:
        """The proxy's compaction of `items`: a summary by the policy's summarizer, the
        mechanical digest when it fails (the answer is never lost to a failing summarizer)."""
        held = next((k for k in HELD_UPSTREAM if read.body.get(k)), None)
        if held is not None:
            raise InvalidRequest(
                "This proxy compacts only the history given in input, not one held upstream"
                f" ({held}): send the whole history in input.",
                param=held,
            )
        parsed = self.dialect.parse(orjson.dumps({**read.body, "input": items}))
        client_request = self.handler.client_request(request.headers, read.tenant, parsed)
        limits = self.limits.limits(parsed.model, client_request.upstream)
        counter = limits.counter
        messages = parsed.messages
        tokens = sum(counter.message(m) for m in messages)
        cap = _summary_cap(read.policy.compaction, limits.window, limits.max_output, tokens)
        summarizer = self.summarizers.for_request(client_request)
        try:
            if summarizer is None:
                raise SummaryFailed("the credential may pay for no summary")
            summary = Summary(await summarizer(SummaryRequest(None, messages, cap, None)), "llm")
        except SummaryFailed as failed:
            log.warning(
                "provider compaction summary failed: the mechanical digest stands in",
                extra={"api": self.dialect.name, "reason": str(failed)},
            )
            text = policies.digest(None, messages, max_tokens=cap, counter=counter)
            summary = Summary(text, "digest")
        content = self.seal.seal(read.tenant, summary)
        item = {"id": _new_id("cmp"), "type": "compaction", "encrypted_content": content}
        labels = self.handler.labels(client_request)
        return _Served(item, summary.kind, tokens, counter.text(summary.shown), labels)

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
    """A Responses body routed, with the proxy's items expanded (`raw` says so in bytes: the
    body as received when there was none)."""

    raw: bytes
    body: dict[str, Any]
    items: list[Any]
    tenant: str
    policy: Policy


@dataclasses.dataclass(frozen=True)
class _Served:
    """A compaction the proxy made: its item, what stands for the history (llm, digest), and
    the proxy's own token counts (no upstream counted this answer)."""

    item: dict[str, Any]
    kind: str
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
            "x-compaction-action": "provider_compaction",
            "x-compaction-summary-kind": self.kind,
        }


def _summary_cap(policy: policies.Policy, window: int, max_output: int | None, tokens: int) -> int:
    """The summary's cap as the policy's summarize layer sets it: a share of what it covers,
    and of the target."""
    params = next(
        (p for name, p in policy.layers if isinstance(p, policies.SummarizeParams)),
        policies.SummarizeParams(),
    )
    target = policy.budget(window, max_output, None).target_tokens
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

    return Request(request.scope, receive)
