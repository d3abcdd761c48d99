"""Relaying an upstream body to the client as it arrives, and a whole answer.

The bytes go out unchanged, chunk by chunk, with no buffering. While relaying, the client's
disconnect is watched so that the upstream request is cancelled at once (no leaked
connections), even when the upstream is silent.

What the proxy does after an answer is decided (its metrics, its log line, the dashboard's
turn) waits until the answer's first bytes have gone: `started` of a relay, `then` of a whole
answer. The client's first byte does not wait for the proxy's bookkeeping.
"""

from __future__ import annotations

import asyncio
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
    """An ASGI response that relays `chunks`; `started()` runs once its first chunk went out
    (or, when none does, as it ends), `on_end(head, tail, outcome)` when it is over.

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
        started: Callable[[], None] | None = None,
    ) -> None:
        self.status = status
        self.headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]
        self.chunks = chunks
        self.on_end = on_end
        self.started = started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.relay(send, Watch(receive))

    async def relay(self, send: Send, watch: Watch) -> None:
        """Relay in this task, which `watch` (made in it) cancels when the client goes away;
        stopped once the relay is over."""
        head, tail = bytearray(), bytearray()
        outcome = "ended"  # the relay itself was cancelled (the shutdown ended it)
        try:
            outcome = "upstream_broken"  # unless the pump says otherwise
            outcome = await self._pump(send, head, tail)
        except asyncio.CancelledError:
            if not watch.gone:
                outcome = "ended"
                raise
            watch.task.uncancel()
            outcome = "client_disconnected"
        finally:
            watch.stop()
            self._started()
            # Whatever happened, the upstream response is closed and accounted for.
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            self.on_end(bytes(head), bytes(tail), outcome)

    def _started(self) -> None:
        started, self.started = self.started, None
        if started is not None:
            started()

    async def _pump(self, send: Send, head: bytearray, tail: bytearray) -> str:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        try:
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if self.started is not None:
                    self._started()
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
    started: Callable[[], None] | None = None,
) -> Relay:
    """`response`'s status, `headers` and `chunks` (its body, or what is left of it) relayed;
    its connection kept when the body went whole, else closed; `started` once its first chunk
    went out, then `then` (as `on_end`)."""

    def on_end(head: bytes, tail: bytes, outcome: str) -> None:
        response.release() if outcome == "complete" else response.close()
        if then is not None:
            then(head, tail, outcome)

    return Relay(response.status, headers, chunks, on_end, started)


class Watch:
    """A watch of the client's connection that cancels the task it was made in when the
    client goes away (`gone`), once `ready` is set (the request's body read) if given: one task
    for the request, from its body to the end of its answer, not one and a wait for each."""

    def __init__(self, receive: Receive, ready: asyncio.Event | None = None) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.gone = False
        self._watch = asyncio.ensure_future(self._run(receive, ready))

    async def _run(self, receive: Receive, ready: asyncio.Event | None) -> None:
        if ready is not None:
            await ready.wait()
        await until_disconnect(receive)
        self.gone = True
        self.task.cancel()

    def stop(self) -> None:
        self._watch.cancel()


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Whole(Response):
    """A whole answer with exactly these headers (and its length); `then()` runs once it went
    out, or failed to."""

    def __init__(
        self,
        payload: bytes,
        status: int,
        headers: list[tuple[str, str]],
        then: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(payload, status_code=status)
        self.raw_headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]
        self.raw_headers.append((b"content-length", str(len(payload)).encode()))
        self.then = then

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, headers = self.status_code, self.raw_headers
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": self.body})
        finally:
            if self.then is not None:
                self.then()


def whole_response(
    payload: bytes,
    status: int,
    headers: list[tuple[str, str]],
    then: Callable[[], None] | None = None,
) -> Response:
    """A whole answer with exactly these headers (and its length); `then()` once it went out."""
    return Whole(payload, status, headers, then)


async def after(head: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`head`, then `chunks`: the bytes read ahead of the relay go out first."""
    yield head
    async for chunk in chunks:
        yield chunk
