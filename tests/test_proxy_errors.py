"""Failures: the proxy's own errors in OpenAI's shape, the upstream's relayed unchanged."""

from __future__ import annotations

import gzip
import json
import re
import socket
import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import loads
from proxy.observability.logs import JsonFormatter
from proxy.observability.metrics import Metrics
from proxy.upstream.answer import UpstreamResponse
from proxy.upstream.client import UpstreamClient
from tests.conftest import SDK, ConfigFactory, captured, config_for, examples, metric
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]


def check_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The body of a proxy-side error, checked to be in OpenAI's shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in response.text
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"", None),
        (b"{not json", None),
        (b'{"model": "small-8k", "messages": []', None),
        (b"[1, 2]", None),
        (b'"text"', None),
        (b'{"messages": []}', "model"),
        (b'{"model": 5, "messages": []}', "model"),
        (b'{"model": "small-8k"}', "messages"),
        (b'{"model": "small-8k", "messages": {"role": "user"}}', "messages"),
        (b'{"model": "small-8k", "messages": [1]}', "messages[0]"),
        (b'{"model": "small-8k", "messages": [], "max_tokens": "5"}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": {}}]}', "messages[0].content"),
        (
            b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": [1]}]}]}',
            "messages[0].tool_calls[0].id",
        ),
    ],
)
def test_bad_requests_get_a_400(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, body: bytes, param: str | None
) -> None:
    response = http.post(server.url + CHAT, content=body)
    error = check_error(response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert upstream.requests == []


@pytest.mark.parametrize("path", [CHAT, "/v1/responses"])
@pytest.mark.parametrize("stream", ["false", "yes", 0, {}])
def test_a_stream_flag_that_is_no_boolean_is_a_400_as_openai_answers_it(
    sdk: SDK, server: ServerThread, upstream: FakeUpstream, path: str, stream: Any
) -> None:
    fields = {"model": "small-8k", "stream": stream}
    fields |= {"messages": HELLO} if path == CHAT else {"input": "hi"}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(server, []).post(path.removeprefix("/v1"), body=fields, cast_to=object)
    got = "a string" if isinstance(stream, str) else "an object" if stream == {} else "a number"
    assert refused.value.body == {
        "message": f"Invalid type for 'stream': expected a boolean, but got {got} instead.",
        "type": "invalid_request_error",
        "param": "stream",
        "code": "invalid_type",
    }
    assert upstream.requests == []


@pytest.fixture
def small_body_server(proxy_config: ConfigFactory) -> Iterator[ServerThread]:
    with proxy_server(proxy_config(listen={"max_body_bytes": 2048})) as server:
        yield server


def padded(size: int) -> bytes:
    """A valid chat request of exactly `size` bytes."""
    body = orjson.dumps({"model": "small-8k", "messages": [{"role": "user", "content": ""}]})
    return body.replace(b'"content":""', b'"content":"' + b"x" * (size - len(body)) + b'"')


def test_the_body_cap(
    http: httpx.Client, small_body_server: ServerThread, upstream: FakeUpstream
) -> None:
    url = small_body_server.url
    assert http.post(url + CHAT, content=padded(2048)).status_code == 200
    check_error(http.post(url + CHAT, content=padded(2049)), 413)

    def chunked() -> Iterator[bytes]:  # no Content-Length: the cap holds while reading
        body = padded(4000)
        yield from (body[i : i + 500] for i in range(0, len(body), 500))

    response = http.post(url + CHAT, content=chunked())
    assert check_error(response, 413)["code"] == "request_too_large"
    check_error(http.post(url + "/v1/embeddings", content=chunked()), 413)
    assert len(upstream.requests) == 1
    assert http.post(url + CHAT, json={"model": "small-8k", "messages": HELLO}).is_success


def test_a_compressed_body_is_decoded_and_bounded_once_decoded(
    http: httpx.Client, small_body_server: ServerThread, upstream: FakeUpstream
) -> None:
    url = small_body_server.url
    body = padded(2048)
    for coding, packed in [("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))]:
        headers = {"content-encoding": coding, "content-type": "application/json"}
        answered = http.post(url + CHAT, content=packed, headers=headers)
        assert answered.status_code == 200, answered.text
        sent = upstream.requests[-1]
        assert sent.json == orjson.loads(body) and "content-encoding" not in sent.headers
    gzipped = {"content-encoding": "gzip"}
    assert http.get(url + "/v1/models", headers=gzipped).status_code == 200  # no body to decode
    # A small body that would decompress past the bound: refused, not decompressed whole.
    bomb = gzip.compress(b" " * 1_000_000)
    assert len(bomb) < 2048
    refused = http.post(url + CHAT, content=bomb, headers=gzipped)
    assert "once decompressed" in check_error(refused, 413)["message"]
    # The Responses API's body too (read before its request path reads it again).
    responses = gzip.compress(orjson.dumps({"model": "small-8k", "input": "hi", "store": False}))
    answered = http.post(url + "/v1/responses", content=responses, headers=gzipped)
    assert answered.status_code == 200, answered.text
    assert upstream.requests[-1].json["input"] == "hi"
    assert "content-encoding" not in upstream.requests[-1].headers
    cut = http.post(url + CHAT, content=gzip.compress(body)[:-10], headers=gzipped)
    assert check_error(cut, 400)["message"] == "The request body is not valid gzip data."
    unknown = http.post(url + CHAT, content=body, headers={"content-encoding": "br"})
    error = check_error(unknown, 415)
    assert error["code"] == "unsupported_content_encoding" and "'br'" in error["message"]
    assert len(upstream.requests) == 4


def test_unreachable_upstream_is_a_502(http: httpx.Client, closed_port: int) -> None:
    config = loads(f"upstreams:\n  gone:\n    base_url: http://127.0.0.1:{closed_port}/v1\n")
    with proxy_server(config) as server:
        chat = http.post(server.url + CHAT, json={"model": "small-8k", "messages": HELLO})
        assert check_error(chat, 502)["code"] == "upstream_unreachable"
        check_error(http.get(server.url + "/v1/models"), 502)


def test_no_first_byte_in_time_is_a_504(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    config = proxy_config(upstreams={"fake": {"timeouts": {"first_byte": 0.3}}})
    hang = {"x-fake-behavior": "hang"}
    with proxy_server(config) as server:
        started = time.perf_counter()
        body = {"model": "small-8k", "messages": HELLO, "stream": True}
        chat = http.post(server.url + CHAT, json=body, headers=hang)
        assert time.perf_counter() - started < 2
        assert check_error(chat, 504)["code"] == "upstream_timeout"
        check_error(http.get(server.url + "/v1/models", headers=hang), 504)
        # the proxy gave up on both upstream requests rather than leaving them open
        assert upstream.wait_for(lambda: upstream.cancelled == 2)


def test_a_turn_that_cannot_fit_says_its_session_and_the_refusal(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    body = {"model": "gpt-4", "messages": [{"role": "user", "content": "word " * 20_000}]}
    refused = http.post(server.url + CHAT, json=body, headers={"x-session-id": "s-refused"})
    assert check_error(refused, 400)["code"] == "context_length_exceeded"
    assert refused.headers["x-compaction-action"] == "refused"
    assert refused.headers["x-compaction-store"] == "ok"
    assert int(refused.headers["x-compaction-tokens-before"]) > 20_000
    body["messages"] = HELLO
    answered = http.post(server.url + CHAT, json=body, headers={"x-session-id": "s-refused"})
    assert refused.headers["x-compaction-session"] == answered.headers["x-compaction-session"]
    assert upstream.requests == [upstream.requests[-1]]  # only the second went


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/"), ("GET", "/foo"), ("POST", "/v2/chat/completions")]
)
def test_paths_outside_v1_are_a_404(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, method: str, path: str
) -> None:
    response = http.request(method, server.url + path)
    assert check_error(response, 404)["code"] == "not_found"
    assert upstream.requests == []


@pytest.mark.parametrize("behavior", ["status:429", "status:500", "status:503", "status:418"])
@pytest.mark.parametrize(("method", "path"), [("POST", CHAT), ("GET", "/v1/models")])
def test_upstream_errors_reach_the_client_unchanged(
    http: httpx.Client,
    server: ServerThread,
    upstream: FakeUpstream,
    behavior: str,
    method: str,
    path: str,
) -> None:
    body = orjson.dumps({"model": "small-8k", "messages": HELLO})
    headers = {"x-fake-behavior": behavior, "content-type": "application/json"}
    direct = http.request(method, upstream.origin + path, content=body, headers=headers)
    proxied = http.request(method, server.url + path, content=body, headers=headers)
    assert proxied.status_code == direct.status_code == int(behavior.split(":")[1])
    assert proxied.content == direct.content
    assert proxied.headers["content-type"] == direct.headers["content-type"]


def test_upstream_validation_errors_reach_the_sdk(
    server: ServerThread, upstream: FakeUpstream
) -> None:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0) as client:
        orphan = [*HELLO, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="small-8k", messages=orphan)
        assert bad.value.code is None and "role 'tool'" in bad.value.message
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(
                model="small-8k", messages=HELLO, extra_headers={"x-fake-behavior": "status:429"}
            )
        assert limited.value.code == "rate_limit_exceeded"
        upstream.api_key = "sk-right"
        with pytest.raises(openai.AuthenticationError) as denied:
            client.models.list()
        assert denied.value.code == "invalid_api_key"


def test_an_answer_cut_short_is_a_502(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    body = {"model": "small-8k", "messages": HELLO}
    response = http.post(
        server.url + CHAT, json=body, headers={"x-fake-behavior": "reset-mid-stream"}
    )
    check_error(response, 502)
    assert http.post(server.url + CHAT, json=body).is_success


@pytest.mark.parametrize(
    ("method", "path", "stream"),
    [("POST", CHAT, False), ("POST", CHAT, True), ("GET", "/v1/models", False)],
)
def test_client_gone_while_the_upstream_hangs_cancels_it(
    http: httpx.Client,
    server: ServerThread,
    upstream: FakeUpstream,
    method: str,
    path: str,
    stream: bool,
) -> None:
    body = orjson.dumps({"model": "small-8k", "messages": HELLO, "stream": stream})
    before = gone(http, server)
    with pytest.raises(httpx.ReadTimeout):
        http.request(
            method,
            server.url + path,
            content=body if method == "POST" else None,
            headers={"x-fake-behavior": "hang"},
            timeout=httpx.Timeout(5, read=0.3),
        )
    assert upstream.wait_for(lambda: upstream.cancelled == 1, timeout=3)
    assert http.post(server.url + CHAT, json={"model": "small-8k", "messages": HELLO}).is_success
    assert gone(http, server) == before + 1


def gone(http: httpx.Client, server: ServerThread) -> float:
    """Requests whose client went away before its answer."""
    return metric(http, server, "compaction_proxy_requests_total", route="error", status="499")


def test_client_gone_while_sending_its_body(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    before = gone(http, server)
    failed = metric(http, server, "compaction_proxy_requests_total", route="error", status="500")
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 999\r\n\r\n{"m')
    deadline = time.monotonic() + 3
    while gone(http, server) == before:
        assert time.monotonic() < deadline, "the proxy did not notice"
        time.sleep(0.02)
    assert gone(http, server) == before + 1
    assert (
        metric(http, server, "compaction_proxy_requests_total", route="error", status="500")
        == failed
    )
    assert upstream.requests == []


# -- never a 5xx from random input ----------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {"id": st.text(max_size=6) | json_values, "type": st.just("function") | json_values},
        optional={
            "function": st.fixed_dictionaries(
                {}, optional={"name": json_values, "arguments": json_values}
            )
            | json_values
        },
    ),
    max_size=2,
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"])},
    optional={
        "content": st.text(max_size=30)
        | st.integers(400, 2500).map(lambda n: "long words " * n)  # to make the proxy compact
        | json_values
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "image_url", "input_audio", "x"]) | json_values},
                optional={"text": json_values, "image_url": json_values},
            ),
            max_size=3,
        ),
        "tool_calls": tool_calls | json_values,
        "tool_call_id": json_values,
        "name": json_values,
    },
)
chat_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["small-8k", "gpt-4o-mini", "unknown-model"]) | json_values,
        "messages": st.lists(messages | json_values, max_size=5) | json_values,
        "max_tokens": st.integers(min_value=-10, max_value=10**9) | json_values,
        "max_completion_tokens": st.integers(min_value=-10, max_value=10**9) | json_values,
        "stream": st.booleans() | json_values,
        "stream_options": st.fixed_dictionaries({"include_usage": json_values}) | json_values,
        "metadata": st.fixed_dictionaries({"session_id": json_values}) | json_values,
        "tools": st.lists(
            st.fixed_dictionaries({"type": st.just("function"), "function": json_values}),
            max_size=2,
        )
        | json_values,
        "tool_choice": json_values,
        "x_extra": json_values,
    },
)
bodies = (
    chat_bodies.map(lambda b: json.dumps(b).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=64)
)


@settings(
    max_examples=examples(250),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=bodies,
    session=st.none() | st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1),
)
def test_random_bodies_never_get_a_5xx(
    http: httpx.Client, shared_server: ServerThread, body: bytes, session: str | None
) -> None:
    headers = {"content-type": "application/json"}
    if session is not None:
        headers["x-session-id"] = session
    response = http.post(shared_server.url + CHAT, content=body, headers=headers)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


# -- a failure the proxy did not foresee -----------------------------------------------------------


class FailingClient(UpstreamClient):
    """An upstream client that fails as no code of the proxy's foresees, quoting the body."""

    async def open(self, *args: Any, **kwargs: Any) -> UpstreamResponse:
        raise RuntimeError(f"cannot send {args[5]!r}")


def test_an_unforeseen_failure_logs_where_it_happened_never_what_it_said(
    http: httpx.Client, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    failing = proxy_server(config_for(upstream), client=FailingClient(metrics), metrics=metrics)
    with captured(caplog), failing as server:
        response = http.post(server.url + "/v1/embeddings", json={"input": "hunter2"})
    assert check_error(response, 500)["type"] == "server_error"
    record = next(r for r in caplog.records if r.getMessage() == "unexpected error")
    line = JsonFormatter().format(record)
    assert "hunter2" not in line and "hunter2" not in caplog.text
    logged = json.loads(line)
    assert logged["error"] == "RuntimeError"
    frames = logged["frames"]
    assert all(re.fullmatch(r"/\S+\.py:\d+ [\w.<>]+", frame) for frame in frames), frames
    assert frames[-1].startswith(f"{__file__}:") and frames[-1].endswith(" FailingClient.open")
    assert any(frame.endswith(" Passthrough.relay") for frame in frames)
