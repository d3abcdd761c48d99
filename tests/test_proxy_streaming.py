"""Streamed chat completions: the upstream's SSE bytes, unbuffered and unchanged, and failures."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.conftest import ConfigFactory
from tests.fakes.openai import FakeUpstream, count_prompt_tokens, reply_text
from tests.servers import ServerThread, proxy_server

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
DONE = b"data: [DONE]\n\n"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        },
    },
}


def normalized(raw: bytes) -> bytes:
    """A stream with its random completion id and its timestamp fixed; the rest untouched."""
    raw = re.sub(rb'"id":"chatcmpl-[0-9a-f]+"', b'"id":"chatcmpl-X"', raw)
    return re.sub(rb'"created":\d+', b'"created":0', raw)


def events(raw: bytes) -> list[Any]:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]


def stream(
    http: httpx.Client, base: str, body: bytes, **headers: str
) -> tuple[httpx.Response, list[bytes]]:
    """POST a chat request and read the response body as raw chunks, as they arrive."""
    headers = {"content-type": "application/json", "authorization": "Bearer sk-test", **headers}
    with http.stream("POST", base + CHAT, content=body, headers=headers) as response:
        return response, list(response.iter_raw())


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"stream_options": {"include_usage": True}},
        {"stream_options": {"include_usage": False}, "n": 2},
        {"tools": [TOOL], "tool_choice": "required", "stream_options": {"include_usage": True}},
    ],
    ids=["plain", "usage", "n2", "tool-call"],
)
def test_the_client_gets_the_upstreams_bytes(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, fields: dict[str, Any]
) -> None:
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": HELLO, "stream": True, **fields})
    direct, direct_chunks = stream(http, upstream.origin, body)
    # The client accepts gzip and the upstream would compress: a stream still comes unzipped.
    proxied, chunks = stream(
        http, server.url, body, **{"accept-encoding": "gzip", "x-fake-behavior": "gzip"}
    )

    assert direct.status_code == proxied.status_code == 200
    raw = b"".join(chunks)
    assert normalized(raw) == normalized(b"".join(direct_chunks))
    assert raw.count(b"[DONE]") == 1 and raw.endswith(DONE)
    assert proxied.headers["content-type"].startswith("text/event-stream")
    assert proxied.headers["cache-control"] == "no-cache"
    assert proxied.headers["x-accel-buffering"] == "no"
    assert "content-encoding" not in proxied.headers
    received = upstream.requests[-1]
    assert received.body == body
    assert received.headers["accept-encoding"] == "identity"
    usage = [event["usage"] for event in events(raw) if event.get("usage")]
    asked = fields.get("stream_options", {}).get("include_usage", False)
    assert len(usage) == (1 if asked else 0)
    if not asked:
        assert b'"usage"' not in raw  # the proxy never adds a chunk the client did not ask for


def test_sync_and_async_sdk_streams(server: ServerThread, upstream: FakeUpstream) -> None:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0) as client:
        chunks = list(client.chat.completions.create(model="small-8k", messages=HELLO, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        prompt = count_prompt_tokens({"model": "small-8k", "messages": HELLO})
        assert text == reply_text(prompt, "hi")
        assert all(c.usage is None for c in chunks)


async def test_async_sdk_stream_with_usage(server: ServerThread, upstream: FakeUpstream) -> None:
    async with openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="sk-test", max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model="small-8k",
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    prompt = count_prompt_tokens({"model": "small-8k", "messages": HELLO})
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == prompt
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_first_event_arrives_before_the_upstream_finishes(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    body = orjson.dumps({"model": "small-8k", "messages": HELLO, "stream": True})
    started = time.perf_counter()
    arrivals: list[float] = []
    headers = {"x-fake-behavior": "slow-stream:0.1", "content-type": "application/json"}
    with http.stream("POST", server.url + CHAT, content=body, headers=headers) as response:
        for _ in response.iter_raw():
            arrivals.append(time.perf_counter() - started)
    # 9 events, 0.1 s apart: the upstream needs 0.8 s, and each event is relayed as it comes.
    assert arrivals[-1] >= 0.75
    assert arrivals[0] < 0.2
    assert len(arrivals) >= 5


def test_a_stream_reset_by_the_upstream_is_not_completed(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    body = orjson.dumps({"model": "small-8k", "messages": HELLO, "stream": True})
    received: dict[str, list[bytes]] = {"direct": [], "proxied": []}
    for name, base in (("direct", upstream.origin), ("proxied", server.url)):
        headers = {"x-fake-behavior": "reset-mid-stream", "content-type": "application/json"}
        with (
            pytest.raises(httpx.TransportError),
            http.stream("POST", base + CHAT, content=body, headers=headers) as response,
        ):
            for chunk in response.iter_raw():
                received[name].append(chunk)

    proxied = b"".join(received["proxied"])
    assert normalized(proxied) == normalized(b"".join(received["direct"]))
    assert len(events(proxied)) == 2  # the events sent before the reset
    assert b"[DONE]" not in proxied

    with openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0) as client:
        chunks = []
        with pytest.raises((httpx.TransportError, openai.APIConnectionError)):
            for chunk in client.chat.completions.create(
                model="small-8k",
                messages=HELLO,
                stream=True,
                extra_headers={"x-fake-behavior": "reset-mid-stream"},
            ):
                chunks.append(chunk)
        assert len(chunks) == 2
        assert http.post(
            server.url + CHAT, json={"model": "small-8k", "messages": HELLO}
        ).is_success


def test_a_stalled_stream_ends_without_done(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    config = proxy_config(upstreams={"fake": {"timeouts": {"stream_idle": 0.3}}})
    body = orjson.dumps({"model": "small-8k", "messages": HELLO, "stream": True})
    chunks: list[bytes] = []
    with proxy_server(config) as server:
        headers = {"x-fake-behavior": "slow-stream:2", "content-type": "application/json"}
        with (
            pytest.raises(httpx.TransportError),
            http.stream("POST", server.url + CHAT, content=body, headers=headers) as response,
        ):
            for chunk in response.iter_raw():
                chunks.append(chunk)
        assert upstream.wait_for(lambda: upstream.cancelled == 1)
    raw = b"".join(chunks)
    assert len(events(raw)) == 1
    assert b"[DONE]" not in raw


def test_client_disconnect_mid_stream_cancels_the_upstream(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    body = orjson.dumps({"model": "small-8k", "messages": HELLO, "stream": True})
    headers = {"x-fake-behavior": "slow-stream:0.5", "content-type": "application/json"}
    with http.stream("POST", server.url + CHAT, content=body, headers=headers) as response:
        first = next(response.iter_raw())
    assert first.startswith(b"data: {")
    assert upstream.wait_for(lambda: upstream.cancelled == 1)
    assert http.post(server.url + CHAT, json={"model": "small-8k", "messages": HELLO}).is_success


async def test_async_sdk_closing_a_stream_cancels_the_upstream(
    server: ServerThread, upstream: FakeUpstream
) -> None:
    async with openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="sk-test", max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model="small-8k",
            messages=HELLO,
            stream=True,
            extra_headers={"x-fake-behavior": "slow-stream:0.5"},
        )
        async for chunk in stream:
            assert chunk.choices[0].delta.role == "assistant"
            break
        await stream.close()
    assert await asyncio.to_thread(upstream.wait_for, lambda: upstream.cancelled == 1)
