"""The proxy against upstreams that misbehave: retries only before the first relayed byte,
timeouts that name their phase, a bounded connection pool, and no state (cookies) carried
from one caller's request to another's. Scripted upstreams say exactly what goes wrong."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import yaml

from proxy.config import Config, loads
from tests.conftest import metric
from tests.fakes.scripted import (
    Request,
    Script,
    ScriptedUpstream,
    event,
    response,
    server_tls,
    stream_head,
)
from tests.servers import ServerThread, proxy_server

CHAT = "/v1/chat/completions"
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
QUOTA = orjson.dumps(
    {
        "error": {
            "message": "You exceeded your current quota.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
)


def retries(http: httpx.Client, server: ServerThread, reason: str) -> float:
    return metric(http, server, "compaction_proxy_upstream_retries_total", reason=reason)


def config_of(up: ScriptedUpstream, **upstream: Any) -> Config:
    return loads(yaml.safe_dump({"upstreams": {"up": {"base_url": up.base_url, **upstream}}}))


async def planned(request: Request, writer: asyncio.StreamWriter) -> bool:
    """Answers by the request's `x-plan` header: one action per attempt of the request named
    by `x-id`, the last repeated. Actions: a status (`503`, `200`), `quota` (429
    insufficient_quota), `wait-ms:N` (503 asking for N ms), `wait-s:N` (503 asking for N s),
    `stream-cut` (a stream cut after one event)."""
    plan = request.headers["x-plan"].split(",")
    attempt = sum(r.headers.get("x-id") == request.headers["x-id"] for r in PLANNED.requests)
    action = plan[min(attempt, len(plan)) - 1]
    kind, _, arg = action.partition(":")
    if kind == "stream-cut":
        writer.write(stream_head() + event('{"n": 1}'))
        await writer.drain()
        await asyncio.sleep(0.05)
        return False
    if kind == "quota":
        writer.write(response(429, QUOTA))
    elif kind == "wait-ms":
        writer.write(response(503, b"{}", [("retry-after-ms", arg)]))
    elif kind == "wait-s":
        writer.write(response(503, b"{}", [("Retry-After", arg)]))
    else:
        body = orjson.dumps({"status": int(kind), "attempt": attempt})
        writer.write(response(int(kind), body))
    return True


PLANNED = ScriptedUpstream(planned)


@pytest.fixture(scope="module")
def planned_server() -> Iterator[ServerThread]:
    with PLANNED, proxy_server(config_of(PLANNED)) as server:
        yield server


class Planned:
    """Requests through the proxy in front of PLANNED, each with a plan and an id of its own."""

    def __init__(self, http: httpx.Client, server: ServerThread) -> None:
        self.http = http
        self.server = server
        self.count = 0

    def send(self, plan: str, path: str = CHAT, **kwargs: Any) -> tuple[httpx.Response, int]:
        """The proxy's answer, and how many attempts the upstream saw."""
        self.count += 1
        request_id = f"{time.monotonic_ns()}-{self.count}"
        headers = {"x-plan": plan, "x-id": request_id}
        answer = self.http.post(self.server.url + path, json=BODY, headers=headers, **kwargs)
        return answer, sum(r.headers.get("x-id") == request_id for r in PLANNED.requests)

    def retries(self, reason: str) -> float:
        return retries(self.http, self.server, reason)


@pytest.fixture
def planned(http: httpx.Client, planned_server: ServerThread) -> Planned:
    return Planned(http, planned_server)


@pytest.mark.parametrize("status", [429, 503, 529])
def test_not_now_answers_are_retried(planned: Planned, status: int) -> None:
    before = planned.retries(f"status_{status}")
    answer, attempts = planned.send(f"{status},{status},200")
    assert answer.status_code == 200 and attempts == 3
    assert answer.json() == {"status": 200, "attempt": 3}
    assert planned.retries(f"status_{status}") == before + 2


def test_retries_run_out_and_the_last_answer_is_relayed(planned: Planned) -> None:
    answer, attempts = planned.send("503")
    assert attempts == 3  # the upstream's retries: 2 by default
    assert answer.status_code == 503
    assert answer.json() == {"status": 503, "attempt": 3}


@pytest.mark.parametrize("plan", ["500", "502", "504", "400", "401", "404", "409", "quota"])
def test_what_may_have_run_or_cannot_change_is_not_retried(planned: Planned, plan: str) -> None:
    answer, attempts = planned.send(f"{plan},200")
    assert attempts == 1
    if plan == "quota":
        assert answer.status_code == 429 and answer.content == QUOTA
    else:
        assert answer.status_code == int(plan)
        assert answer.json() == {"status": int(plan), "attempt": 1}


def test_retry_after_is_honoured_up_to_a_cap(planned: Planned) -> None:
    started = time.monotonic()
    answer, attempts = planned.send("wait-ms:400,200")
    assert answer.status_code == 200 and attempts == 2
    assert time.monotonic() - started >= 0.4
    # Asked to wait longer than the proxy would: the client gets the answer at once.
    started = time.monotonic()
    answer, attempts = planned.send("wait-s:60,200")
    assert answer.status_code == 503 and attempts == 1
    assert answer.headers["retry-after"] == "60"
    assert time.monotonic() - started < 2


def test_nothing_is_retried_after_the_first_relayed_byte(planned: Planned) -> None:
    before = sum(planned.retries(r) for r in ("stale_connection", "connect", "status_503"))
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),  # the break comes mid-body
        planned.http.stream(
            "POST",
            planned.server.url + CHAT,
            json={**BODY, "stream": True},
            headers={"x-plan": "stream-cut,200", "x-id": "cut"},
        ) as answer,
    ):
        assert answer.status_code == 200
        for part in answer.iter_raw():
            received += part
    assert received == b'data: {"n": 1}\n\n'
    assert sum(r.headers.get("x-id") == "cut" for r in PLANNED.requests) == 1
    after = sum(planned.retries(r) for r in ("stale_connection", "connect", "status_503"))
    assert after == before


# -- stale pooled connections ----------------------------------------------------------------------


def closes_kept_connections(begun: bytes = b"") -> Script:
    """Answers the first request of each connection; when a second one comes, writes `begun`
    (nothing, as an upstream whose keep-alive timeout ran out as the proxy reused the
    connection, or the start of an answer: it had taken the request) and closes it."""

    async def handler(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.number > 1:
            writer.write(begun)
            await writer.drain()
            return False
        writer.write(response(200, orjson.dumps({"connection": request.connection})))
        return True

    return handler


def test_a_stale_pooled_connection_is_retried_on_a_new_one(http: httpx.Client) -> None:
    with (
        ScriptedUpstream(closes_kept_connections()) as up,
        proxy_server(config_of(up, retries=1)) as server,
    ):
        first = http.post(server.url + CHAT, json=BODY)
        second = http.post(server.url + CHAT, json=BODY)
        assert first.json() == {"connection": 1}
        assert second.status_code == 200 and second.json() == {"connection": 2}
        assert [(r.connection, r.number) for r in up.requests] == [(1, 1), (1, 2), (2, 1)]
        assert retries(http, server, "stale_connection") == 1


def test_a_pooled_connection_closed_mid_answer_is_not_retried(http: httpx.Client) -> None:
    with (
        ScriptedUpstream(closes_kept_connections(b"HTTP/1.1 200 OK\r\nContent-Le")) as up,
        proxy_server(config_of(up, retries=1)) as server,
    ):
        assert http.post(server.url + CHAT, json=BODY).json() == {"connection": 1}
        second = http.post(server.url + CHAT, json=BODY)
        assert second.status_code == 502
        assert [(r.connection, r.number) for r in up.requests] == [(1, 1), (1, 2)]
        assert retries(http, server, "stale_connection") == 0


async def closes(request: Request, writer: asyncio.StreamWriter) -> bool:
    return False


def test_a_new_connection_closed_unanswered_is_not_retried(http: httpx.Client) -> None:
    # The upstream had the request and may have run it: never twice.
    with ScriptedUpstream(closes) as up, proxy_server(config_of(up)) as server:
        answer = http.post(server.url + CHAT, json=BODY)
        assert len(up.requests) == 1
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == "upstream_unreachable"


async def switches_protocols(request: Request, writer: asyncio.StreamWriter) -> bool:
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(30)
    return False


def test_switching_protocols_unasked_is_a_502(http: httpx.Client) -> None:
    with ScriptedUpstream(switches_protocols) as up, proxy_server(config_of(up)) as server:
        answer = http.post(server.url + CHAT, json=BODY)
        assert answer.status_code == 502
        assert answer.json()["error"]["message"] == (
            "upstream 'up' is unreachable: 101 Switching Protocols, though no upgrade was asked for"
        )


# -- connection errors and timeouts ---------------------------------------------------------------


def test_a_refused_connection_is_retried_then_a_502(http: httpx.Client) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = loads(f"upstreams:\n  gone:\n    base_url: http://127.0.0.1:{port}/v1\n")
    with proxy_server(config) as server:
        answer = http.post(server.url + CHAT, json=BODY)
        assert answer.status_code == 502
        message = answer.json()["error"]["message"]
        assert message == (
            "upstream 'gone' is unreachable: the connection was refused (3 attempts)"
        )
        assert retries(http, server, "connect") == 2
        # What still holds of the request is said: its session, the store's state.
        assert answer.headers["x-compaction-store"] == "ok"
        assert len(answer.headers["x-compaction-session"]) >= 12
        assert "x-compaction-action" not in answer.headers


def test_an_unresolvable_host_is_said_in_words_without_naming_it(http: httpx.Client) -> None:
    # .invalid never resolves (RFC 6761): the resolver says so at once, offline too.
    config = loads("upstreams:\n  nowhere:\n    base_url: http://api.nowhere.invalid/v1\n")
    with proxy_server(config) as server:
        answer = http.post(server.url + CHAT, json=BODY)
        assert answer.status_code == 502
        message = answer.json()["error"]["message"]
        assert message.startswith(
            "upstream 'nowhere' is unreachable: its host name did not resolve"
        )
        assert "invalid" not in message and "gaierror" not in message


def test_a_certificate_that_fails_verification_is_not_retried(http: httpx.Client) -> None:
    # The certificate is self-signed: this machine's trust store (SSL_CERT_FILE) lacks it.
    up = ScriptedUpstream(closes, host="localhost", tls=server_tls())
    with up, proxy_server(config_of(up)) as server:
        answer = http.post(server.url + CHAT, json=BODY)
        assert answer.status_code == 502
        message = answer.json()["error"]["message"]
        assert message == ("upstream 'up' is unreachable: its TLS certificate failed verification")
        assert retries(http, server, "connect") == 0


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    """A port whose listen queue is full: a connection attempt is never answered."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        held = socket.create_connection(("127.0.0.1", port))
        try:
            yield port
        finally:
            held.close()


@pytest.mark.parametrize("configured", [0, 2])
def test_a_connect_timeout_names_its_phase(
    http: httpx.Client, unanswered_port: int, configured: int
) -> None:
    upstream = {
        "base_url": f"http://127.0.0.1:{unanswered_port}/v1",
        "timeouts": {"connect": 0.2, "first_byte": 6},
        "retries": configured,
    }
    with proxy_server(loads(yaml.safe_dump({"upstreams": {"up": upstream}}))) as server:
        started = time.monotonic()
        answer = http.post(server.url + CHAT, json=BODY)
        assert time.monotonic() - started < 3
        assert answer.status_code == 504
        error = answer.json()["error"]
        assert error["code"] == "upstream_timeout"
        assert error["message"] == (
            "upstream 'up': connect timeout, no connection accepted within 0.2 s (timeouts.connect)"
        )
        phase = {"phase": "connect"}
        assert metric(http, server, "compaction_proxy_upstream_timeouts_total", **phase) == 1
        assert retries(http, server, "connect") == configured


async def holds(request: Request, writer: asyncio.StreamWriter) -> bool:
    """Never answers (`x-act: hang`), or starts a stream and never ends it (`x-act: stream`)."""
    if request.headers["x-act"] == "stream":
        writer.write(stream_head() + event('{"n": 1}'))
        await writer.drain()
    await asyncio.sleep(30)
    return False


def test_a_first_byte_timeout_names_its_phase(http: httpx.Client) -> None:
    timeouts = {"connect": 2, "first_byte": 0.3}
    with ScriptedUpstream(holds) as up, proxy_server(config_of(up, timeouts=timeouts)) as server:
        answer = http.post(server.url + CHAT, json=BODY, headers={"x-act": "hang"})
        assert answer.status_code == 504
        assert answer.json()["error"]["message"] == (
            "upstream 'up': first_byte timeout, no response head within 0.3 s (timeouts.first_byte)"
        )
        phase = {"phase": "first_byte"}
        assert metric(http, server, "compaction_proxy_upstream_timeouts_total", **phase) == 1


def test_a_request_waiting_for_a_pooled_connection_times_out_as_such(
    http: httpx.Client,
) -> None:
    up = ScriptedUpstream(holds)
    with up, proxy_server(config_of(up, timeouts={"first_byte": 0.3}, max_connections=1)) as server:
        body = {**BODY, "stream": True}
        with http.stream("POST", server.url + CHAT, json=body, headers={"x-act": "stream"}) as held:
            relayed = held.iter_raw()  # held, so that the stream stays open
            assert next(relayed) == b'data: {"n": 1}\n\n'
            # The one connection is taken by that stream: this request waits for it in vain.
            queued = http.post(server.url + CHAT, json=BODY, headers={"x-act": "hang"})
        assert queued.status_code == 504
        assert queued.json()["error"]["message"] == (
            "upstream 'up': pool timeout, no free connection within 0.3 s"
            " (all 1 in use; timeouts.first_byte)"
        )
        phase = {"phase": "pool"}
        assert metric(http, server, "compaction_proxy_upstream_timeouts_total", **phase) == 1
        assert len(up.requests) == 1


# -- the connection pool and state between callers -------------------------------------------------


async def slow_answer(request: Request, writer: asyncio.StreamWriter) -> bool:
    await asyncio.sleep(0.2)
    writer.write(response(200))
    return True


def test_connections_per_upstream_are_bounded(http: httpx.Client) -> None:
    with (
        ScriptedUpstream(slow_answer) as up,
        proxy_server(config_of(up, max_connections=2)) as server,
    ):
        answers: list[int] = []
        clients = [
            threading.Thread(
                target=lambda: answers.append(http.post(server.url + CHAT, json=BODY).status_code)
            )
            for _ in range(6)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        assert answers == [200] * 6
        assert up.most_open == 2 and len(up.requests) == 6


async def sets_a_cookie(request: Request, writer: asyncio.StreamWriter) -> bool:
    """Answers like a CDN in front of an API: a cookie on every answer."""
    cookie = f"__cf_bm=for-{request.headers.get('authorization', 'nobody')[-1]}; Path=/; HttpOnly"
    writer.write(response(200, b"{}", [("Set-Cookie", cookie)]))
    return True


def test_no_cookie_goes_from_one_caller_to_another(http: httpx.Client) -> None:
    # A hostname, not an IP literal: cookie jars keep no cookies for IP addresses.
    with (
        ScriptedUpstream(sets_a_cookie, host="localhost") as up,
        proxy_server(config_of(up)) as server,
    ):
        for key in ("sk-tenant-a", "sk-tenant-b", "sk-tenant-a"):
            # A client of its own each time: a client's own cookies are its to send.
            answer = httpx.post(server.url + CHAT, json=BODY, headers={"authorization": key})
            assert answer.status_code == 200
            assert answer.headers["set-cookie"].startswith(f"__cf_bm=for-{key[-1]}")
        assert len(up.requests) == 3
        assert [r.headers.get("cookie") for r in up.requests] == [None, None, None]
