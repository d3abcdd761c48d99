"""/v1/responses over a WebSocket, driven by the openai SDK's own client of it
(`client.responses.connect`) and, for what the SDK will not send, by the websockets package:
the warm-up, continued responses rebuilt whole for the upstream, sessions as over HTTP, errors
as error events with their status, the limits and authentication of the HTTP path, and the
426 that stays where the proxy serves no WebSocket."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
import websockets
import websockets.http11
from openai.resources.responses.responses import ResponsesConnection

from proxy.config import loads
from proxy.credentials import hash_key
from proxy.dialects.sse import EventStream
from proxy.observability.logs import JsonFormatter
from tests.conftest import ConfigFactory, captured, metric
from tests.fakes.openai import FakeUpstream
from tests.fakes.scripted import Request, ScriptedUpstream, response
from tests.servers import ServerThread, proxy_server

RESPONSES = "/v1/responses"
BETA = {"OpenAI-Beta": "responses_websockets=2026-02-06"}
MODEL = "gpt-4o-mini"
INSTRUCTIONS = "Be brief."
ENDS = ("response.completed", "response.incomplete", "response.failed", "error")


def connect(server: ServerThread, **headers: str) -> Any:
    """The SDK's connection manager to the proxy's WebSocket, with no reconnection of its own."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
    return client.responses.connect(extra_headers={**BETA, **headers}, max_retries=0)


def answered(connection: ResponsesConnection) -> list[Any]:
    """The events of one answer, through the one that ends it."""
    events = []
    for event in connection:
        events.append(event)
        if event.type in ENDS:
            return events
    raise AssertionError("the connection closed before the answer ended")


def create(connection: ResponsesConnection, **fields: Any) -> list[Any]:
    connection.response.create(model=MODEL, instructions=INSTRUCTIONS, store=False, **fields)  # type: ignore[call-overload]
    return answered(connection)


def forwarded(up: FakeUpstream) -> list[dict[str, Any]]:
    return [r.json for r in up.requests if r.path == RESPONSES]


def sessions(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The session of each request forwarded, as the proxy logged it (each record once: the
    logger may also propagate to caplog)."""
    records = dict.fromkeys(r for r in caplog.records if r.getMessage() == "request forwarded")
    return [r.session for r in records]  # type: ignore[attr-defined]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


def test_a_warm_up_then_two_continued_responses_reach_the_upstream_whole(
    http: httpx.Client,
    server: ServerThread,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="compaction_proxy")
    key = {"prompt_cache_key": "codex-ws-1"}
    beta = {"OpenAI-Beta": "responses_websockets=2026-02-06, assistants=v2"}
    with captured(caplog), connect(server, **beta) as connection:
        warm = create(connection, input=[], generate=False, **key)
        assert [e.type for e in warm] == [
            "response.created",
            "response.in_progress",
            "response.completed",
        ]
        assert warm[-1].response.output == [] and upstream.requests == []
        assert metric(http, server, "compaction_proxy_websockets_open") == 1
        warmed = metric(http, server, "compaction_proxy_requests_total", route="websocket_warmup")
        first = create(
            connection, input=[user("hi")], previous_response_id=warm[-1].response.id, **key
        )
        second = create(
            connection, input=[user("again")], previous_response_id=first[-1].response.id, **key
        )
        # The same conversation over HTTP, its history sent whole.
        history = [
            user("hi"),
            *(i.model_dump(mode="json", exclude_unset=True) for i in first[-1].response.output),
            user("again"),
        ]
        body = {"model": MODEL, "instructions": INSTRUCTIONS, "store": False, **key}
        same = {"Authorization": "Bearer sk-test"}  # the same caller (tenant)
        answer = http.post(server.url + RESPONSES, json={**body, "input": history}, headers=same)
    assert warmed >= 1
    assert first[0].type == "response.created"
    assert first[-1].type == second[-1].type == "response.completed"
    assert "Fake reply" in second[-1].response.output_text
    sent = forwarded(upstream)
    assert len(sent) == 3
    # The first request went as it came, the second with the history before its own items;
    # the socket's own fields stayed behind, and every answer streams.
    assert sent[0] == {**body, "stream": True, "input": [user("hi")]}
    assert sent[1] == {**body, "stream": True, "input": history}
    assert sent[2]["input"] == history
    # The upgrade's headers go with each request, but for those of the WebSocket itself.
    headers = upstream.requests[0].headers
    assert headers["accept"] == "text/event-stream"
    assert headers["openai-beta"] == "assistants=v2"
    assert "sec-websocket-key" not in headers and "upgrade" not in headers
    # One session for the connection, the one HTTP finds for the same conversation.
    assert len(set(sessions(caplog))) == 1
    assert answer.headers["x-compaction-session"].startswith(sessions(caplog)[0])


def test_a_session_derived_from_the_conversation_stays_the_same_over_the_connection(
    server: ServerThread, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="compaction_proxy")
    with captured(caplog), connect(server) as connection:
        previous = None
        for text in ("one", "two", "three"):
            events = create(connection, input=[user(text)], previous_response_id=previous)
            previous = events[-1].response.id
    assert len(sessions(caplog)) == 3 and len(set(sessions(caplog))) == 1


def test_a_response_the_connection_does_not_hold_is_previous_response_not_found(
    server: ServerThread, upstream: FakeUpstream
) -> None:
    with connect(server) as connection:
        (error,) = create(connection, input=[user("hi")], previous_response_id="resp_elsewhere")
        assert (error.type, error.status) == ("error", 400)
        assert error.error.code == "previous_response_not_found"
        assert error.error.param == "previous_response_id"
        # The connection goes on: the whole input is taken.
        assert create(connection, input=[user("hi")])[-1].type == "response.completed"
    assert len(forwarded(upstream)) == 1


def test_a_history_over_the_bound_is_not_kept(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    config = proxy_config(listen={"websocket_history_bytes": 2000})
    with proxy_server(config) as server, connect(server) as connection:
        small = create(connection, input=[user("hi")])
        kept = create(connection, input=[user("ok")], previous_response_id=small[-1].response.id)
        assert kept[-1].type == "response.completed"
        big = create(connection, input=[user("x" * 3000)])
        (error,) = create(
            connection, input=[user("more")], previous_response_id=big[-1].response.id
        )
        dropped = metric(http, server, "compaction_proxy_websocket_histories_dropped_total")
    assert error.error.code == "previous_response_not_found"
    assert dropped == 1


@pytest.mark.parametrize("status", [429, 500])
def test_an_upstream_error_is_an_error_event_with_its_status(
    server: ServerThread, upstream: FakeUpstream, status: int
) -> None:
    with connect(server, **{"x-fake-behavior": f"status:{status}"}) as connection:
        (error,) = create(connection, input=[user("hi")])
    assert (error.type, error.status) == ("error", status)
    assert error.error.message and error.error.type
    assert upstream.rejected >= 1


def test_a_stream_the_upstream_breaks_off_ends_with_an_error_event(
    server: ServerThread, upstream: FakeUpstream
) -> None:
    with connect(server, **{"x-fake-behavior": "reset-mid-stream:3"}) as connection:
        events = create(connection, input=[user("hi")])
    assert events[0].type == "response.created"
    assert (events[-1].type, events[-1].status) == ("error", 502)
    assert events[-1].error.code == "upstream_unreachable"


async def plain_answers(request: Request, writer: asyncio.StreamWriter) -> bool:
    """An upstream that answers without events: its proxy's error page (`x-act: page`), else
    a whole JSON response to a request that asked for a stream."""
    if request.headers.get("x-act") == "page":
        writer.write(response(502, b"<html>Bad Gateway</html>", content_type="text/html"))
    else:
        writer.write(response(200, b'{"id": "resp_1", "object": "response", "output": []}'))
    return True


@pytest.mark.parametrize("act", ["page", "json"])
def test_an_answer_that_is_no_stream_is_an_error_event(act: str) -> None:
    with ScriptedUpstream(plain_answers) as up:
        config = loads(f"upstreams:\n  scripted:\n    base_url: {up.base_url}\n")
        with proxy_server(config) as server:
            create = {"type": "response.create", "model": MODEL, "input": "hi"}
            frames: list[str | bytes] = [orjson.dumps(create).decode()]
            (error,) = asyncio.run(exchange(ws_url(server), frames, **{"x-act": act}))
    assert (error["type"], error["status"]) == ("error", 502)
    if act == "page":  # the page's text, as an HTTP client would have read it
        assert error["error"]["message"] == "<html>Bad Gateway</html>"
    else:
        assert error["error"]["message"].startswith('{"id": "resp_1"')


def test_an_events_data_is_read_across_chunks() -> None:
    stream = EventStream()
    assert stream.feed(b'event: response.created\r\ndata: {"a":') == []
    assert stream.feed(b" 1}\r\n\r\n: a comment\n\ndata: [2,\ndata: 3]\n") == [b'{"a": 1}']
    assert stream.feed(b"\n") == [b"[2,\n3]"]


async def exchange(url: str, frames: list[str | bytes], **headers: str) -> list[dict[str, Any]]:
    """Each frame sent in turn over one connection, and the event that ended its answer."""
    ends = []
    async with websockets.connect(url, additional_headers={**BETA, **headers}) as ws:
        for frame in frames:
            await ws.send(frame)
            while (event := orjson.loads(await ws.recv()))["type"] not in ENDS:
                pass
            ends.append(event)
    return ends


def ws_url(server: ServerThread, path: str = RESPONSES) -> str:
    return server.url.replace("http://", "ws://") + path


def test_bad_frames_get_error_events_and_the_connection_goes_on(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    good = orjson.dumps({"type": "response.create", "model": MODEL, "input": "hi"}).decode()
    frames: list[str | bytes] = [
        "{not json",
        "[1, 2]",
        '{"type": "response.create"}',
        orjson.dumps({"type": "response.cancel", "model": MODEL}).decode(),
        orjson.dumps({"type": "response.create", "model": MODEL, "input": 3}).decode(),
        orjson.dumps({"type": "response.create", "model": MODEL, "generate": "no"}).decode(),
        good.encode(),
        good,
    ]
    before = metric(http, server, "compaction_proxy_refusals_total", status="400")
    ends = asyncio.run(exchange(ws_url(server), frames))
    errors = ends[:-1]
    assert all(e["type"] == "error" and e["status"] == 400 for e in errors)
    assert [e["error"].get("param") for e in errors] == [
        None,
        None,
        "model",
        "type",
        "input",
        "generate",
        None,
    ]
    assert "text frame" in errors[-1]["error"]["message"]
    assert ends[-1]["type"] == "response.completed"
    assert len(forwarded(upstream)) == 1
    after = metric(http, server, "compaction_proxy_refusals_total", status="400")
    assert after == before + len(errors)


def test_a_rebuilt_history_over_max_body_bytes_is_a_413_and_a_larger_frame_closes(
    proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    config = proxy_config(listen={"max_body_bytes": 4096})

    async def run(url: str) -> tuple[list[dict[str, Any]], int | None]:
        async with websockets.connect(url, additional_headers=BETA) as ws:
            first = {"type": "response.create", "model": MODEL, "input": [user("a" * 2500)]}
            await ws.send(orjson.dumps(first).decode())
            while (done := orjson.loads(await ws.recv()))["type"] not in ENDS:
                pass
            more = {**first, "previous_response_id": done["response"]["id"]}
            await ws.send(orjson.dumps(more).decode())
            refused = orjson.loads(await ws.recv())
            await ws.send(orjson.dumps({**first, "input": [user("b" * 5000)]}).decode())
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None
        return [done, refused], closed.value.rcvd.code

    with proxy_server(config) as server:
        (done, refused), code = asyncio.run(run(ws_url(server)))
    assert done["type"] == "response.completed"
    assert (refused["type"], refused["status"]) == ("error", 413)
    assert refused["error"]["code"] == "request_too_large"
    assert code == 1009  # message too big
    assert len(forwarded(upstream)) == 1


def test_a_proxy_key_is_asked_at_the_upgrade(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    keys = [{"id": "team-a", "sha256": hash_key("proxy-key-a")}]
    config = proxy_config(auth={"keys": keys, "header": "X-Proxy-Key"})

    async def refused(url: str, **headers: str) -> websockets.http11.Response:
        with pytest.raises(websockets.exceptions.InvalidStatus) as error:
            async with websockets.connect(url, additional_headers={**BETA, **headers}):
                pass
        return error.value.response

    with proxy_server(config) as server:
        url = ws_url(server)
        missing = asyncio.run(refused(url))
        wrong = asyncio.run(refused(url, **{"X-Proxy-Key": "not-a-key"}))
        ends = asyncio.run(
            exchange(
                url,
                [orjson.dumps({"type": "response.create", "model": MODEL, "input": "hi"}).decode()],
                **{"X-Proxy-Key": "proxy-key-a"},
            )
        )
        denied = metric(http, server, "compaction_proxy_refusals_total", status="401")
    for refusal in (missing, wrong):
        assert refusal.status_code == 401
        assert orjson.loads(refusal.body)["error"]["code"] == "invalid_api_key"
    assert ends[-1]["type"] == "response.completed"
    assert denied == 2
    # The proxy's key stays with the proxy.
    assert "x-proxy-key" not in {name.lower() for name in upstream.requests[-1].headers}


@pytest.fixture
def capped(proxy_config: ConfigFactory) -> Iterator[ServerThread]:
    with proxy_server(proxy_config(listen={"max_concurrent_requests": 1})) as server:
        yield server


def test_a_request_past_the_cap_is_an_error_event_429_and_counts_in_flight(
    http: httpx.Client, capped: ServerThread, upstream: FakeUpstream
) -> None:
    slow = {"model": "small-8k", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    chat = capped.url + "/v1/chat/completions"
    with connect(capped) as connection:
        headers = {"x-fake-behavior": "slow-stream:0.4"}
        with http.stream("POST", chat, json=slow, headers=headers) as busy:
            assert busy.status_code == 200
            (error,) = create(connection, input=[user("hi")])
        assert (error.type, error.status) == ("error", 429)
        assert error.error.code == "proxy_overloaded"
        # A request over the socket is one in flight: HTTP is refused while it runs.
        with connect(capped, **headers) as slow_socket:
            slow_socket.response.create(model=MODEL, input=[user("hi")], store=False)
            assert slow_socket.recv().type == "response.created"
            assert http.post(chat, json=slow).status_code == 429
            assert answered(slow_socket)[-1].type == "response.completed"
        assert create(connection, input=[user("again")])[-1].type == "response.completed"


@pytest.mark.parametrize(
    ("path", "listen"),
    [("/v1/chat/completions", {}), (RESPONSES, {"websockets": False})],
    ids=["other-path", "switched-off"],
)
def test_an_upgrade_the_proxy_does_not_serve_is_answered_426_counted_and_logged(
    http: httpx.Client,
    proxy_config: ConfigFactory,
    caplog: pytest.LogCaptureFixture,
    path: str,
    listen: dict[str, Any],
) -> None:
    """Codex CLI falls back to HTTP at once only on a 426; any other refusal it retries."""

    async def refused(url: str) -> websockets.http11.Response:
        headers = {**BETA, "Authorization": "Bearer sk-ws-secret"}
        with pytest.raises(websockets.exceptions.InvalidStatus) as error:
            async with websockets.connect(url, additional_headers=headers, open_timeout=5):
                pass
        return error.value.response

    refusals = {"status": "426", "reason": "websocket_unsupported"}
    caplog.set_level(logging.INFO, logger="compaction_proxy")
    with proxy_server(proxy_config(listen=listen)) as server, captured(caplog):
        started = time.monotonic()
        response = asyncio.run(refused(ws_url(server, path)))
        assert time.monotonic() - started < 2
        counted = metric(http, server, "compaction_proxy_refusals_total", **refusals)
    assert response.status_code == 426
    assert "upgrade" not in {name.lower() for name in response.headers}
    error = orjson.loads(response.body)["error"]
    assert error["code"] == "websocket_unsupported" and "over HTTP" in error["message"]
    record = next(r for r in caplog.records if r.getMessage() == "websocket upgrade refused")
    line = JsonFormatter().format(record)
    assert orjson.loads(line)["path"] == path
    assert "sk-ws-secret" not in line
    assert counted == 1
