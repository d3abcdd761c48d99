"""Anthropic Messages through the proxy: the official `anthropic` SDK as the client, the strict
fake Anthropic API as the upstream, streamed and not."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
import yaml

from proxy.config import ConfigError, loads
from proxy.dialects.json_checks import MAX_DEPTH
from proxy.sessions.sessions import session_key
from tests.conftest import captured, merged, metric
from tests.conversations import words
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.base import BEHAVIOR_HEADER
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server

KEY = "sk-ant-api03-test"
SMALL = "claude-small"  # 8k for the proxy and the fake
BIG = "claude-big"  # the proxy believes 100k; the fake has 8k
LONG = "claude-long"  # 8k, 1M with the beta header
VERSION = "2023-06-01"
HELLO = [{"role": "user", "content": "Hello"}]


def config(up: FakeAnthropic, **sections: Any) -> Any:
    data = {
        "upstreams": {"claude": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
        "models": [
            {"match": SMALL, "context_window": 8192},
            {"match": BIG, "context_window": 100_000},
            {"match": LONG, "context_window": 8192},
        ],
    }
    return loads(yaml.safe_dump(merged(data, sections)))


@pytest.fixture(scope="module")
def up() -> Iterator[FakeAnthropic]:
    windows = {SMALL: 8192, BIG: 8192, LONG: 8192}
    with FakeAnthropic(windows=windows, long_context={LONG}, long_context_window=200_000) as fake:
        yield fake


@pytest.fixture(scope="module")
def server(up: FakeAnthropic) -> Iterator[ServerThread]:
    with proxy_server(config(up)) as proxy:
        yield proxy


OPEN: list[anthropic.Anthropic] = []  # the clients a test made, closed when it ends


@pytest.fixture(autouse=True)
def fresh(up: FakeAnthropic) -> Iterator[None]:
    up.reset()
    up.api_key, up.behavior = None, ""
    yield
    while OPEN:
        OPEN.pop().close()


def client_of(server: ServerThread, key: str | None = KEY, **kwargs: Any) -> anthropic.Anthropic:
    """The SDK pointed at the proxy (the key as given, else `kwargs`' credential)."""
    if key is not None:
        kwargs["api_key"] = key
    OPEN.append(anthropic.Anthropic(base_url=server.url, max_retries=0, **kwargs))
    return OPEN[-1]


def unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as blocks without breakpoints: the same for the proxy's marks or none."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
        out.append({**message, "content": blocks})
    return out


def messages_sent(up: FakeAnthropic) -> list[dict[str, Any]]:
    """The bodies of the Messages requests that reached the fake, summaries left out."""
    return [
        r.json
        for r in up.requests
        if r.path == "/v1/messages" and r.headers.get("x-compaction-summary") != "1"
    ]


def history(turns: int, size: int = 300) -> list[dict[str, Any]]:
    """A user/assistant chat of `turns` rounds of about `size` words each, and a question."""
    out: list[dict[str, Any]] = []
    for turn in range(turns):
        out.append({"role": "user", "content": f"Turn {turn}: {words(size, turn)}"})
        out.append({"role": "assistant", "content": [{"type": "text", "text": "Noted."}]})
    return [*out, {"role": "user", "content": "What now?"}]


def test_answers_streamed_and_not(server: ServerThread, up: FakeAnthropic) -> None:
    client = client_of(server)
    raw = client.messages.with_raw_response.create(model=SMALL, max_tokens=50, messages=HELLO)
    assert raw.parse().content[0].text.startswith("Fake reply")
    assert raw.headers["x-compaction-action"] == "none"
    with client.messages.stream(model=SMALL, max_tokens=50, messages=HELLO) as stream:
        assert "".join(stream.text_stream).startswith("Fake reply")
        assert stream.response.headers["x-compaction-action"] == "none"
    assert messages_sent(up) == [
        {"model": SMALL, "max_tokens": 50, "messages": HELLO},
        {"model": SMALL, "max_tokens": 50, "messages": HELLO, "stream": True},
    ]
    # Claude Code's path: the beta query string goes along.
    headers = {"x-api-key": KEY, "anthropic-version": VERSION}
    body = {"model": SMALL, "max_tokens": 50, "messages": HELLO}
    httpx.post(server.url + "/v1/messages?beta=true", json=body, headers=headers)
    assert up.requests[-1].query == "beta=true"


def test_untouched_requests_are_forwarded_as_their_own_bytes(
    server: ServerThread, up: FakeAnthropic
) -> None:
    body = (
        b'{"model": "claude-small",  "max_tokens": 9,'
        b' "messages": [{"role": "user", "content": "\\u00e9"}]}'
    )
    headers = {"x-api-key": KEY, "anthropic-version": VERSION, "content-type": "application/json"}
    response = httpx.post(server.url + "/v1/messages", content=body, headers=headers)
    assert response.status_code == 200
    assert up.requests[-1].body == body


@pytest.mark.parametrize("output_only_delta", [False, True])
def test_the_stream_is_relayed_in_anthropics_events_and_its_usage_read(
    server: ServerThread, up: FakeAnthropic, output_only_delta: bool
) -> None:
    """The usage is read from message_start: the API's message_delta has not always had the
    prompt's tokens."""
    system = [{"type": "text", "text": words(1500, 1), "cache_control": {"type": "ephemeral"}}]
    fields = {"model": SMALL, "max_tokens": 50, "messages": HELLO, "system": system}
    headers = {"x-api-key": KEY, "anthropic-version": VERSION}
    if output_only_delta:
        headers[BEHAVIOR_HEADER] = "output-only-delta"
    with httpx.Client() as http:
        before = {
            name: metric(http, server, f"compaction_proxy_{name}_total", dialect="messages")
            for name in ("upstream_prompt_tokens", "cached_prompt_tokens", "cache_creation_tokens")
        }
        events = []
        for _ in range(2):
            response = http.post(
                server.url + "/v1/messages", json={**fields, "stream": True}, headers=headers
            )
            chunks = response.content.split(b"\n\n")
            events.append([c.split(b"\n")[0].removeprefix(b"event: ") for c in chunks if c])

        def now() -> dict[str, float]:
            return {
                name: metric(http, server, f"compaction_proxy_{name}_total", dialect="messages")
                for name in before
            }

        total = up.count({"model": SMALL, "messages": HELLO, "system": system})
        # The usage is read once the last byte went out: wait for the second reading.
        deadline = time.monotonic() + 5
        after = now()
        while after["upstream_prompt_tokens"] - before["upstream_prompt_tokens"] < 2 * total:
            assert time.monotonic() < deadline, "the stream's usage was not read"
            time.sleep(0.01)
            after = now()
    assert events[0][0] == b"message_start" and events[0][-1] == b"message_stop"
    assert b"content_block_delta" in events[0]
    assert after["upstream_prompt_tokens"] - before["upstream_prompt_tokens"] == 2 * total
    written = after["cache_creation_tokens"] - before["cache_creation_tokens"]
    read = after["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    assert written == read > 1024  # the first wrote the system prompt, the second read it


def test_errors_are_in_anthropics_shape(server: ServerThread, up: FakeAnthropic) -> None:
    headers = {"x-api-key": KEY, "anthropic-version": VERSION}
    response = httpx.post(server.url + "/v1/messages", content=b"{not json", headers=headers)
    assert response.status_code == 400
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client_of(server).messages.create(model=SMALL, max_tokens=9, messages="hi")  # type: ignore[arg-type]
    assert bad.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "messages: Input should be a valid list",
        },
    }
    # The upstream's own errors reach the client as they are.
    up.behavior = "status:529"
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        client_of(server).messages.create(model=SMALL, max_tokens=9, messages=HELLO)
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"


def tool_loop(depth: int) -> bytes:
    """A tool loop whose tool_use input nests to `depth` levels, the body being the first."""
    # body, messages, the message, its content, the block, its input: 6 levels to "x".
    value = "[" * (depth - 6) + "1" + "]" * (depth - 6)
    call = f'{{"type": "tool_use", "id": "t1", "name": "f", "input": {{"x": {value}}}}}'
    result = '{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}'
    messages = (
        f'[{{"role": "user", "content": "hi"}}, {{"role": "assistant", "content": [{call}]}},'
        f' {{"role": "user", "content": [{result}]}}]'
    )
    return f'{{"model": "{SMALL}", "max_tokens": 9, "messages": {messages}}}'.encode()


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 1000])
def test_a_body_nested_deeper_than_the_proxy_writes_is_a_400_in_anthropics_shape(
    server: ServerThread, depth: int
) -> None:
    """It was a 500: the canonical tool call is the input written back out as JSON, which
    orjson refuses past 254 levels. The deepest body accepted goes through."""
    headers = {"x-api-key": KEY, "anthropic-version": VERSION}
    refused = httpx.post(server.url + "/v1/messages", content=tool_loop(depth), headers=headers)
    assert refused.status_code == 400, refused.text
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "nests arrays and objects more than" in refused.json()["error"]["message"]
    deepest = httpx.post(server.url + "/v1/messages", content=tool_loop(MAX_DEPTH), headers=headers)
    assert deepest.status_code == 200, deepest.text


def test_the_proxys_own_failures_are_in_anthropics_shape(
    up: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = config(up, upstreams={"claude": {"base_url": "http://127.0.0.1:9/v1"}})
    with proxy_server(unreachable) as proxy:
        with pytest.raises(anthropic.InternalServerError) as failed:
            client_of(proxy).messages.create(model=SMALL, max_tokens=9, messages=HELLO)
        assert failed.value.status_code == 502
        assert failed.value.body["type"] == "error"
        assert failed.value.body["error"]["type"] == "api_error"
        # Not only on /v1/messages: any call an Anthropic client makes, or that goes to an
        # Anthropic upstream, and a path the proxy does not serve.
        with captured(caplog), pytest.raises(anthropic.InternalServerError) as listing:
            client_of(proxy).models.list()
        logged = [r for r in caplog.records if r.getMessage() == "request refused"][-1]
        assert logged.api == "messages"  # type: ignore[attr-defined]
        assert listing.value.status_code == 502
        assert listing.value.body["error"]["type"] == "api_error"
        for path, headers in [("/v1/models", {}), ("/nowhere", {"anthropic-version": VERSION})]:
            answer = httpx.get(proxy.url + path, headers=headers).json()
            assert answer["type"] == "error" and set(answer["error"]) == {"type", "message"}
    keyed = config(
        up,
        auth={"keys": [{"id": "team", "sha256": hashlib.sha256(b"proxy-key").hexdigest()}]},
    )
    with proxy_server(keyed) as proxy:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            client_of(proxy, default_headers={"Authorization": "Bearer wrong"}).messages.create(
                model=SMALL, max_tokens=9, messages=HELLO
            )
        assert refused.value.body["error"]["type"] == "authentication_error"
        # The proxy key in Authorization, the client's own Anthropic key in x-api-key.
        proxied = client_of(proxy, key="proxy-key", default_headers={"x-api-key": KEY})
        ok = proxied.messages.create(model=SMALL, max_tokens=9, messages=HELLO)
    assert ok.content and up.requests[-1].headers["x-api-key"] == KEY
    assert "authorization" not in up.requests[-1].headers


def test_x_api_key_callers_are_tenants_of_their_own(server: ServerThread) -> None:
    def session_of(key: str, extra: dict[str, str] | None = None) -> str:
        raw = client_of(server, key).messages.with_raw_response.create(
            model=SMALL,
            max_tokens=9,
            messages=HELLO,
            extra_headers={"X-Claude-Code-Session-Id": "same-session", **(extra or {})},
        )
        return raw.headers["x-compaction-session"]

    assert session_of("sk-ant-one") == session_of("sk-ant-one")
    assert session_of("sk-ant-one") != session_of("sk-ant-two")
    tenant = "cred-" + hashlib.sha256(b"sk-ant-one").hexdigest()[:24]
    assert session_of("sk-ant-one") == session_key(tenant, "same-session")


def test_claude_codes_session_names(server: ServerThread) -> None:
    client = client_of(server)
    tenant = "cred-" + hashlib.sha256(KEY.encode()).hexdigest()[:24]
    legacy = "user_" + "0a" * 32 + "_account__session_5e1f0c2a-0000-4000-8000-00000000000a"
    for user_id, session in (
        (legacy, "5e1f0c2a-0000-4000-8000-00000000000a"),
        ('{"device_id": "d", "session_id": "s-42"}', "s-42"),
    ):
        raw = client.messages.with_raw_response.create(
            model=SMALL, max_tokens=9, messages=HELLO, metadata={"user_id": user_id}
        )
        assert raw.headers["x-compaction-session"] == session_key(tenant, session)
    raw = client.messages.with_raw_response.create(
        model=SMALL,
        max_tokens=9,
        messages=HELLO,
        metadata={"user_id": legacy},
        extra_headers={"X-Claude-Code-Session-Id": "from-header"},
    )
    assert raw.headers["x-compaction-session"] == session_key(tenant, "from-header")


@pytest.mark.parametrize(
    ("max_tokens", "turns", "size", "text"),
    [
        (100, 12, 500, "prompt is too long: "),
        (3000, 10, 400, "input length and `max_tokens` exceed context limit: "),
    ],
)
def test_both_overflow_texts_are_retried_compacted(
    server: ServerThread, up: FakeAnthropic, max_tokens: int, turns: int, size: int, text: str
) -> None:
    messages = history(turns, size)
    body = {"model": BIG, "max_tokens": max_tokens, "messages": messages}
    direct = httpx.post(
        up.base_url + "/v1/messages", json=body, headers={"anthropic-version": VERSION}
    )
    assert direct.status_code == 400 and direct.json()["error"]["message"].startswith(text)
    up.reset()
    raw = client_of(server).messages.with_raw_response.create(**body)
    assert raw.parse().content[0].text.startswith("Fake reply")
    assert raw.headers["x-compaction-action"] in ("compacted", "degraded")
    first, retried = messages_sent(up)  # the proxy's window for the model is 100k: no compaction
    assert unmarked(first["messages"]) == unmarked(messages)
    assert up.count({**retried, "max_tokens": None}) + max_tokens <= 8192


def test_summaries_go_to_the_same_upstream_with_the_requests_key_and_version(
    up: FakeAnthropic,
) -> None:
    policy = {"default": {"layers": ["summarize", "trim_head"]}}
    with proxy_server(config(up, policies=policy)) as proxy:
        raw = client_of(proxy).messages.with_raw_response.create(
            model=SMALL, max_tokens=1000, messages=history(16, 400)
        )
        assert raw.headers["x-compaction-action"] == "compacted"
        summaries = [r for r in up.requests if r.headers.get("x-compaction-summary") == "1"]
        assert summaries
        sent = raw.http_request.headers  # the SDK sends its key as a bearer token
        for summary in summaries:
            assert summary.path == "/v1/messages"
            assert summary.headers["authorization"] == sent["authorization"] == f"Bearer {KEY}"
            assert summary.headers["anthropic-version"] == sent["anthropic-version"]
            assert "stream" not in summary.json and summary.json["max_tokens"] > 0
        sent = messages_sent(up)[-1]
        assert sent["messages"][0]["content"][0]["text"].startswith("[Summary of the earlier")
        assert sent["messages"][0]["role"] == "user"

        # A subscription's token is only for the client's own requests: the digest stands in.
        up.reset()
        oauth = client_of(proxy, key=None, auth_token="sk-ant-oat01-subscription")
        raw = oauth.messages.with_raw_response.create(
            model=SMALL, max_tokens=1000, messages=history(16, 400)
        )
        assert raw.headers["x-compaction-action"] == "compacted"  # by design, not a failure
        assert up.summary_calls == 0
        digest = messages_sent(up)[-1]["messages"][0]["content"][0]["text"]
        assert digest.startswith("[Digest of the earlier conversation")
        assert up.requests[-1].headers["authorization"] == "Bearer sk-ant-oat01-subscription"


def test_the_upstreams_key_replaces_the_clients(up: FakeAnthropic) -> None:
    up.api_key = "sk-ant-upstream"
    keyed = config(up, upstreams={"claude": {"api_key": "sk-ant-upstream"}})
    with proxy_server(keyed) as proxy:
        client_of(proxy, key=None, auth_token="client-token").messages.create(
            model=SMALL, max_tokens=9, messages=HELLO
        )
    headers = up.requests[-1].headers
    assert headers["x-api-key"] == "sk-ant-upstream" and "authorization" not in headers


def test_count_tokens_goes_to_the_anthropic_upstream(
    up: FakeAnthropic, upstream: FakeUpstream
) -> None:
    both = config(
        up,
        upstreams={"openai": {"base_url": upstream.base_url}},
        default_upstream={"chat": "openai", "messages": "claude"},
    )
    with proxy_server(both) as proxy:
        counted = client_of(proxy).messages.count_tokens(model=SMALL, messages=HELLO)
        assert counted.input_tokens == up.count({"model": SMALL, "messages": HELLO})
        assert [m.id for m in client_of(proxy).models.list()] == [SMALL, BIG, LONG]
        assert httpx.get(proxy.url + "/v1/models").json()["object"] == "list"  # OpenAI's


def test_the_long_context_beta_opens_the_window(server: ServerThread, up: FakeAnthropic) -> None:
    messages = history(16, 400)
    beta = {"anthropic-beta": "context-1m-2025-08-07"}
    raw = client_of(server).messages.with_raw_response.create(
        model=LONG, max_tokens=100, messages=messages, extra_headers=beta
    )
    assert raw.headers["x-compaction-action"] == "none"
    assert unmarked(messages_sent(up)[-1]["messages"]) == unmarked(messages)
    raw = client_of(server).messages.with_raw_response.create(
        model=LONG, max_tokens=100, messages=messages
    )
    assert raw.headers["x-compaction-action"] in ("compacted", "degraded")


def test_a_summary_role_other_than_user_is_refused_on_anthropic_routes(up: FakeAnthropic) -> None:
    with pytest.raises(ConfigError, match=r"policies\.default\.summary_role.*must be user"):
        config(up, policies={"default": {"summary_role": "system"}})
    with pytest.raises(ConfigError, match=r"policies\.agents\.summary_role.*routes\[0\]"):
        config(
            up,
            policies={"agents": {"summary_role": "assistant"}},
            routes=[{"policy": "agents", "dialects": ["messages"]}],
        )
    openai_only = config(
        up,
        upstreams={"openai": {"base_url": "http://127.0.0.1:1/v1"}},
        default_upstream={"chat": "openai", "messages": "claude"},
        policies={"default": {}, "chatty": {"summary_role": "system"}},
        routes=[{"policy": "chatty", "dialects": ["chat"]}],
    )
    assert openai_only.policies["chatty"].compaction.summary_role == "system"
    assert orjson.dumps(openai_only.masked())


def test_count_tokens_counts_the_view_of_a_named_session(up: FakeAnthropic) -> None:
    with proxy_server(config(up)) as proxy:
        client = client_of(proxy)
        messages = history(16, 400)
        session = {"X-Claude-Code-Session-Id": "counted"}
        raw = client.messages.with_raw_response.create(
            model=SMALL, max_tokens=1000, messages=messages, extra_headers=session
        )
        assert raw.headers["x-compaction-action"] == "compacted"
        sent = messages_sent(up)[-1]["messages"]
        counted = client.messages.with_raw_response.count_tokens(
            model=SMALL, messages=messages, extra_headers=session
        )
        assert counted.headers["x-compaction-action"] == "replayed"
        view = up.count({"model": SMALL, "messages": sent})
        assert (
            counted.parse().input_tokens == view < up.count({"model": SMALL, "messages": messages})
        )
        # A session the client does not name is not looked up: the history is counted whole.
        whole = client.messages.count_tokens(model=SMALL, messages=messages)
        assert whole.input_tokens == up.count({"model": SMALL, "messages": messages})
    assert up.requests[-1].path == "/v1/messages/count_tokens"


def test_under_shadow_mode_the_client_bytes_go_upstream_and_are_counted(
    up: FakeAnthropic,
) -> None:
    """Shadow mode (docs/config.md): the would-be compaction is reported and stored, but the
    request goes upstream as sent (no breakpoints of the proxy's either), and count_tokens
    counts it whole."""
    with proxy_server(config(up)) as proxy:
        messages = history(12, 400)  # over the compaction level, within the fake's window
        raw = orjson.dumps({"model": SMALL, "max_tokens": 1000, "messages": messages})
        headers = {
            "x-api-key": KEY,
            "anthropic-version": VERSION,
            "content-type": "application/json",
            "X-Claude-Code-Session-Id": "shadowed",
            "X-Compaction-Shadow": "1",
        }
        answer = httpx.post(proxy.url + "/v1/messages", content=raw, headers=headers)
        assert answer.status_code == 200
        assert answer.headers["x-compaction-action"] == "shadow-compacted"
        assert answer.headers["x-compaction-shadow"] == "true"
        assert up.requests[-1].body == raw
        counted = client_of(proxy).messages.with_raw_response.count_tokens(
            model=SMALL, messages=messages, extra_headers=headers
        )
        assert counted.headers["x-compaction-action"] == "shadow-replayed"
        whole = up.count({"model": SMALL, "messages": messages})
        assert counted.parse().input_tokens == whole
        # Shadow mode off: the count is of the view the stored plan makes.
        headers["X-Compaction-Shadow"] = "0"
        counted = client_of(proxy).messages.with_raw_response.count_tokens(
            model=SMALL, messages=messages, extra_headers=headers
        )
        assert counted.headers["x-compaction-action"] == "replayed"
        assert "x-compaction-shadow" not in counted.headers
        assert counted.parse().input_tokens < whole
