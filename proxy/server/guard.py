"""Every failure of an endpoint becomes a clear error in its API's shape: never a traceback.

A failure the proxy did not foresee is a 500 whose log line says where it happened (the
exception's class and frames), never what it said: an exception's message may quote the
request.
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp

from proxy.dialects import Dialect
from proxy.dialects.openai.chat import Chat
from proxy.errors import APIError, StreamBroken, UpstreamUnreachable
from proxy.observability.logs import failure
from proxy.observability.metrics import Metrics
from proxy.server.disconnects import Endpoint, client_gone

log = logging.getLogger("compaction_proxy")

# The proxy's own errors outside any wire format's path (passthrough, 404) use OpenAI's shape.
OPENAI = Chat()


def guarded(endpoint: Endpoint, metrics: Metrics, dialect: Dialect = OPENAI) -> Endpoint:
    """`endpoint`, its every failure answered in `dialect`'s error shape."""

    async def guarded_endpoint(request: Request) -> ASGIApp:
        try:
            return await endpoint(request)
        except APIError as exc:
            refused(metrics, dialect, exc)
            return dialect.error_response(exc)
        except ClientDisconnect:
            return client_gone(metrics)
        except StreamBroken:
            broken = UpstreamUnreachable("the upstream broke off its answer")
            metrics.refused("error", broken)
            return dialect.error_response(broken)
        except Exception as exc:
            log.error("unexpected error", extra={"api": dialect.name, **failure(exc)})
            metrics.answered("error", 500)
            return dialect.error_response(APIError("The proxy failed to handle this request."))

    return guarded_endpoint


def refused(metrics: Metrics, dialect: Dialect, error: APIError) -> None:
    """An error of the proxy's own, counted and logged: its own words only (never a
    message's text, never a credential)."""
    metrics.refused("error", error)
    log.log(
        logging.WARNING if error.status_code >= 500 else logging.INFO,
        "request refused",
        extra={
            "status": error.status_code,
            "code": error.code,
            "api": dialect.name,
            "reason": error.message[:300],
        },
    )
