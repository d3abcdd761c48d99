"""WebSocket upgrades the proxy does not serve: every path but the Responses API's
(`server.responses_socket`), and that one too under `listen.websockets: false`.

Codex CLI tries a WebSocket on /v1/responses first. It falls back to HTTP at once only when
the upgrade is answered 426 Upgrade Required; any other refusal (a 403, a closed socket) it
retries, about five times and seven seconds, before it does. So such an upgrade gets an HTTP
answer: 426 with an error in OpenAI's shape, and no `Upgrade` header (no protocol it could
switch to would do).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.websockets import WebSocket

from proxy.errors import UpgradeRequired
from proxy.observability.metrics import Metrics
from proxy.server.error_shapes import OPENAI

log = logging.getLogger("compaction_proxy")

REFUSAL = UpgradeRequired(
    "This proxy takes no WebSocket here: send the request over HTTP (it serves one at"
    " /v1/responses only, unless listen.websockets is false)."
)


def websocket_refusal(metrics: Metrics) -> Callable[[WebSocket], Awaitable[None]]:
    """The endpoint of every WebSocket path the proxy does not serve: the upgrade answered
    426, counted and logged (its path, never its headers)."""

    async def refuse(websocket: WebSocket) -> None:
        metrics.refused("error", REFUSAL)
        log.info(
            "websocket upgrade refused",
            extra={"status": REFUSAL.status_code, "code": REFUSAL.code, "path": websocket.url.path},
        )
        await websocket.send_denial_response(OPENAI.error_response(REFUSAL))

    return refuse
