"""The reactive path: an upstream that said the prompt is over its window, before any byte of
its answer reached the client.

An overflow in a streamed 200 answer (the Responses API's) is read from the stream's first
bytes. The request goes again once, with something changed that can make it pass: compacted
harder, or (when only the output it reserved overflowed, and the policy says so) with a lower
max_tokens; else the upstream's error is relayed as it came, which a client such as Claude
Code reads to lower its max_tokens by itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from proxy.compaction.compactor import Compactor
from proxy.compaction.forward import Forward
from proxy.compaction.turn import ClientRequest
from proxy.config import Upstream
from proxy.dialects import OutputLimits, StreamOverflow
from proxy.errors import ContextLengthExceeded, StreamBroken, UpstreamTimeout, UpstreamUnreachable
from proxy.observability.metrics import Metrics
from proxy.upstream.answer import UpstreamResponse


async def retried(
    compactor: Compactor, request: ClientRequest, forward: Forward, error: bytes
) -> Forward | None:
    """What goes upstream again after it said `forward` overflows its window (`error`, its
    error answer; empty for a stream's): compacted harder, when that makes the prompt smaller;
    else, when only the output the request reserved overflowed and the policy says so, with
    max_tokens lowered to what the window leaves; None when neither (the same body would
    fail again)."""
    try:
        harder: Forward | None = await compactor.retry_harder(request, forward)
    except ContextLengthExceeded:  # even compacted it cannot fit: the upstream's words go
        harder = None
    if harder is not None and harder.tokens_after < forward.tokens_after:
        return dataclasses.replace(harder, overflow="compacted")
    dialect = request.dialect
    if request.policy.max_tokens_overflow != "lower" or not isinstance(dialect, OutputLimits):
        return None
    figures = dialect.output_overflow(error)
    if figures is None or not figures.prompt_fits:
        return None
    room = figures.window - figures.prompt
    body = dialect.with_max_output(forward.body, room)
    if body is None:
        return None
    return dataclasses.replace(
        forward, body=body, can_retry=False, overflow="max_tokens", max_output=room
    )


async def stream_head(
    dialect: StreamOverflow,
    response: UpstreamResponse,
    chunks: AsyncIterator[bytes],
    upstream: Upstream,
    metrics: Metrics,
) -> tuple[bytes, bool]:
    """The first bytes of a stream, read until `dialect` can tell whether they report an
    overflow, and its verdict."""
    head = b""
    verdict = dialect.stream_overflow(head)
    try:
        async with asyncio.timeout(upstream.timeouts.first_byte):
            while verdict is None:
                chunk = await anext(chunks, b"")
                if not chunk:
                    break
                head += chunk
                verdict = dialect.stream_overflow(head)
    except TimeoutError:
        response.close()
        metrics.upstream_timeouts.labels(upstream.name, "first_byte").inc()
        raise UpstreamTimeout(
            f"upstream {upstream.name!r} sent no events within {upstream.timeouts.first_byte:g} s"
        ) from None
    except StreamBroken as exc:
        response.close()
        raise UpstreamUnreachable(f"upstream {upstream.name!r} broke off its answer") from exc
    return head, bool(verdict)
