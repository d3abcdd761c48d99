"""`listen.max_concurrent_requests`: past it a request is refused at once, before its body is
read, in its API's error shape; the probes are never refused."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from proxy.dialects import DIALECTS, Dialect
from proxy.errors import Overloaded
from tests.conftest import ConfigFactory, metric
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server

CHAT = "/v1/chat/completions"
SLOW = {"x-fake-behavior": "slow-stream:0.4"}
STREAM = {"model": "small-8k", "messages": [{"role": "user", "content": "hi"}], "stream": True}
REFUSAL = Overloaded("The proxy is handling 2 requests, its limit; retry shortly.")


@pytest.fixture
def capped(proxy_config: ConfigFactory) -> Iterator[ServerThread]:
    with proxy_server(proxy_config(listen={"max_concurrent_requests": 2})) as server:
        yield server


@contextlib.contextmanager
def slow_streams(http: httpx.Client, server: ServerThread, count: int) -> Iterator[None]:
    """`count` streamed chat completions in flight while the block runs."""
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            url = server.url + CHAT
            answer = stack.enter_context(http.stream("POST", url, json=STREAM, headers=SLOW))
            assert answer.status_code == 200
        yield


def head_only(server: ServerThread, path: str) -> bytes:
    """What the proxy answers to a request that announces a body and never sends it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n".encode())
        return sock.recv(65536)


def in_flight(http: httpx.Client, server: ServerThread) -> float:
    return metric(http, server, "compaction_proxy_requests_in_flight")


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_past_the_cap_requests_are_refused_at_once_in_their_apis_shape(
    http: httpx.Client, capped: ServerThread, upstream: FakeUpstream, dialect: Dialect
) -> None:
    with slow_streams(http, capped, 2):
        assert in_flight(http, capped) == 2
        started = time.monotonic()
        refused = http.post(capped.url + dialect.path, json=STREAM)
        assert time.monotonic() - started < 1
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.content == dialect.error_body(REFUSAL)
        # Any other call in the shape of its client's API (Anthropic's: anthropic-version).
        listing = http.get(capped.url + "/v1/models", headers=dict(dialect.call_headers))
        assert listing.content == dialect.error_body(REFUSAL)
        # Refused before its body was read: the head alone gets the answer.
        raw = head_only(capped, dialect.path)
        assert raw.startswith(b"HTTP/1.1 429 ") and raw.endswith(dialect.error_body(REFUSAL))
        # The probes answer, and so would a load balancer's.
        for probe in ("/healthz", "/readyz", "/metrics"):
            assert http.get(capped.url + probe).status_code == 200
        assert len(upstream.requests) == 2
    overloaded = {"route": "overloaded", "status": "429"}
    assert metric(http, capped, "compaction_proxy_requests_total", **overloaded) == 3
    refused = {"status": "429", "reason": "proxy_overloaded"}
    assert metric(http, capped, "compaction_proxy_refusals_total", **refused) == 3


def test_the_openai_refusal_says_proxy_overloaded(
    http: httpx.Client, capped: ServerThread, upstream: FakeUpstream
) -> None:
    with slow_streams(http, capped, 2):
        error = http.post(capped.url + "/v1/models").json()["error"]
    assert error["code"] == "proxy_overloaded"
    assert set(error) == {"message", "type", "param", "code"}


def test_requests_are_served_again_once_some_finish(
    http: httpx.Client, capped: ServerThread, upstream: FakeUpstream
) -> None:
    with slow_streams(http, capped, 2):
        assert http.post(capped.url + CHAT, json=STREAM).status_code == 429
    # The streams were given up by their clients: the proxy ends them and counts them out.
    deadline = time.monotonic() + 5
    while in_flight(http, capped) > 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert http.post(capped.url + CHAT, json={**STREAM, "stream": False}).status_code == 200
