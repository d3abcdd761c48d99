"""The fake upstream against the real openai SDK, byte by byte on the wire, and its behaviours."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import examples
from tests.fakes.base import Scripted
from tests.fakes.openai import (
    ApiError,
    FakeUpstream,
    check_window,
    count_prompt_tokens,
    validate_chat,
)
from tests.openai_examples import COOKBOOK

WINDOWS = {"gpt-4o-mini": 128_000, "small-8k": 8192, "gpt-4": 8192}
CHAT = "/v1/chat/completions"
# OpenAI cookbook "How to count tokens with tiktoken": the API counted 124 prompt tokens for
# these messages with gpt-4o-mini and 129 with gpt-4.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
HELLO = [{"role": "user", "content": "hello there"}]
O200K = tiktoken.get_encoding("o200k_base")


def expected_reply(prompt_tokens: int, last_user: str) -> str:
    mark = hashlib.blake2b(last_user.encode(), digest_size=4).hexdigest()
    return f"Fake reply to {mark}: {prompt_tokens} prompt tokens."


def error(message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = "server_error" if message.startswith("The server had") else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse_chunks(raw: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of a stream, checking OpenAI's framing byte by byte on the way."""
    assert raw.endswith(b"data: [DONE]\n\n") and raw.count(b"[DONE]") == 1
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    chunks = []
    for event in events[:-2]:
        assert event.startswith(b"data: ") and b"\n" not in event
        chunk = orjson.loads(event[len(b"data: ") :])
        assert orjson.dumps(chunk) == event[len(b"data: ") :]  # compact JSON, as OpenAI sends
        chunks.append(chunk)
    return chunks


@pytest.fixture(scope="module")
def up() -> Iterator[FakeUpstream]:
    with FakeUpstream(windows=WINDOWS) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh(up: FakeUpstream) -> None:
    up.reset()


@pytest.fixture
def client(up: FakeUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def http(up: FakeUpstream) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=up.origin, timeout=5) as session:
        yield session


# -- counting and answers -------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "tokens"), [("gpt-4o-mini", 124), ("gpt-4", 129)])
def test_counts_prompt_tokens_as_the_api_did(
    client: openai.OpenAI, model: str, tokens: int
) -> None:
    answer = client.chat.completions.create(model=model, messages=COOKBOOK)
    assert answer.usage is not None and answer.usage.prompt_tokens == tokens


def test_counts_names_tool_calls_tools_and_images() -> None:
    def n(text: str) -> int:
        return len(O200K.encode(text))

    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    messages = [
        {
            "role": "user",
            "name": "ann",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    expected = 3 + (3 + n("user") + n("ann") + 1 + n("look") + 85)
    expected += 3 + n("assistant") + n("get_weather") + n('{"city": "Oslo"}')
    expected += 3 + n("tool") + n("call_1") + n("sunny")
    assert count_prompt_tokens({"model": "gpt-4o", "messages": messages}) == expected
    schema = n(orjson.dumps(WEATHER["function"]).decode())
    with_tools = {"model": "gpt-4o", "messages": messages, "tools": [WEATHER]}
    assert count_prompt_tokens(with_tools) == expected + 12 + 7 + schema


def test_answers_like_openai_and_records_the_request(
    up: FakeUpstream, client: openai.OpenAI
) -> None:
    answer = client.chat.completions.create(model="gpt-4o-mini", messages=COOKBOOK, seed=7)
    content = answer.choices[0].message.content
    assert content == expected_reply(124, COOKBOOK[-1]["content"])
    assert answer.choices[0].finish_reason == "stop" and answer.object == "chat.completion"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == len(O200K.encode(content))
    assert answer.usage.total_tokens == 124 + answer.usage.completion_tokens
    (seen,) = up.requests
    assert (seen.method, seen.path) == ("POST", CHAT)
    assert seen.headers["Authorization"] == "Bearer sk-test"
    assert seen.json == {"model": "gpt-4o-mini", "messages": COOKBOOK, "seed": 7}
    assert orjson.loads(seen.body) == seen.json


async def test_async_sdk_streams_content_and_usage(up: FakeUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0) as aio:
        stream = await aio.chat.completions.create(
            model="gpt-4o-mini",
            messages=COOKBOOK,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected_reply(124, COOKBOOK[-1]["content"])
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 124
    assert chunks[-1].usage.completion_tokens == len(O200K.encode(text))


@pytest.mark.parametrize("include_usage", [True, False])
def test_sse_framing_byte_by_byte(http: httpx.Client, include_usage: bool) -> None:
    body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": HELLO, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    with http.stream("POST", CHAT, json=body) as response:
        raw = b"".join(response.iter_raw())
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "content-encoding" not in response.headers
    chunks = sse_chunks(raw)
    answer = [c for c in chunks if c["choices"]]
    assert {c["id"] for c in chunks} == {answer[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in answer]
    assert deltas[0] == {"role": "assistant", "content": "", "refusal": None}
    assert all(set(d) == {"content"} for d in deltas[1:-1]) and len(deltas) >= 5
    assert deltas[-1] == {} and answer[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in answer[:-1])
    prompt = count_prompt_tokens(body)
    assert "".join(d["content"] for d in deltas[1:-1]) == expected_reply(prompt, "hello there")
    if include_usage:
        assert all(c["usage"] is None for c in chunks[:-1])
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == prompt
    else:
        assert all("usage" not in c for c in chunks) and len(answer) == len(chunks)


def test_n_choices_and_max_tokens_truncation(client: openai.OpenAI, http: httpx.Client) -> None:
    full = expected_reply(
        count_prompt_tokens({"model": "gpt-4o-mini", "messages": HELLO}), "hello there"
    )
    answer = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO, n=2, max_tokens=3)
    assert [c.index for c in answer.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in answer.choices)
    assert answer.choices[1].message.content == O200K.decode(O200K.encode(full)[:3])
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    body = {"model": "gpt-4o-mini", "messages": HELLO, "n": 2, "stream": True}
    chunks = sse_chunks(http.post(CHAT, json=body).content)
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}


# -- tools ----------------------------------------------------------------------------------------


def test_tool_call_answer_round_trip(client: openai.OpenAI) -> None:
    asked = [{"role": "user", "content": "weather in Oslo?"}]
    answer = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=asked,
        tools=[WEATHER],
        extra_headers={"x-fake-behavior": "tool-call"},
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "x", "days": 1}
    assert answer.usage is not None and answer.usage.completion_tokens == len(
        O200K.encode("get_weather") + O200K.encode(call.function.arguments)
    )
    follow_up = [
        *asked,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    again = client.chat.completions.create(model="gpt-4o-mini", messages=follow_up, tools=[WEATHER])
    assert again.choices[0].message.content == expected_reply(
        count_prompt_tokens({"model": "gpt-4o-mini", "messages": follow_up, "tools": [WEATHER]}),
        "weather in Oslo?",
    )


def test_tool_call_streams_as_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=HELLO,
        tools=[TIME, WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    chunks = list(stream)
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name == "get_weather"
    assert len(deltas) > 2 and all(d.index == 0 and d.id is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(arguments) == {"city": "x", "days": 1}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("tool_choice", "behavior", "called"),
    [
        ("none", "tool-call", None),
        ("auto", "", None),
        ("required", "", "get_time"),
        ("auto", "tool-call", "get_time"),
    ],
)
def test_tool_choice_decides(
    client: openai.OpenAI, tool_choice: str, behavior: str, called: str | None
) -> None:
    answer = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=HELLO,
        tools=[TIME, WEATHER],
        tool_choice=tool_choice,
        extra_headers={"x-fake-behavior": behavior},
    )
    calls = answer.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ([called] if called else [])


# -- errors ---------------------------------------------------------------------------------------

PARSE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using"
    " your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was"
    " not valid JSON. If you have trouble figuring out how to fix this, please contact us through"
    " our help center at help.openai.com.)"
)
ORPHAN = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message"
    " with 'tool_calls'."
)
UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
    " 'tool_call_id'. The following tool_call_ids did not have response messages: "
)
CALLS = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in ("call_a", "call_b")
    ],
}
ANSWER_A = {"role": "tool", "tool_call_id": "call_a", "content": "A"}
ANSWER_B = {"role": "tool", "tool_call_id": "call_b", "content": "B"}


def chat(messages: Any, **fields: Any) -> bytes:
    return orjson.dumps({"model": "gpt-4o-mini", "messages": messages, **fields})


def missing(param: str) -> dict[str, Any]:
    return error(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def wrong_type(param: str, expected: str, got: str) -> dict[str, Any]:
    message = f"Invalid type for '{param}': expected {expected}, but got {got} instead."
    return error(message, param, "invalid_type")


EMPTY = (
    "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty"
    " array instead."
)
ROLES = "'system', 'assistant', 'user', 'function', 'tool', and 'developer'"
ONLY_STREAM = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
CONTENT = "one of a string or array of objects"
BELOW_MIN = "Invalid '{}': integer below minimum value. Expected a value >= 1, but got {} instead."
LOW = "integer_below_min_value"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"{not json", error(PARSE)),
        (b"[1, 2]", error(PARSE)),
        (b'{"messages": []}', error("you must provide a model parameter")),
        (b'{"model": 5, "messages": []}', wrong_type("model", "a string", "an integer")),
        (b'{"model": "gpt-4o-mini"}', missing("messages")),
        (chat("hi"), wrong_type("messages", "an array of objects", "a string")),
        (chat([]), error(EMPTY, "messages", "empty_array")),
        (chat([None]), wrong_type("messages[0]", "an object", "null")),
        (chat([{"content": "x"}]), missing("messages[0].role")),
        (
            chat([{"role": "bot", "content": "x"}]),
            error(
                f"Invalid value: 'bot'. Supported values are: {ROLES}.",
                "messages[0].role",
                "invalid_value",
            ),
        ),
        (chat([{"role": "user"}]), missing("messages[0].content")),
        (
            chat([{"role": "user", "content": 5}]),
            wrong_type("messages[0].content", CONTENT, "an integer"),
        ),
        (
            chat([*HELLO, CALLS, {"role": "tool", "content": "A"}]),
            missing("messages[2].tool_call_id"),
        ),
        (chat([*HELLO, ANSWER_A]), error(ORPHAN, "messages.[1].role")),
        (chat([*HELLO, CALLS]), error(UNANSWERED + "call_a, call_b", "messages.[1].role")),
        (
            chat([*HELLO, CALLS, ANSWER_A, *HELLO]),
            error(UNANSWERED + "call_b", "messages.[1].role"),
        ),
        (
            chat([*HELLO, CALLS, ANSWER_B, ANSWER_A, *HELLO, ANSWER_A]),
            error(ORPHAN, "messages.[5].role"),
        ),
        (chat(HELLO, tools=[{"type": "function"}]), missing("tools[0].function")),
        (chat(HELLO, stream_options={"include_usage": True}), error(ONLY_STREAM, "stream_options")),
        (chat(HELLO, stream="yes"), wrong_type("stream", "a boolean", "a string")),
        (chat(HELLO, stream="false"), wrong_type("stream", "a boolean", "a string")),
        (chat(HELLO, metadata="x"), wrong_type("metadata", "a metadata object", "a string")),
        (chat(HELLO, max_tokens=-5), error(BELOW_MIN.format("max_tokens", -5), "max_tokens", LOW)),
        (
            chat(HELLO, max_completion_tokens=0),
            error(BELOW_MIN.format("max_completion_tokens", 0), "max_completion_tokens", LOW),
        ),
        (chat(HELLO, max_tokens="5"), wrong_type("max_tokens", "an integer", "a string")),
    ],
)
def test_rejects_bad_requests_like_openai(
    http: httpx.Client, payload: bytes, expected: dict[str, Any]
) -> None:
    response = http.post(CHAT, content=payload, headers={"content-type": "application/json"})
    assert (response.status_code, response.json()) == (400, expected)


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/xyz"), ("GET", CHAT), ("PUT", "/x")])
def test_unknown_paths_are_invalid_urls(http: httpx.Client, method: str, path: str) -> None:
    response = http.request(method, path)
    assert response.status_code == 404 and response.headers["x-request-id"].startswith("req_")
    assert response.json() == error(f"Invalid URL ({method} {path})")


def padded(words: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "lorem " * words}]


def test_context_window_boundary_through_the_sdk(client: openai.OpenAI) -> None:
    messages = padded(3000)
    probe = client.chat.completions.create(model="small-8k", messages=messages)
    assert probe.usage is not None
    prompt = probe.usage.prompt_tokens
    assert 3000 <= prompt < 8192
    fits = client.chat.completions.create(
        model="small-8k",
        messages=messages,
        max_tokens=8192 - prompt,
    )
    assert fits.usage is not None and fits.usage.prompt_tokens == prompt
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="small-8k",
            messages=messages,
            max_completion_tokens=8193 - prompt,
        )
    assert (
        caught.value.body
        == error(
            "This model's maximum context length is 8192 tokens. However, you requested 8193"
            f" tokens ({prompt} in the messages, {8193 - prompt} in the completion). Please"
            " reduce the length of the messages or completion.",
            "messages",
            "context_length_exceeded",
        )["error"]
    )


@pytest.mark.parametrize(
    ("fields", "tail"),
    [
        ({}, "your messages resulted in {total} tokens. Please reduce the length of the messages."),
        (
            {"tools": [WEATHER]},
            "your messages resulted in {total} tokens ({messages} in the"
            " messages, {tools} in the functions). Please reduce the length of the messages or"
            " functions.",
        ),
        (
            {"tools": [WEATHER], "max_tokens": 100},
            "you requested {total} tokens ({messages} in the"
            " messages, {tools} in the functions, 100 in the completion). Please reduce the length"
            " of the messages, functions, or completion.",
        ),
    ],
)
def test_context_length_messages(http: httpx.Client, fields: dict[str, Any], tail: str) -> None:
    body = {"model": "gpt-4", "messages": padded(9000), **fields}
    messages = count_prompt_tokens({"model": "gpt-4", "messages": body["messages"]})
    tools = count_prompt_tokens(body) - messages
    total = messages + tools + fields.get("max_tokens", 0)
    response = http.post(CHAT, json=body)
    assert response.status_code == 400
    assert response.json() == error(
        "This model's maximum context length is 8192 tokens. However, "
        + tail.format(total=total, messages=messages, tools=tools),
        "messages",
        "context_length_exceeded",
    )


@settings(max_examples=examples(60), deadline=None)
@given(words=st.integers(0, 400), max_tokens=st.integers(0, 300), tools=st.booleans())
def test_window_is_prompt_plus_max_tokens(words: int, max_tokens: int, tools: bool) -> None:
    body: dict[str, Any] = {"model": "gpt-4o", "messages": padded(words), "max_tokens": max_tokens}
    if tools:
        body["tools"] = [WEATHER]
    needed = count_prompt_tokens(body) + max_tokens
    if needed <= 300:
        assert sum(check_window(body, 300)) == count_prompt_tokens(body)
    else:
        with pytest.raises(ApiError) as caught:
            check_window(body, 300)
        assert (
            f"However, {'you requested' if max_tokens else 'your messages resulted in'}"
            f" {needed} tokens" in caught.value.body["error"]["message"]
        )


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """System prompt, then rounds of a user message, tool blocks and an assistant answer."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    ids = iter(range(10**6))
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(st.text(max_size=8))})
        for _ in range(draw(st.integers(0, 3))):
            calls = [f"call_{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
            messages.append(
                {
                    **CALLS,
                    "tool_calls": [
                        {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        for c in calls
                    ],
                }
            )
            messages += [
                {"role": "tool", "tool_call_id": c, "content": "ok"}
                for c in draw(st.permutations(calls))
            ]
        messages.append({"role": "assistant", "content": "done"})
    return messages


def rejection(messages: list[dict[str, Any]]) -> dict[str, Any]:
    with pytest.raises(ApiError) as caught:
        validate_chat({"model": "gpt-4o", "messages": messages})
    return caught.value.body


@settings(max_examples=examples(80), deadline=None)
@given(messages=conversations(), data=st.data())
def test_tool_pairing_rules(messages: list[dict[str, Any]], data: st.DataObject) -> None:
    validate_chat({"model": "gpt-4o", "messages": messages})
    blocks = [i for i, m in enumerate(messages) if m.get("tool_calls")]
    if not blocks:
        return
    # drop one answer: its call is reported unanswered, at the assistant message
    answers = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    gone = data.draw(st.sampled_from(answers))
    owner = max(b for b in blocks if b < gone)
    unanswered = messages[:gone] + messages[gone + 1 :]
    missing = messages[gone]["tool_call_id"]
    assert rejection(unanswered) == error(UNANSWERED + missing, f"messages.[{owner}].role")
    # drop a call: its first answer is an orphan, now at the call's place
    dropped = data.draw(st.sampled_from(blocks))
    assert rejection(messages[:dropped] + messages[dropped + 1 :]) == error(
        ORPHAN, f"messages.[{dropped}].role"
    )


# -- behaviours -----------------------------------------------------------------------------------


def test_hang_sends_nothing_and_counts_the_cancel(up: FakeUpstream, client: openai.OpenAI) -> None:
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=HELLO,
            timeout=0.3,
            extra_headers={"x-fake-behavior": "hang"},
        )
    assert time.monotonic() - started >= 0.25
    assert up.wait_for(lambda: up.cancelled == 1)
    assert len(up.requests) == 1
    up.reset()
    assert (up.requests, up.cancelled) == ([], 0)


def test_slow_stream_and_client_disconnect(up: FakeUpstream, http: httpx.Client) -> None:
    body = {"model": "gpt-4o-mini", "messages": HELLO, "stream": True}
    started = time.monotonic()
    raw = http.post(CHAT, json=body, headers={"x-fake-behavior": "slow-stream:0.03"}).content
    events = len(sse_chunks(raw)) + 1
    assert time.monotonic() - started >= 0.03 * (events - 1)
    with http.stream("POST", CHAT, json=body, headers={"x-fake-behavior": "slow-stream:1"}) as r:
        assert next(r.iter_raw()).startswith(b"data: {") and up.cancelled == 0
    assert up.wait_for(lambda: up.cancelled == 1)


def test_default_behavior_and_stream_delay() -> None:
    # Delays long enough that the fast request stays under half of them on a loaded machine
    # (0.44 s against a limit of 0.23 s was seen, with the other workers beside it).
    with FakeUpstream(behavior="slow-stream", stream_delay=0.2) as slow:
        body = {"model": "gpt-4o-mini", "messages": HELLO, "stream": True}
        started = time.monotonic()
        raw = httpx.post(slow.base_url + "/chat/completions", json=body).content
        slow_time = 0.2 * len(sse_chunks(raw))
        assert time.monotonic() - started >= slow_time
        started = time.monotonic()  # the header replaces the default
        httpx.post(slow.base_url + "/chat/completions", json=body, headers={"x-fake-behavior": ""})
        assert time.monotonic() - started < slow_time / 2
    with pytest.raises(ValueError, match="sideways"):
        FakeUpstream(behavior="sideways")


def test_unknown_behavior_is_a_400(http: httpx.Client) -> None:
    response = http.post(CHAT, content=chat(HELLO), headers={"x-fake-behavior": "status:abc"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "unknown fake behavior 'status:abc'"


def test_reset_mid_stream(http: httpx.Client, client: openai.OpenAI) -> None:
    body = {"model": "gpt-4o-mini", "messages": HELLO, "stream": True}
    received = b""
    with (
        pytest.raises(httpx.ReadError),
        http.stream(
            "POST", CHAT, json=body, headers={"x-fake-behavior": "reset-mid-stream:3"}
        ) as r,
    ):
        for part in r.iter_raw():
            received += part
    assert received.count(b"data: ") == 3 and received.endswith(b"\n\n")
    assert b"[DONE]" not in received
    with pytest.raises(openai.APIConnectionError):  # a JSON answer is cut half way
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=HELLO,
            extra_headers={"x-fake-behavior": "reset-mid-stream"},
        )


@pytest.mark.parametrize(
    ("status", "kind", "code", "sdk_error"),
    [
        (429, "requests", "rate_limit_exceeded", openai.RateLimitError),
        (500, "server_error", None, openai.InternalServerError),
        (401, "invalid_request_error", "invalid_api_key", openai.AuthenticationError),
        (418, "invalid_request_error", None, openai.APIStatusError),
    ],
)
def test_status_behavior(
    client: openai.OpenAI, status: int, kind: str, code: str | None, sdk_error: type[Exception]
) -> None:
    with pytest.raises(sdk_error) as caught:
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=HELLO,
            extra_headers={"x-fake-behavior": f"status:{status}"},
        )
    failure = caught.value
    assert isinstance(failure, openai.APIStatusError) and failure.status_code == status
    assert isinstance(failure.body, dict) and set(failure.body) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert (failure.body["type"], failure.body["code"], failure.body["param"]) == (kind, code, None)
    with pytest.raises(sdk_error):  # every path
        client.models.list(extra_headers={"x-fake-behavior": f"status:{status}"})


@pytest.mark.parametrize("stream", [False, True])
def test_gzip_only_when_the_client_accepts_it(http: httpx.Client, stream: bool) -> None:
    body = {"model": "gpt-4o-mini", "messages": HELLO, "stream": stream}
    for accept, compressed in (("gzip, deflate", True), ("identity", False)):
        headers = {"x-fake-behavior": "gzip", "accept-encoding": accept}
        with http.stream("POST", CHAT, json=body, headers=headers) as response:
            raw = b"".join(response.iter_raw())
        assert (response.headers.get("content-encoding") == "gzip") is compressed
        assert raw.startswith(b"\x1f\x8b") is compressed
        plain = gzip.decompress(raw) if compressed else raw
        if stream:
            assert len(sse_chunks(plain)) > 3
        else:
            assert orjson.loads(plain)["object"] == "chat.completion"


def test_redirect_points_elsewhere(up: FakeUpstream, http: httpx.Client) -> None:
    response = http.post(CHAT, content=chat(HELLO), headers={"x-fake-behavior": "redirect"})
    assert response.status_code == 302
    assert response.headers["location"] == f"{up.origin}/elsewhere"
    assert [r.path for r in up.requests] == [CHAT]
    followed = http.post(
        CHAT, content=chat(HELLO), headers={"x-fake-behavior": "redirect"}, follow_redirects=True
    )
    assert followed.json() == {"followed": "redirect"}
    assert [r.path for r in up.requests] == [CHAT, CHAT, "/elsewhere"]


# -- summaries ------------------------------------------------------------------------------------

SUMMARY_ASK = [
    {"role": "system", "content": "You are compacting a conversation. Keep ids verbatim."},
    {"role": "user", "content": "user: deploy svc-42\nassistant: done"},
]


def test_summary_requests_go_to_the_hook() -> None:
    seen: list[dict[str, Any]] = []

    def hook(body: dict[str, Any]) -> str:
        seen.append(body)
        return "## Goal\ndeploy svc-42"

    with (
        FakeUpstream(summarizer=hook) as up,
        openai.OpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0) as client,
    ):
        by_prompt = client.chat.completions.create(model="gpt-4o-mini", messages=SUMMARY_ASK)
        assert by_prompt.choices[0].message.content == "## Goal\ndeploy svc-42"
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=HELLO,
            extra_headers={"x-compaction-summary": "1"},
        )
        ordinary = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        assert ordinary.choices[0].message.content != "## Goal\ndeploy svc-42"
        assert up.summary_calls == 2 and [b["messages"] for b in seen] == [SUMMARY_ASK, HELLO]
        long = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=SUMMARY_ASK,
            max_tokens=2,
            stream=True,
        )
        chunks = list(long)
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert text == O200K.decode(O200K.encode("## Goal\ndeploy svc-42")[:2])
        assert chunks[-1].choices[0].finish_reason == "length"


async def slow_summary(body: dict[str, Any]) -> str:
    await asyncio.sleep(0.01)
    return f"async summary of {len(body['messages'])}"


@pytest.mark.parametrize(
    ("hook", "status", "content"),
    [
        (slow_summary, 200, "async summary of 2"),
        (lambda body: None, 200, ""),
        (lambda body: RuntimeError("model overloaded"), 500, None),
        (lambda body: 1 / 0, 500, None),
    ],
)
def test_summary_hook_results(hook: Any, status: int, content: str | None) -> None:
    with FakeUpstream(summarizer=hook) as up:
        response = httpx.post(up.base_url + "/chat/completions", content=chat(SUMMARY_ASK))
        assert response.status_code == status and up.summary_calls == 1
        if content is None:
            assert response.json() == error(
                "The server had an error while processing your request. Sorry about that!"
            )
        else:
            assert response.json()["choices"][0]["message"]["content"] == content
            assert response.json()["usage"]["completion_tokens"] == len(O200K.encode(content))


def test_summary_delay_times_out_the_client() -> None:
    with FakeUpstream(summary_delay=1.0) as up:
        with (
            openai.OpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0) as client,
            pytest.raises(openai.APITimeoutError),
        ):
            client.chat.completions.create(model="gpt-4o-mini", messages=SUMMARY_ASK, timeout=0.2)
        assert up.summary_calls == 1
        assert up.wait_for(lambda: up.cancelled == 1)


# -- other endpoints, auth, bookkeeping -----------------------------------------------------------


def test_models_and_embeddings(up: FakeUpstream, client: openai.OpenAI, http: httpx.Client) -> None:
    assert [m.id for m in client.models.list()] == list(WINDOWS)
    sdk = client.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"])
    assert up.requests[-1].json["encoding_format"] == "base64"  # the SDK's default
    first, second = (d.embedding for d in sdk.data)
    assert len(first) == 8 and first != second and all(-1 <= v < 1 for v in first)
    assert sdk.usage.prompt_tokens == 2
    floats = http.post("/v1/embeddings", json={"model": "m", "input": "alpha", "dimensions": 4})
    assert floats.json()["data"][0]["embedding"] == first[:4]  # same vector, float, shortened
    without_input = http.post("/v1/embeddings", json={"model": "m"})
    assert (without_input.status_code, without_input.json()) == (400, missing("input"))


def test_api_key_is_checked_when_configured() -> None:
    with FakeUpstream(api_key="sk-right-key-1234") as up:
        with (
            openai.OpenAI(
                base_url=up.base_url, api_key="sk-right-key-1234", max_retries=0
            ) as right,
            openai.OpenAI(
                base_url=up.base_url, api_key="sk-wrong-key-9876", max_retries=0
            ) as wrong,
        ):
            assert right.chat.completions.create(model="gpt-4o-mini", messages=HELLO).choices
            with pytest.raises(openai.AuthenticationError) as caught:
                wrong.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        assert caught.value.code == "invalid_api_key"
        assert "sk-wrong-key-9876" not in caught.value.message and "9876" in caught.value.message
        anonymous = httpx.post(up.base_url + "/chat/completions", content=chat(HELLO))
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["message"].startswith("You didn't provide an API key.")


async def test_concurrent_requests_are_all_recorded(up: FakeUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0) as aio:
        answers = await asyncio.gather(
            *(
                aio.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": f"q{i}"}]
                )
                for i in range(24)
            )
        )
    assert len(answers) == len(up.requests) == 24
    assert sorted(r.json["messages"][0]["content"] for r in up.requests) == sorted(
        f"q{i}" for i in range(24)
    )


@pytest.mark.subprocess
def test_command_line_serves_until_stopped() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.openai", "--port", "0", "--window", "tiny=100"],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            base_url = process.stdout.readline().strip()
            models = httpx.get(base_url + "/models").json()
            assert [m["id"] for m in models["data"]] == ["tiny"]
            too_long = httpx.post(
                base_url + "/chat/completions", json={"model": "tiny", "messages": padded(200)}
            )
            assert too_long.json()["error"]["code"] == "context_length_exceeded"
        finally:
            process.terminate()
            process.wait(timeout=10)


# -- a scripted model and a server without the Responses API --------------------------------------


def test_a_script_answers_chat_completions_with_its_calls_and_texts(
    up: FakeUpstream, client: openai.OpenAI
) -> None:
    def script(headers: Any, body: dict[str, Any]) -> Scripted | None:
        turn = body["messages"][-1]["content"]
        if turn == "call":
            return Scripted(tool="get_weather", arguments={"city": "Oslo"})
        if turn == "missing":
            return Scripted(tool="get_time")
        return Scripted(text="All done.") if turn == "text" else None

    def ask(text: str) -> Any:
        messages = [{"role": "user", "content": text}]
        return client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=[WEATHER]
        )

    up.script = script
    try:
        (call,) = ask("call").choices[0].message.tool_calls or []
        assert call.function.name == "get_weather"
        assert orjson.loads(call.function.arguments) == {"city": "Oslo"}
        assert ask("text").choices[0].message.content == "All done."
        assert (ask("own").choices[0].message.content or "").startswith("Fake reply")
        with pytest.raises(openai.InternalServerError, match="'get_time', not among"):
            ask("missing")
    finally:
        up.script = None


def test_a_chat_only_server_has_no_responses_api() -> None:
    with (
        FakeUpstream(chat_only=True) as local,
        openai.OpenAI(base_url=local.base_url, api_key="sk-test", max_retries=0) as sdk,
    ):
        assert sdk.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}]
        ).choices
        with pytest.raises(openai.NotFoundError):
            sdk.responses.create(model="gpt-4o-mini", input="Hi")
