"""The probes: /healthz (the process answers), /readyz (it may be sent requests) and
/metrics (Prometheus's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.models.limits import ModelLimits
from proxy.observability.metrics import CONTENT_TYPE_LATEST, Metrics
from proxy.server.gate import Gate
from proxy.sessions.store import SessionStore


class Probes:
    def __init__(
        self, store: SessionStore, limits: ModelLimits, gate: Gate, metrics: Metrics
    ) -> None:
        self.store = store
        self.limits = limits
        self.gate = gate
        self.metrics = metrics
        # What /metrics shows: this process's series, or every worker's (worker_metrics).
        self.exposition: Callable[[], Awaitable[bytes]] = self._own

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready when the store answers, the tokenizer is loaded and no shutdown has begun."""
        store = await self.store.ping()
        warm = self.limits.warm
        ready = store and warm and not self.gate.draining
        status = "ready" if ready else "draining" if self.gate.draining else "degraded"
        body = {
            "status": status,
            "store": "ok" if store else "unavailable",
            "tokenizer": "loaded" if warm else "loading",
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(await self.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def _own(self) -> bytes:
        return self.metrics.render()
