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
from proxy.compaction.forward import Forward, with_max_output
from proxy.compaction.turn import ClientRequest
from proxy.config import Upstream
from proxy.dialects import OutputLimits, OutputOverflow, StreamOverflow
from proxy.errors import ContextLengthExceeded, StreamBroken, UpstreamTimeout, UpstreamUnreachable
from proxy.observability.metrics import Metrics
from proxy.upstream.answer import UpstreamResponse


async def retried(
    compactor: Compactor, request: ClientRequest, forward: Forward, error: bytes
) -> Forward | None:
    """What goes upstream again after it said `forward` overflows its window (`error`, its
    error answer; empty for a stream's), the count calibrated first by the prompt size that
    error gives: when only the output the request reserved overflowed and the policy says
    so, with max_tokens lowered to what the window leaves, if that is at least the output
    its budget reserved; else compacted harder, when that makes the prompt smaller and the
    output leaves room for a quarter of it; else lowered to whatever is left; None when none
    of these (the same body would fail again)."""
    dialect = request.dialect
    figures: OutputOverflow | None = None
    prompt: int | None = None
    if isinstance(dialect, OutputLimits):
        figures = dialect.output_overflow(error)
        prompt = figures.prompt if figures is not None else dialect.overflow_prompt(error)
    if prompt is not None:
        # The upstream's own count of what was sent, as good as an answer's usage: the harder
        # compaction and the max_tokens it leaves are reckoned by it, not by the guess that
        # overflowed (in a new session, nothing calibrated, the only try left would fail too).
        compactor.calibrate(request, forward, prompt)
    if figures is not None and not figures.prompt_fits:
        figures = None  # the prompt alone is over: compacting is the only way
    lowered = _lowered(request, forward, figures)
    if lowered is not None and (lowered.max_output or 0) >= (forward.reserved_output or 0):
        return lowered
    if figures is not None and (figures.window - figures.output) * 4 < figures.prompt:
        return lowered  # the output leaves no room a compaction could make the prompt fit
    try:
        harder: Forward | None = await compactor.retry_harder(request, forward)
    except ContextLengthExceeded:  # even compacted it cannot fit: the upstream's words go
        harder = None
    if harder is not None and harder.tokens_after < forward.tokens_after:
        return dataclasses.replace(harder, overflow="compacted")
    return lowered


def _lowered(
    request: ClientRequest, forward: Forward, figures: OutputOverflow | None
) -> Forward | None:
    """`forward` with max_tokens lowered to what the window leaves the prompt, by the output
    overflow's own `figures`, when the policy says so and the request can ask for so little
    (None otherwise)."""
    if figures is None:
        return None
    lowered = with_max_output(request, forward, figures.window - figures.prompt)
    if lowered is None:
        return None
    return dataclasses.replace(lowered, can_retry=False, overflow="max_tokens")


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
        seconds = upstream.timeouts.first_byte
        raise UpstreamTimeout.in_phase(
            upstream.name, "first_byte", f"no events within {seconds:g} s (timeouts.first_byte)"
        ) from None
    except StreamBroken as exc:
        response.close()
        raise UpstreamUnreachable(f"upstream {upstream.name!r} broke off its answer") from exc
    return head, bool(verdict)
