"""Every failure of an endpoint becomes a clear error in its API's shape: never a traceback.

A failure the proxy did not foresee is a 500 whose log line says where it happened (the
exception's class and frames), never what it said: an exception's message may quote the
request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp

from proxy.dialects import Dialect
from proxy.errors import APIError, StreamBroken, UpstreamUnreachable
from proxy.observability.logs import failure
from proxy.observability.metrics import Metrics
from proxy.server.disconnects import Endpoint, client_gone
from proxy.server.error_shapes import error_shape

log = logging.getLogger("compaction_proxy")

# The API whose error shape a request's failure takes, when its endpoint is no API's own.
Shape = Callable[[Request], Dialect]


def by_request(request: Request) -> Dialect:
    """The error shape of the request's path, else of its client (`error_shapes`)."""
    return error_shape(request.url.path, request.headers.raw)


def guarded(endpoint: Endpoint, metrics: Metrics, shape: Dialect | Shape = by_request) -> Endpoint:
    """`endpoint`, its every failure answered in the error shape of `shape` (an API, or the
    API chosen for the request)."""

    def shape_of(request: Request) -> Dialect:  # chosen on a failure only
        return shape if isinstance(shape, Dialect) else shape(request)

    async def guarded_endpoint(request: Request) -> ASGIApp:
        try:
            return await endpoint(request)
        except APIError as exc:
            dialect = shape_of(request)
            refused(metrics, dialect, exc)
            return dialect.error_response(exc)
        except ClientDisconnect:
            return client_gone(metrics)
        except StreamBroken:
            broken = UpstreamUnreachable("the upstream broke off its answer")
            metrics.refused("error", broken)
            return shape_of(request).error_response(broken)
        except Exception as exc:
            dialect = shape_of(request)
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
