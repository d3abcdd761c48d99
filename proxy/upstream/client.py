"""The client towards the configured upstreams: HTTP (proxy.upstream.pool) and the transports of
other kinds (litellm), with the timeouts and retries of proxy.retries.

Bodies are relayed as bytes: no decompression, no redirects, and the URL is always the
configured upstream's, whatever the client sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from proxy.config import Upstream
from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.observability.metrics import Metrics
from proxy.upstream.answer import ERROR_BYTES, UpstreamResponse, read_bounded
from proxy.upstream.connect import ConnectFailed, ConnectTimeout
from proxy.upstream.http1 import Disconnected, HTTPError
from proxy.upstream.pool import FRAMING, HOP_BY_HOP, Pool, Progress
from proxy.upstream.retries import RETRY_STATUSES, Retries, is_quota_error, retry_after

log = logging.getLogger("compaction_proxy")

# Where clients put their upstream credential: OpenAI, Azure, Anthropic.
CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


def credential_header(upstream: Upstream) -> tuple[str, str] | None:
    """The header that carries the upstream's own key, in its kind's form."""
    if not upstream.api_key:
        return None
    if upstream.kind == "anthropic":
        return ("x-api-key", upstream.api_key)
    return ("Authorization", f"Bearer {upstream.api_key}")


def relayable(
    headers: Iterable[tuple[str, str]], drop: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """Headers minus hop-by-hop ones (and those the Connection header names) and `drop`."""
    skip = _skipped(drop)
    kept: list[tuple[str, str]] = []
    named: set[str] = set()  # by the Connection header(s): they speak for one connection
    for pair in headers:
        name = pair[0].lower()
        if name == "connection":
            named.update(token.strip().lower() for token in pair[1].split(","))
        elif name not in skip:
            kept.append(pair)
    if named:
        kept = [pair for pair in kept if pair[0].lower() not in named]
    return kept


@functools.cache
def _skipped(drop: frozenset[str]) -> frozenset[str]:
    """What `relayable` leaves out whatever the Connection header says (a handful of sets)."""
    return HOP_BY_HOP | FRAMING | drop


class Transport(Protocol):
    """Carries the requests to upstreams of one kind by other means than HTTP relaying."""

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
    ) -> UpstreamResponse: ...


class BufferedResponse:
    """An answer already read whole: an error the proxy read to decide against a retry."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._status = status
        self._headers = headers
        self._body = body

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> list[tuple[str, str]]:
        return self._headers

    async def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class _Again:
    """An attempt to be made again after `wait` seconds."""

    reason: str  # the metric's label
    wait: float


class UpstreamClient:
    """A pool of connections per HTTP upstream (proxy.upstream.pool), and the transports of other
    kinds. No credential is kept from one request for the next."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._pools: dict[str, Pool] = {}
        # By upstream kind: litellm (proxy.litellm_transport), registered by the app.
        self.transports: dict[str, Transport] = {}

    def pool(self, upstream: Upstream) -> Pool:
        pool = self._pools.get(upstream.name)
        if pool is None:
            pool = Pool(
                upstream.base_url,
                upstream.max_connections,
                upstream.timeouts.connect,
                proxy=upstream.proxy,
            )
            self._pools[upstream.name] = pool
        return pool

    async def close(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()

    async def open(
        self,
        upstream: Upstream,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        *,
        reserved_output: int | None = None,
        retries: int | None = None,
    ) -> UpstreamResponse:
        """Send a request and wait for the response head (the first byte), within the timeouts,
        trying again over HTTP as proxy.retries allows (`retries`: the upstream's own by
        default).

        `path` is relative to the upstream's base URL (the part after `/v1`), as the client
        encoded it (not quoted again).
        `reserved_output` is the output the proxy reserved in the window for a request that
        sets no max_tokens: transports whose providers require a cap send it.
        """
        transport = self.transports.get(upstream.kind)
        if transport is not None:
            return await transport.open(
                upstream, method, path, query, headers, body, reserved_output=reserved_output
            )
        target = path + (f"?{query}" if query else "")
        own = credential_header(upstream)
        if own is not None:
            # The upstream's key replaces whatever credential the client sent, in any header.
            headers = [(n, v) for n, v in headers if n.lower() not in CREDENTIAL_HEADERS]
            headers.append(own)
        first_byte = upstream.timeouts.first_byte
        budget = Retries(
            upstream.retries if retries is None else retries, time.monotonic() + first_byte
        )
        progress = Progress()
        try:
            async with asyncio.timeout(first_byte):
                while True:
                    progress = Progress()
                    outcome = await self._attempt(
                        upstream, method, target, headers, body, progress, budget
                    )
                    if not isinstance(outcome, _Again):
                        return outcome
                    self.metrics.upstream_retries.labels(upstream.name, outcome.reason).inc()
                    log.info(
                        "upstream retried",
                        extra={"upstream": upstream.name, "reason": outcome.reason},
                    )
                    await asyncio.sleep(outcome.wait)
        except TimeoutError:
            raise self._timeout(upstream, progress.phase, first_byte) from None

    async def _attempt(
        self,
        upstream: Upstream,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        progress: Progress,
        budget: Retries,
    ) -> UpstreamResponse | _Again:
        """One attempt: its answer, or when to try again; raises the client's error when the
        request failed for good."""
        try:
            response = await self.pool(upstream).request(method, target, headers, body, progress)
        except ConnectTimeout:
            wait = budget.wait()
            if wait is None:
                raise self._timeout(upstream, "connect", upstream.timeouts.connect) from None
            return _Again("connect", wait)
        except ConnectFailed as exc:
            # Refused, unresolvable, refused by the egress proxy: the request never left.
            wait = None if exc.lasting else budget.wait()
            if wait is None:
                raise self._unreachable(upstream, exc, budget) from None
            return _Again("connect", wait)
        except Disconnected as exc:
            # On a pooled connection with no byte of an answer, the upstream had closed it as
            # the request went out. Otherwise it may have run the request: never twice.
            stale = progress.reused and not exc.answer_begun
            wait = budget.wait() if stale else None
            if wait is None:
                raise self._unreachable(upstream, exc, budget) from None
            return _Again("stale_connection", wait)
        except (HTTPError, OSError, ValueError) as exc:
            raise self._unreachable(upstream, exc, budget) from None
        if response.status not in RETRY_STATUSES or budget.left <= 0:
            return response
        payload = await read_bounded(response, upstream.timeouts.stream_idle, ERROR_BYTES)
        if not isinstance(payload, bytes):
            return payload  # no error this large is the upstream's "not now": relayed
        response.release()
        wait = None
        if not (response.status == 429 and is_quota_error(payload)):
            wait = budget.wait(retry_after(response.headers))
        if wait is None:
            return BufferedResponse(response.status, response.headers, payload)
        return _Again(f"status_{response.status}", wait)

    def _timeout(self, upstream: Upstream, phase: str, seconds: float) -> UpstreamTimeout:
        self.metrics.upstream_timeouts.labels(upstream.name, phase).inc()
        name = upstream.name
        if phase == "connect":
            what = f"no connection accepted within {seconds:g} s (timeouts.connect)"
        elif phase == "pool":
            what = (
                f"no free connection within {seconds:g} s (all {upstream.max_connections} in use;"
                " timeouts.first_byte)"
            )
        else:
            what = f"no response head within {seconds:g} s (timeouts.first_byte)"
        return UpstreamTimeout.in_phase(name, phase, what)

    def _unreachable(
        self, upstream: Upstream, exc: BaseException, budget: Retries
    ) -> UpstreamUnreachable:
        self.metrics.upstream_errors.labels(upstream.name, "unreachable").inc()
        tries = f" ({budget.done + 1} attempts)" if budget.done else ""
        # The client's errors say what went wrong in words, without naming the host (an OS
        # error's message may): the transport's errors are written so.
        why = str(exc) if isinstance(exc, HTTPError) else type(exc).__name__
        return UpstreamUnreachable(f"upstream {upstream.name!r} is unreachable: {why}{tries}")
