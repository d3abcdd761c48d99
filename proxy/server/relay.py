"""Relaying an upstream body to the client as it arrives.

The bytes go out unchanged, chunk by chunk, with no buffering. While relaying, the client's
disconnect is watched so that the upstream request is cancelled at once (no leaked
connections), even when the upstream is silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.errors import StreamBroken
from proxy.upstream.answer import UpstreamResponse

log = logging.getLogger("compaction_proxy")

HEAD_BYTES = 4 * 1024
TAIL_BYTES = 16 * 1024


class Relay:
    """An ASGI response that relays `chunks`; `on_end(head, tail, outcome)` runs when it is
    over.

    `head` and `tail` are the first and the last few KiB of the body (a stream's usage is in
    one of them: Anthropic's at the start, OpenAI's at the end), `outcome` one of "complete",
    "client_disconnected", "upstream_broken" or "ended" (by the proxy's shutdown).
    """

    def __init__(
        self,
        status: int,
        headers: list[tuple[str, str]],
        chunks: AsyncIterator[bytes],
        on_end: Callable[[bytes, bytes, str], None],
    ) -> None:
        self.status = status
        self.headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]
        self.chunks = chunks
        self.on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        head, tail = bytearray(), bytearray()
        pump = asyncio.ensure_future(self._pump(send, head, tail))
        watch = asyncio.ensure_future(until_disconnect(receive))
        outcome = "ended"  # the relay itself was cancelled (the shutdown ended it)
        try:
            done, _ = await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
            if pump in done:
                outcome = "upstream_broken"  # unless the pump says otherwise
                outcome = pump.result()
            else:
                outcome = "client_disconnected"
        finally:
            watch.cancel()
            if not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await pump
            # Whatever happened, the upstream response is closed and accounted for.
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            self.on_end(bytes(head), bytes(tail), outcome)

    async def _pump(self, send: Send, head: bytearray, tail: bytearray) -> str:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        try:
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if len(head) < HEAD_BYTES:
                    head += chunk[: HEAD_BYTES - len(head)]
                tail += chunk
                if len(tail) > TAIL_BYTES:
                    del tail[: len(tail) - TAIL_BYTES]
        except StreamBroken as exc:
            # Nothing is invented after a failure: no [DONE], and no clean end of the body
            # either. The server then drops the connection, so the client sees the break as
            # it would have seen it from the upstream, not a short answer that looks complete.
            log.warning("upstream stream broken", extra={"reason": str(exc)})
            return "upstream_broken"
        except OSError:
            return "client_disconnected"
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "complete"


def relayed(
    response: UpstreamResponse,
    headers: list[tuple[str, str]],
    chunks: AsyncIterator[bytes],
    then: Callable[[bytes, bytes, str], None] | None = None,
) -> Relay:
    """`response`'s status, `headers` and `chunks` (its body, or what is left of it) relayed;
    its connection kept when the body went whole, else closed; then `then` (as `on_end`)."""

    def on_end(head: bytes, tail: bytes, outcome: str) -> None:
        response.release() if outcome == "complete" else response.close()
        if then is not None:
            then(head, tail, outcome)

    return Relay(response.status, headers, chunks, on_end)


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def whole_response(payload: bytes, status: int, headers: list[tuple[str, str]]) -> Response:
    """A whole answer with exactly these headers (and its length)."""
    out = Response(payload, status_code=status)
    out.raw_headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    out.raw_headers.append((b"content-length", str(len(payload)).encode()))
    return out


async def after(head: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`head`, then `chunks`: the bytes read ahead of the relay go out first."""
    yield head
    async for chunk in chunks:
        yield chunk
