"""The client's first byte does not wait for the proxy's bookkeeping: an answer's metrics, its
log line and the dashboard's turn come once its first bytes went out (a stream's first chunk,
a whole answer's body); and an answer's head goes out with those bytes in one write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable

import orjson
import pytest
from starlette.types import ASGIApp, Message

from proxy.errors import StreamBroken
from proxy.server.app import create_app
from proxy.server.protocol import JOINED, HeldHead
from proxy.server.relay import Relay
from tests.conftest import ConfigFactory
from tests.fakes.openai import FakeUpstream

HELLO = [{"role": "user", "content": "hi"}]


class Marks(logging.Handler):
    """The proxy's "request forwarded" log line, as a mark in the order of `seen`."""

    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "request forwarded":
            self.seen.append("logged")


async def served(app: ASGIApp, body: bytes, seen: list[str]) -> None:
    """`body` posted to the app in this process, what it sends marked in `seen` as it goes."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer sk-test"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    given = False
    ended = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        while not ended:  # the client stays until the answer is over
            await asyncio.sleep(0.001)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal ended
        if message["type"] == "http.response.start":
            assert message["status"] == 200
            seen.append("head")
        elif message.get("body"):
            seen.append("body")
        if not message.get("more_body", False) and message["type"] == "http.response.body":
            ended = True

    await app(scope, receive, send)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_answer_goes_out_before_the_proxy_counts_and_logs_it(
    upstream: FakeUpstream, proxy_config: ConfigFactory, stream: bool
) -> None:
    app = create_app(proxy_config())
    seen: list[str] = []
    marks = Marks(seen)
    logger = logging.getLogger("compaction_proxy")
    logger.addHandler(marks)
    level = logger.level
    logger.setLevel(logging.INFO)  # (not `level =`: the logger caches what it said before)
    body = orjson.dumps({"model": "small-8k", "messages": HELLO, "stream": stream})
    try:
        await served(app, body, seen)
    finally:
        logger.removeHandler(marks)
        logger.setLevel(level)
        await app.state.proxy.client.close()
    # Counted and logged once, after the head and the first body bytes.
    assert seen[:3] == ["head", "body", "logged"]
    assert seen.count("logged") == 1
    if stream:
        assert seen.count("body") > 1  # the rest of the stream came after the log line


async def _broken() -> AsyncIterator[bytes]:
    raise StreamBroken("the connection closed before the answer's end")
    yield b""  # a generator


async def _silent() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()
    yield b""


@pytest.mark.parametrize(
    ("chunks", "outcome"),
    [(_broken, "upstream_broken"), (_silent, "client_disconnected")],
    ids=["broken", "client-gone"],
)
async def test_a_relay_with_no_chunk_out_still_counts_once_as_it_ends(
    chunks: Callable[[], AsyncIterator[bytes]], outcome: str
) -> None:
    """Counted as it ends when no chunk went out: the upstream broke off before its first, or
    the client went away while the upstream was silent (the relay's watch ends it)."""
    seen: list[str] = []

    def on_end(head: bytes, tail: bytes, ended: str) -> None:
        seen.append(ended)

    relay = Relay(200, [], chunks(), on_end, lambda: seen.append("counted"))

    async def receive() -> Message:
        await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        seen.append(message["type"])

    await asyncio.wait_for(relay({"type": "http"}, receive, send), 5)
    assert seen == ["http.response.start", "counted", outcome]


class Written(asyncio.Transport):
    """A transport that keeps what is written, one entry a call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(bytes(data))

    def writelines(self, parts: Iterable[bytes | bytearray | memoryview]) -> None:
        self.calls.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


HEAD = b"HTTP/1.1 200 OK\r\n\r\n"


def head_held() -> tuple[Written, HeldHead]:
    """A transport, and the cycle's over it with an answer's head written while holding."""
    written = Written()
    held = HeldHead(written, asyncio.get_running_loop())
    held.holding = True
    held.write(HEAD)
    held.holding = False
    return written, held


async def test_an_answers_head_goes_out_with_its_first_body_bytes_in_one_write() -> None:
    written, held = head_held()
    held.write(b"body")
    await asyncio.sleep(0)  # the flush it had planned does nothing
    assert written.calls == [HEAD + b"body"]


async def test_a_head_whose_body_is_not_there_goes_out_alone_at_the_next_step() -> None:
    written, held = head_held()
    assert written.calls == []
    await asyncio.sleep(0)
    assert written.calls == [HEAD]
    held.write(b"later")
    assert written.calls[1:] == [b"later"]


async def test_a_held_head_goes_out_before_its_connection_closes() -> None:
    written, held = head_held()
    held.close()
    await asyncio.sleep(0)
    assert written.calls == [HEAD] and written.closed


async def test_a_large_body_is_not_copied_to_join_its_head() -> None:
    written, held = head_held()
    body = b"x" * JOINED
    held.write(body)
    assert written.calls == [HEAD, body]
