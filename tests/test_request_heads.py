"""What the server takes of a client's request before any route sees it: a head within
`listen.max_head_bytes` and `listen.max_header_fields` (past either, a 431 in the API's error
shape, and nothing forwarded), a body read on as it comes up to `listen.max_body_bytes`, an
answer of unknown length to an HTTP/1.0 client delimited by the connection's end, and no
`Expect` forwarded."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import orjson
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from proxy.config import Listen
from proxy.server.protocol import protocol_for
from tests.conftest import ConfigFactory
from tests.fakes.openai import FakeUpstream
from tests.fakes.scripted import Request, ScriptedUpstream, chunk, event, stream_head
from tests.served import served
from tests.servers import ServerThread, proxy_server

MODELS = b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n"
MiB = 1 << 20


def exchange(port: int, *parts: bytes) -> bytes:
    """`parts` sent on a connection of their own, and all that comes back until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            for n, part in enumerate(parts):
                time.sleep(0.01 if n else 0)  # a read of its own, each
                sock.sendall(part)
        except OSError:
            pass  # refused before the client was done: the answer came all the same
        answer = b""
        while received := sock.recv(65536):
            answer += received
    return answer


def split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    """An answer's status, headers (names in lower case) and body."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    fields = (line.split(":", 1) for line in lines)
    return int(status.split()[1]), {n.lower(): v.strip() for n, v in fields}, body


def padded(size: int) -> bytes:
    """A request head of `size` bytes exactly, padded by headers of 4000 bytes at most (the
    fake upstream takes lines of 8 KiB at most)."""
    lines = [MODELS]
    left = size - len(MODELS) - len(b"\r\n")
    while left > 0:
        name = b"X-Pad-%d: " % len(lines)
        pad = min(left - len(name) - 2, 4000)
        lines.append(name + b"p" * pad + b"\r\n")
        left -= len(lines[-1])
    return b"".join([*lines, b"\r\n"])


def test_a_head_of_1_mib_gets_a_431_in_openais_shape_and_is_not_forwarded(
    server: ServerThread, upstream: FakeUpstream
) -> None:
    status, headers, body = split(exchange(server.port, padded(MiB)))
    assert status == 431
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    error = orjson.loads(body)["error"]
    assert error["code"] == "request_header_fields_too_large"
    assert error["type"] == "invalid_request_error"
    assert "32768 bytes" in error["message"]
    assert upstream.requests == []


@pytest.mark.parametrize(
    "start",
    [
        b"POST /v1/messages HTTP/1.1\r\n",
        # Any call of an Anthropic client: it sends anthropic-version on every one.
        b"GET /v1/models HTTP/1.1\r\nanthropic-version: 2023-06-01\r\n",
    ],
)
def test_a_head_on_the_messages_path_gets_anthropics_shape(
    server: ServerThread, start: bytes
) -> None:
    head = start + b"Host: proxy\r\nX-Pad: " + b"p" * MiB + b"\r\n\r\n"
    status, _, body = split(exchange(server.port, head))
    assert status == 431
    answer = orjson.loads(body)
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"


def test_20000_small_headers_get_a_431(server: ServerThread, upstream: FakeUpstream) -> None:
    head = MODELS + b"".join(b"X-%d: 1\r\n" % n for n in range(20_000)) + b"\r\n"
    assert split(exchange(server.port, head))[0] == 431
    assert upstream.requests == []


@pytest.mark.parametrize("pieces", [1, 7])
def test_a_head_just_within_the_bound_passes_and_one_byte_more_does_not(
    server: ServerThread, upstream: FakeUpstream, pieces: int
) -> None:
    """Sent at once, and in pieces (each read counted as it comes)."""
    for size, expected in ((32 * 1024, 200), (32 * 1024 + 1, 431)):
        head = padded(size)
        step = -(-size // pieces)
        parts = [head[i : i + step] for i in range(0, size, step)]
        assert split(exchange(server.port, *parts))[0] == expected, size
    [forwarded] = upstream.requests
    assert sum(len(v) for n, v in forwarded.headers.items() if n.startswith("x-pad")) > 32_000


def test_the_bounds_are_configured_under_listen(
    proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    config = proxy_config(listen={"max_head_bytes": 2048, "max_header_fields": 5})
    few = MODELS + b"".join(b"X-%d: 1\r\n" % n for n in range(3)) + b"\r\n"
    many = MODELS + b"".join(b"X-%d: 1\r\n" % n for n in range(4)) + b"\r\n"
    with proxy_server(config) as server:
        assert split(exchange(server.port, few))[0] == 200
        status, _, body = split(exchange(server.port, many))
        assert status == 431
        assert "more than 5 header fields" in orjson.loads(body)["error"]["message"]
        assert split(exchange(server.port, padded(2049)))[0] == 431
    assert len(upstream.requests) == 1


def test_a_huge_head_takes_no_memory(tmp_path: Path, upstream: FakeUpstream) -> None:
    """64 MiB of one header (it took 300 MiB, and was forwarded whole): refused when the bound
    is passed, and what follows read and dropped."""
    with served({"upstreams": {"fake": {"base_url": upstream.base_url}}}, tmp_path) as proxy:
        before = proxy.memory()
        proxy.reset_peak()
        head = MODELS + b"X-Big: " + b"b" * (64 * MiB) + b"\r\n\r\n"
        status, _, _ = split(exchange(proxy.port, head))
        assert status == 431
        assert proxy.peak_memory() - before < 8 * MiB
    assert upstream.requests == []


@pytest.mark.parametrize("bound", [4 * MiB, 256 * 1024])
def test_a_body_is_read_on_while_the_app_is_busy_up_to_the_bound(bound: int) -> None:
    """uvicorn stops reading a body at 64 KiB until the app takes it; the proxy's server reads
    on up to `listen.max_body_bytes`, so that a body sent while the app is busy is all there
    when it asks (and past the bound, reading stops again)."""
    firsts: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await asyncio.sleep(0.3)  # busy: the client sends meanwhile
        message = await receive()
        firsts.append(len(message["body"]))
        while message.get("more_body"):
            message = await receive()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    protocol = protocol_for(Listen(max_body_bytes=bound))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", http=protocol)  # type: ignore[arg-type]
    body = b"x" * MiB
    head = b"POST / HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n"
    with ServerThread(app, config) as server:
        answer = exchange(server.port, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert split(answer)[0] == 204
    if bound > len(body):
        assert firsts == [len(body)]
    else:
        assert bound <= firsts[0] < len(body)


async def streaming(request: Request, writer: asyncio.StreamWriter) -> bool:
    writer.write(stream_head() + event('{"n": 1}') + event("[DONE]") + chunk(b""))
    return True


def test_a_stream_to_an_http_1_0_client_ends_with_the_connection(
    proxy_config: ConfigFactory,
) -> None:
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": [], "stream": True})
    head = b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    with ScriptedUpstream(streaming) as up:
        config = proxy_config(upstreams={"fake": {"base_url": up.base_url}})
        with proxy_server(config) as server:
            status, headers, relayed = split(exchange(server.port, head + body))
    assert status == 200
    assert "transfer-encoding" not in headers  # which HTTP/1.0 does not know
    assert "content-length" not in headers
    assert headers["connection"] == "close"
    assert relayed == b'data: {"n": 1}\n\ndata: [DONE]\n\n'


def test_expect_100_continue_is_not_forwarded(server: ServerThread, upstream: FakeUpstream) -> None:
    body = orjson.dumps({"model": "small-8k", "messages": [{"role": "user", "content": "hi"}]})
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n"
    head += b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        answer = b""
        while received := sock.recv(65536):
            answer += received
    assert split(answer)[0] == 200
    assert "expect" not in upstream.requests[-1].headers
