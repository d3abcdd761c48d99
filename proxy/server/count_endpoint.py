"""An API's own count of a prompt (Anthropic's count_tokens), for what the proxy would send."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp

from proxy.compaction.forward import SHADOW_HEADER, shown_action
from proxy.dialects import TokenCounting
from proxy.server.handler import Handler
from proxy.server.incoming import query_string, read_body
from proxy.server.relay import relayed, whole_response
from proxy.upstream.answer import Unread, read_bounded
from proxy.upstream.client import relayable


class CountEndpoint:
    """The count endpoint of a dialect that has one, beside its handler's request path."""

    def __init__(self, handler: Handler, counting: TokenCounting) -> None:
        self.handler = handler
        self.counting = counting

    async def __call__(self, request: Request) -> ASGIApp:
        """The API's own count of a prompt (Anthropic's count_tokens) for what would be sent:
        the session's view when the client names its session and the session has a plan for
        this history, else the request as it is. Nothing is compacted or stored."""
        handler, counting = self.handler, self.counting
        headers = request.headers
        tenant = handler.tenants.tenant(headers)
        raw = await read_body(request, handler.config.listen.max_body_bytes)
        parsed = counting.parse(raw)
        client_request = handler.client_request(headers, tenant, parsed)
        body, action = raw, "none"
        if headers.get(handler.config.sessions.header) or counting.session_hint(headers, parsed):
            entries = await handler.compactor.view(client_request)
            if entries is not None:
                action = "replayed"
                # Under shadow mode the client's request is what goes upstream: count it.
                if not client_request.shadow:
                    body = counting.render(parsed, entries)
        upstream = client_request.upstream
        path = counting.count_upstream_path
        query = query_string(request)
        send_headers = list(client_request.headers)
        response = await handler.client.open(upstream, "POST", path, query, send_headers, body)
        idle = upstream.timeouts.stream_idle
        payload = await read_bounded(response, idle, upstream.max_answer_bytes)
        route = f"{counting.name}_count"
        handler.metrics.answered(route, response.status, handler.labels(client_request))
        shadow = client_request.shadow
        own = [
            ("x-compaction-session", client_request.key),
            ("x-compaction-action", shown_action(action, shadow=shadow)),
            *([SHADOW_HEADER] if shadow else []),
        ]
        answered = relayable(response.headers) + own
        if isinstance(payload, Unread):
            return relayed(payload, answered, payload.chunks(idle))
        response.release()
        return whole_response(payload, response.status, answered)
