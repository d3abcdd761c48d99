"""Chat completions through the proxy with the real openai SDK: answers, bytes, headers, store."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
import redis

from proxy.observability.logs import JsonFormatter
from tests.conftest import SDK, ConfigFactory, metric
from tests.fakes.openai import (
    FakeUpstream,
    count_prompt_tokens,
    is_summary_request,
    reply_text,
)
from tests.servers import ServerThread, proxy_server

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
COMPACTION_HEADERS = (
    "x-compaction-session",
    "x-compaction-action",
    "x-compaction-store",
    "x-compaction-tokens-before",
    "x-compaction-tokens-after",
    "x-compaction-overhead-ms",
)


def check_compaction_headers(headers: httpx.Headers) -> None:
    for name in COMPACTION_HEADERS:
        assert name in headers, name
    assert int(headers["x-compaction-session"], 16) >= 0
    assert headers["x-compaction-action"] in ("none", "replayed", "compacted", "degraded")
    assert int(headers["x-compaction-tokens-before"]) > 0
    assert int(headers["x-compaction-tokens-after"]) > 0
    assert float(headers["x-compaction-overhead-ms"]) >= 0


def test_sync_sdk_completion_forwards_the_clients_bytes(
    server: ServerThread, upstream: FakeUpstream, sdk: SDK
) -> None:
    sent: list[httpx.Request] = []
    raw = sdk(server, sent).chat.completions.with_raw_response.create(
        model="small-8k", messages=HELLO
    )
    completion = raw.parse()

    prompt = count_prompt_tokens({"model": "small-8k", "messages": HELLO})
    assert completion.choices[0].message.content == reply_text(prompt, "hi")
    assert completion.usage is not None and completion.usage.prompt_tokens == prompt
    (received,) = upstream.requests
    assert (received.method, received.path) == ("POST", CHAT)
    assert received.body == sent[-1].content
    assert received.headers["authorization"] == "Bearer sk-test"
    check_compaction_headers(raw.headers)
    assert raw.headers["x-compaction-action"] == "none"
    assert raw.headers["x-compaction-store"] == "ok"
    assert raw.headers["x-compaction-tokens-before"] == raw.headers["x-compaction-tokens-after"]


def test_every_field_reaches_the_upstream_unchanged(
    server: ServerThread, upstream: FakeUpstream, sdk: SDK
) -> None:
    sent: list[httpx.Request] = []
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    completion = sdk(server, sent).chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "é?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        },
        n=2,
        logprobs=True,
        top_logprobs=2,
        temperature=0.2,
        seed=7,
        user="user-1",
        extra_body={"future_field": {"nested": [1, 2.5, None, "ü"]}, "x_vendor": True},
    )

    received = upstream.requests[-1]
    assert received.body == sent[-1].content
    assert received.json["future_field"] == {"nested": [1, 2.5, None, "ü"]}
    assert received.json["tool_choice"] == "required"
    assert received.json["n"] == 2
    assert len(completion.choices) == 2
    for choice in completion.choices:
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "get_weather"
        assert set(orjson.loads(call.function.arguments)) == {"city"}


async def test_async_sdk_tool_round_trip(server: ServerThread, upstream: FakeUpstream) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    async with openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="sk-test", max_retries=0
    ) as client:
        first = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            tools=[WEATHER],
            extra_headers={"x-fake-behavior": "tool-call"},
        )
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
        ]
        second = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            tools=[WEATHER],
        )

    assert first.choices[0].finish_reason == "tool_calls"
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content is not None
    assert second.choices[0].message.content.startswith("Fake reply to ")
    assert upstream.requests[-1].json["messages"] == messages


def test_hand_made_body_reaches_the_upstream_byte_for_byte(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    raw = (
        b'{ "messages" :[{"content":"caf\\u00e9  \\n","role":"user", "x_extra": [] }],\n'
        b' "model":"small-8k",   "temperature": 1.0e0, "x_unknown": {"b": [], "a": null} }\n'
    )
    response = http.post(
        server.url + CHAT,
        content=raw,
        headers={"content-type": "application/json", "authorization": "Bearer sk-test"},
    )
    assert response.status_code == 200
    assert response.headers["x-compaction-action"] == "none"
    (received,) = upstream.requests
    assert received.body == raw
    assert received.headers["content-type"] == "application/json"


def test_compaction_rewrites_what_goes_upstream(
    server: ServerThread, upstream: FakeUpstream, sdk: SDK
) -> None:
    history = [
        {"role": "user", "content": "word " * 3000},
        {"role": "assistant", "content": "ok " * 2000},
        {"role": "user", "content": "hello " * 2000},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "last"},
    ]
    sent: list[httpx.Request] = []
    raw = sdk(server, sent).chat.completions.with_raw_response.create(
        model="small-8k", messages=history
    )

    assert raw.http_response.status_code == 200  # the fake rejects prompts over its window
    check_compaction_headers(raw.headers)
    assert raw.headers["x-compaction-action"] in ("compacted", "degraded")
    before = int(raw.headers["x-compaction-tokens-before"])
    assert int(raw.headers["x-compaction-tokens-after"]) < before
    # the answered request, not a summary the proxy may have asked for on the side
    (forwarded,) = [r for r in upstream.requests if not is_summary_request(r.headers, r.json)]
    assert forwarded.json["messages"][-1] == history[-1]  # the current turn is never changed
    assert forwarded.body != sent[-1].content


@pytest.mark.parametrize(
    ("behavior", "stream", "status"),
    [("", False, 200), ("", True, 200), ("status:429", False, 429), ("status:500", True, 500)],
)
def test_compaction_headers_on_every_chat_completion(
    http: httpx.Client,
    server: ServerThread,
    upstream: FakeUpstream,
    behavior: str,
    stream: bool,
    status: int,
) -> None:
    body = {"model": "small-8k", "messages": HELLO, "stream": stream}
    response = http.post(server.url + CHAT, json=body, headers={"x-fake-behavior": behavior})
    assert response.status_code == status
    check_compaction_headers(response.headers)


def test_store_down_fails_open_and_readyz_says_so(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream, closed_port: int
) -> None:
    config = proxy_config(store={"url": f"redis://127.0.0.1:{closed_port}/0"})
    with proxy_server(config) as server:
        response = http.post(server.url + CHAT, json={"model": "small-8k", "messages": HELLO})
        assert response.status_code == 200
        assert response.headers["x-compaction-store"] == "unavailable"
        assert response.json()["choices"][0]["message"]["content"].startswith("Fake reply")
        ready = http.get(server.url + "/readyz")
        assert ready.status_code == 503
        assert ready.json()["store"] == "unavailable"
        assert metric(http, server, "compaction_proxy_store_errors_total", operation="get") >= 1
        assert http.get(server.url + "/healthz").status_code == 200


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own on the machine's Redis; its keys are deleted after."""
    prefix = "cptest:" + os.urandom(6).hex()
    yield prefix
    client = redis.Redis(host="127.0.0.1", port=6379)
    keys = list(client.scan_iter(match=prefix + ":*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_redis_store_serves_and_is_ready(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream, redis_prefix: str
) -> None:
    config = proxy_config(store={"url": "redis://127.0.0.1:6379/0", "key_prefix": redis_prefix})
    with proxy_server(config) as server:
        response = http.post(server.url + CHAT, json={"model": "small-8k", "messages": HELLO})
        assert response.status_code == 200
        assert response.headers["x-compaction-store"] == "ok"
        assert http.get(server.url + "/readyz").json() == {
            "status": "ready",
            "store": "ok",
            "tokenizer": "loaded",
        }


def test_metrics_count_requests(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    labels = {"route": "chat", "status": "200"}
    before = metric(http, server, "compaction_proxy_requests_total", **labels)
    latency = metric(http, server, "compaction_proxy_upstream_first_byte_seconds_count")
    passthrough = metric(
        http, server, "compaction_proxy_requests_total", route="passthrough", status="200"
    )
    http.post(server.url + CHAT, json={"model": "small-8k", "messages": HELLO})
    http.get(server.url + "/v1/models")

    assert metric(http, server, "compaction_proxy_requests_total", **labels) == before + 1
    assert metric(http, server, "compaction_proxy_upstream_first_byte_seconds_count") == latency + 1
    after = metric(
        http, server, "compaction_proxy_requests_total", route="passthrough", status="200"
    )
    assert after == passthrough + 1
    response = http.get(server.url + "/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    assert http.get(server.url + "/healthz").json() == {"status": "ok"}
    assert http.get(server.url + "/readyz").status_code == 200


def test_the_client_cannot_choose_the_upstream(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    with FakeUpstream() as decoy:
        elsewhere = f"127.0.0.1:{decoy.port}"
        headers = {
            "host": elsewhere,
            "x-forwarded-host": elsewhere,
            "x-forwarded-proto": "http",
            "forwarded": f"host={elsewhere}",
        }
        body = {
            "model": "small-8k",
            "messages": HELLO,
            "base_url": decoy.base_url,
            "api_base": decoy.base_url,
        }
        chat = http.post(server.url + CHAT, json=body, headers=headers)
        models = http.get(server.url + "/v1/models", headers=headers)
        assert decoy.requests == []
    assert chat.status_code == models.status_code == 200
    assert [r.path for r in upstream.requests] == [CHAT, "/v1/models"]
    assert upstream.requests[0].json["api_base"] == decoy.base_url  # forwarded, not obeyed
    assert upstream.requests[0].headers["host"] == f"127.0.0.1:{upstream.port}"


def test_routes_choose_the_upstream_by_model_and_by_policy_header(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    with FakeUpstream() as other:
        config = proxy_config(
            upstreams={"other": {"base_url": other.base_url}},
            default_upstream="fake",
            models=[{"match": "other-*", "upstream": "other"}],
            policies={"default": {}, "alt": {"target": 0.3}},
            routes=[{"policy": "alt", "policy_header": "alt", "upstream": "other"}],
        )
        with proxy_server(config) as server:

            def post(model: str, **headers: str) -> None:
                body = {"model": model, "messages": HELLO}
                response = http.post(server.url + CHAT, json=body, headers=headers)
                assert response.status_code == 200

            post("other-model")
            post("small-8k")
            post("small-8k", **{"x-compaction-policy": "alt"})
            post("small-8k", **{"x-compaction-policy": "unknown"})
        assert [r.json["model"] for r in other.requests] == ["other-model", "small-8k"]
        assert "x-compaction-policy" not in other.requests[-1].headers
    assert [r.json["model"] for r in upstream.requests] == ["small-8k", "small-8k"]


def test_logs_hold_no_credentials_or_message_text(
    http: httpx.Client,
    server: ServerThread,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret_key, secret_text = "sk-log-secret-4242", "my password is hunter2"
    headers = {"authorization": f"Bearer {secret_key}"}
    messages = [{"role": "user", "content": secret_text}]
    caplog.set_level(logging.DEBUG)
    for behavior in ("", "status:500", "reset-mid-stream"):
        for stream in (False, True):
            body = {"model": "small-8k", "messages": messages, "stream": stream}
            with contextlib.suppress(httpx.TransportError):
                http.post(
                    server.url + CHAT, json=body, headers={**headers, "x-fake-behavior": behavior}
                )
    assert caplog.records  # the proxy does log these requests
    formatter = JsonFormatter()
    for record in caplog.records:
        line = formatter.format(record)
        assert secret_key not in line and "hunter2" not in line
