"""litellm's answers as an API's bytes: one body (an answer or an error), or a stream relayed
event by event as litellm yields it, each in the grammar of the client's API.

A `Grammar` says how one API writes its errors and how its stream ends; the routes (chat
completions, Messages, Responses) give theirs, and the `Encoder` of each stream's events.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from proxy.config import Upstream
from proxy.errors import APIError, StreamBroken, UpstreamTimeout
from proxy.upstream.litellm_errors import Failure, failure

JSON_HEADERS = [("Content-Type", "application/json")]
SSE_HEADERS = [("Content-Type", "text/event-stream; charset=utf-8")]


@dataclasses.dataclass(frozen=True)
class Grammar:
    """How one API writes an error as a whole body, and what ends its stream (chat
    completions' `data: [DONE]`; nothing for the others, whose last event says it)."""

    error_body: Callable[[APIError], bytes]
    end: bytes = b""


class Encoder(Protocol):
    """Writes the events of one stream: each of litellm's chunks (None: nothing to send for
    it), and the event that ends the stream when it fails."""

    def encode(self, chunk: Any) -> bytes | None: ...

    def failed(self, error: APIError) -> bytes: ...


@dataclasses.dataclass(frozen=True)
class EventWriter:
    """An `Encoder` whose events need nothing of the events before them."""

    encode: Callable[[Any], bytes | None]
    failed: Callable[[APIError], bytes]


class Whole:
    """An answer that is one body: the API's answer or an error."""

    def __init__(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    @classmethod
    def error(cls, error: APIError, grammar: Grammar) -> Whole:
        return cls(error.status_code, grammar.error_body(error), JSON_HEADERS)

    @classmethod
    def failed(cls, failed: Failure, grammar: Grammar) -> Whole:
        retry = [("Retry-After", failed.retry_after)] if failed.retry_after else []
        return cls(failed.error.status_code, grammar.error_body(failed.error), JSON_HEADERS + retry)

    async def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        yield self.body

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class Streamed:
    """litellm's stream as SSE, event by event as litellm yields them, as `encoder` writes
    them."""

    status = 200
    headers = SSE_HEADERS

    def __init__(
        self,
        stream: Any,
        first: Any,
        encoder: Encoder,
        grammar: Grammar,
        upstream: Upstream,
    ) -> None:
        self._stream = stream
        self._first = first
        self._encoder = encoder
        self._grammar = grammar
        self._upstream = upstream
        self._closing: asyncio.Task[None] | None = None

    async def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        try:
            chunk = self._first
            while chunk is not None:
                event = self._encoder.encode(chunk)
                if event:
                    yield event
                try:
                    async with asyncio.timeout(idle_timeout):
                        chunk = await anext(self._stream, None)
                except Exception as exc:
                    # An error event, then the connection drops: nothing that looks complete.
                    if isinstance(exc, TimeoutError):
                        reason = f"no data for {idle_timeout:g} s"
                        name = self._upstream.name
                        error: APIError = UpstreamTimeout(f"upstream {name!r}: {reason}")
                    else:
                        reason, error = type(exc).__name__, failure(exc, self._upstream).error
                    yield self._encoder.failed(error)
                    raise StreamBroken(reason) from None
            if self._grammar.end:
                yield self._grammar.end
        finally:
            await self._aclose()

    def release(self) -> None:
        self.close()

    def close(self) -> None:
        """Done with it: litellm's stream is closed (in the background: this is sync)."""
        if self._stream is not None and self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._aclose())

    async def _aclose(self) -> None:
        stream, self._stream = self._stream, None
        await aclose(stream)


async def aclose(stream: Any) -> None:
    """Close one of litellm's streams (some of its iterators have no `aclose`)."""
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        await closer()
