"""An upstream's answer as the proxy uses it, whatever carried it, and reading one whole up to
a bound.

The proxy reads an answer whole where it must see all of it: a non-streamed answer for its
`usage`, an error to tell an overflow or a spent quota from the rest, its own calls' answers
(summaries, counts, hooks). Read without a bound, one answer of 100 MiB took three times that
in memory. Past the bound, an answer for the client is relayed as it comes instead (`Unread`:
its usage goes unread), and one of the proxy's own calls fails (`AnswerTooLarge`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from proxy.errors import AnswerTooLarge

# An error body read to decide on a retry (or on compacting harder): errors are a few hundred
# bytes, and one larger than this is relayed as it comes, neither retried nor compacted for.
ERROR_BYTES = 64 * 1024


class UpstreamResponse(Protocol):
    """An upstream's answer as the request path uses it, whatever carried it."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> list[tuple[str, str]]: ...

    def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        """The body as it arrives; a stalled or broken body raises StreamBroken."""
        ...

    def release(self) -> None:
        """Done with a body read to its end: its connection may be reused."""

    def close(self) -> None:
        """Done early: drop the connection."""


class Unread:
    """An answer larger than the bound it was read to: the part read, then the rest as it
    comes (the idle timeout it was read with applies)."""

    def __init__(self, response: UpstreamResponse, read: bytes, rest: AsyncIterator[bytes]) -> None:
        self._response = response
        self._read = read
        self._rest = rest

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def headers(self) -> list[tuple[str, str]]:
        return self._response.headers

    async def chunks(self, idle_timeout: float) -> AsyncIterator[bytes]:
        yield self._read
        async for chunk in self._rest:
            yield chunk

    def release(self) -> None:
        self._response.release()

    def close(self) -> None:
        self._response.close()


async def read_bounded(
    response: UpstreamResponse, idle_timeout: float, limit: int
) -> bytes | Unread:
    """The whole body when it is at most `limit` bytes, else the answer with what was read
    (`Unread`), to be relayed. A body that breaks off raises StreamBroken, and is closed."""
    chunks = response.chunks(idle_timeout)
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                return Unread(response, b"".join(parts), chunks)
    except BaseException:
        response.close()
        raise
    return b"".join(parts)


async def read_whole(response: UpstreamResponse, idle_timeout: float, limit: int) -> bytes:
    """The whole body, all of which the proxy needs; AnswerTooLarge past `limit` bytes (the
    answer closed)."""
    body = await read_bounded(response, idle_timeout, limit)
    if isinstance(body, Unread):
        response.close()
        raise AnswerTooLarge(f"an answer larger than {limit} bytes")
    return body
