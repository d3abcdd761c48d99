"""The fake Anthropic API against the real anthropic SDK: validation, counting, caching, SSE."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
import tiktoken

from tests.fakes.anthropic import FakeAnthropic, scaled
from tests.fakes.base import Scripted, default_summary
from tests.fakes.openai import SUMMARY_PROMPT_PREFIX

KEY = "sk-ant-test"
MODEL = "claude-fake-sonnet"  # not in the SDK's deprecation or thinking warning lists
HAIKU = "claude-fake-haiku"
WINDOWS = {MODEL: 200_000, HAIKU: 200_000, "claude-small": 4000, "claude-long": 3000}
CL100K = tiktoken.get_encoding("cl100k_base")
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}
THINKING = {"type": "enabled", "budget_tokens": 1024}
HELLO = [{"role": "user", "content": "Hello, world"}]
# Words that cl100k keeps as one token each, so lengths are easy to aim at.
BIG = " ".join(f"w{i}" for i in range(500))  # 1000 cl100k tokens


def tokens(text: str) -> int:
    """The fake's count of a text: cl100k tokens times 1.15, rounded up."""
    return scaled(len(CL100K.encode(text)))


def sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The events of a stream, checking Anthropic's framing on the way."""
    assert raw.endswith(b"\n\n")
    events = []
    for chunk in raw.split(b"\n\n")[:-1]:
        event, data = chunk.split(b"\n")
        assert event.startswith(b"event: ") and data.startswith(b"data: ")
        payload = orjson.loads(data[len(b"data: ") :])
        assert payload["type"] == event[len(b"event: ") :].decode()
        events.append((payload["type"], payload))
    return events


@pytest.fixture(scope="module")
def up() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(
        windows=WINDOWS,
        long_context={"claude-long"},
        long_context_window=50_000,
        max_output={"claude-small": 1000},
        api_key=KEY,
    ) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh(up: FakeAnthropic) -> None:
    up.reset()
    up.behavior, up.summarizer, up.stream_delay = "", default_summary, 0.05


@pytest.fixture
def client(up: FakeAnthropic) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=up.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def http(up: FakeAnthropic) -> Iterator[httpx.Client]:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=up.base_url, headers=headers, timeout=10) as client:
        yield client


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 100, "messages": HELLO, **fields}


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    """(status, error type, message), checking Anthropic's error shape and request id."""
    data = response.json()
    assert set(data) == {"type", "error", "request_id"} and data["type"] == "error"
    assert set(data["error"]) == {"type", "message"}
    assert data["request_id"] == response.headers["request-id"]
    assert data["request_id"].startswith("req_")
    return response.status_code, data["error"]["type"], data["error"]["message"]


def rejects(http: httpx.Client, payload: dict[str, Any], path: str = "/v1/messages") -> str:
    """The message of the 400 invalid_request_error the fake answers."""
    status, kind, message = error_of(http.post(path, json=payload))
    assert (status, kind) == (400, "invalid_request_error"), message
    return message


def tool_round(
    client: anthropic.Anthropic, **extra: Any
) -> tuple[list[dict[str, Any]], anthropic.types.Message]:
    """A first turn answered with a tool call: the history to send back, and the call."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    call = client.messages.create(
        model=MODEL,
        max_tokens=2000,
        messages=history,
        tools=[WEATHER],
        extra_headers={"x-fake-behavior": "tool-call"},
        **extra,
    )
    use = next(b for b in call.content if b.type == "tool_use")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C."}
    history += [call.to_param(), {"role": "user", "content": [result]}]
    return history, call


# -- answers through the SDK ----------------------------------------------------------------------


def test_message_and_count_tokens_agree(client: anthropic.Anthropic, up: FakeAnthropic) -> None:
    message = client.messages.create(model=MODEL, max_tokens=100, messages=HELLO)
    expected = 7 + 3 + tokens("Hello, world")  # request and message overheads
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == MODEL
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    [block] = message.content
    assert block.type == "text" and block.text.endswith(f": {expected} prompt tokens.")
    assert message.usage.input_tokens == expected
    assert message.usage.output_tokens == tokens(block.text)
    assert message.usage.cache_read_input_tokens == message.usage.cache_creation_input_tokens == 0
    count = client.messages.count_tokens(model=MODEL, messages=HELLO)
    assert count.input_tokens == expected == up.count(body())
    [request, _] = up.requests
    assert (request.method, request.path) == ("POST", "/v1/messages")
    assert request.json == {"model": MODEL, "max_tokens": 100, "messages": HELLO}
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["anthropic-version"]


def test_counts_tools_system_images_and_documents(client: anthropic.Anthropic) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "AA"}
    content = [{"type": "text", "text": "Look"}, image, {"type": "document", "source": pdf}]
    messages = [{"role": "user", "content": content}]
    plain = client.messages.count_tokens(model=MODEL, messages=messages).input_tokens
    assert plain == 7 + 3 + tokens("Look") + 1600 + 1600
    with_system = client.messages.count_tokens(model=MODEL, messages=messages, system="Be brief.")
    assert with_system.input_tokens == plain + tokens("Be brief.")
    with_tools = client.messages.count_tokens(model=MODEL, messages=messages, tools=[WEATHER])
    schema = orjson.dumps(WEATHER, option=orjson.OPT_SORT_KEYS).decode()
    assert with_tools.input_tokens == plain + 346 + tokens(schema)  # the tool-use system prompt


def test_streamed_events_are_framed_as_anthropic_frames_them(
    http: httpx.Client, client: anthropic.Anthropic
) -> None:
    whole = client.messages.create(model=MODEL, max_tokens=100, messages=HELLO)
    response = http.post("/v1/messages", json=body(stream=True))
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse(response.content)
    names = [name for name, _ in events]
    assert names[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert names[-4:] == [
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == whole.usage.input_tokens
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(e["delta"]["text"] for name, e in events if name == "content_block_delta")
    assert text == whole.content[0].text
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole.usage.output_tokens


def test_sdk_stream_helper_and_raw_stream(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=100, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text and final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 7 + 3 + tokens("Hello, world")
    kinds = [
        event.type
        for event in client.messages.create(
            model=MODEL, max_tokens=100, messages=HELLO, stream=True
        )
    ]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]


def test_max_tokens_and_stop_sequences(client: anthropic.Anthropic) -> None:
    cut = client.messages.create(model=MODEL, max_tokens=3, messages=HELLO)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert cut.content[0].text == CL100K.decode(CL100K.encode("Fake reply to")[:2])
    stopped = client.messages.create(
        model=MODEL, max_tokens=100, messages=HELLO, stop_sequences=[":"]
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == ":"
    assert ":" not in stopped.content[0].text
    warm = client.messages.create(model=MODEL, max_tokens=0, messages=HELLO)  # a cache warm-up
    assert (warm.content, warm.stop_reason, warm.usage.output_tokens) == ([], "max_tokens", 0)


def test_tool_use_round_trip(client: anthropic.Anthropic, up: FakeAnthropic) -> None:
    history, call = tool_round(client)
    assert call.stop_reason == "tool_use"
    [use] = call.content
    assert use.type == "tool_use" and use.id.startswith("toolu_01") and use.name == "get_weather"
    assert use.input == {"city": "x", "days": 1}
    answer = client.messages.create(model=MODEL, max_tokens=100, messages=history, tools=[WEATHER])
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text"
    up.behavior = "tool-call"
    with client.messages.stream(
        model=MODEL, max_tokens=100, messages=HELLO, tools=[WEATHER]
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].input == {"city": "x", "days": 1}  # rebuilt from input_json_delta
    forced = client.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=HELLO,
        tools=[WEATHER],
        tool_choice={"type": "none"},
    )
    assert forced.stop_reason == "end_turn"


# -- thinking -------------------------------------------------------------------------------------


def test_thinking_blocks_are_signed_and_checked(
    client: anthropic.Anthropic, up: FakeAnthropic
) -> None:
    history, call = tool_round(client, thinking=THINKING)
    thought, use = call.content
    assert thought.type == "thinking" and thought.thinking.startswith("Fake thinking")
    assert thought.signature == up.sign(thought.thinking) and use.type == "tool_use"
    answer = client.messages.create(
        model=MODEL, max_tokens=2000, messages=history, tools=[WEATHER], thinking=THINKING
    )
    assert [b.type for b in answer.content] == ["thinking", "text"]

    edited = [dict(m) for m in history]
    edited[1]["content"] = [
        {"type": "thinking", "thinking": thought.thinking + "!", "signature": thought.signature},
        use.model_dump(exclude_none=True),
    ]
    with pytest.raises(anthropic.BadRequestError) as invalid:
        client.messages.create(
            model=MODEL, max_tokens=2000, messages=edited, tools=[WEATHER], thinking=THINKING
        )
    assert invalid.value.body["error"]["message"] == (
        "messages.1.content.0: Invalid `signature` in `thinking` block"
    )

    edited[1]["content"] = [use.model_dump(exclude_none=True)]  # the thinking block dropped
    with pytest.raises(anthropic.BadRequestError) as dropped:
        client.messages.create(
            model=MODEL, max_tokens=2000, messages=edited, tools=[WEATHER], thinking=THINKING
        )
    assert dropped.value.body["error"]["message"] == (
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found"
        " `tool_use`. When `thinking` is enabled, a final `assistant` message must start with a"
        " thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We"
        " recommend you include thinking blocks from previous turns. To avoid this requirement,"
        " disable `thinking`. Please consult our documentation at"
        " https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    )


def test_thinking_of_earlier_turns_is_not_counted(up: FakeAnthropic) -> None:
    thought = {"type": "thinking", "thinking": "Let me think. " * 20, "signature": ""}
    thought["signature"] = up.sign(thought["thinking"])
    use = {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "P"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "Sunny"}
    loop = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [thought, use]},
        {"role": "user", "content": [result]},
    ]
    bare = [loop[0], {"role": "assistant", "content": [use]}, loop[2]]
    with_thinking = up.count({"model": MODEL, "messages": loop, "tools": [WEATHER]})
    without = up.count({"model": MODEL, "messages": bare, "tools": [WEATHER]})
    assert with_thinking - without == tokens(thought["thinking"]) + 16  # the current tool loop
    later = [*loop, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Ok"}]
    later_bare = [*bare, *later[3:]]
    assert up.count({"model": MODEL, "messages": later, "tools": [WEATHER]}) == up.count(
        {"model": MODEL, "messages": later_bare, "tools": [WEATHER]}
    )  # an earlier turn's thinking is stripped


def test_omitted_and_redacted_thinking_round_trip(client: anthropic.Anthropic) -> None:
    omitted = {"type": "adaptive", "display": "omitted"}
    history, call = tool_round(client, thinking=omitted)
    assert call.content[0].type == "thinking" and call.content[0].thinking == ""
    client.messages.create(
        model=MODEL, max_tokens=2000, messages=history, tools=[WEATHER], thinking=omitted
    )
    redacted = client.messages.create(
        model=MODEL,
        max_tokens=2000,
        messages=HELLO,
        thinking=THINKING,
        extra_headers={"x-fake-behavior": "redacted-thinking"},
    )
    block = redacted.content[0]
    assert block.type == "redacted_thinking"
    history = [*HELLO, redacted.to_param(), {"role": "user", "content": "And?"}]
    client.messages.create(model=MODEL, max_tokens=2000, messages=history, thinking=THINKING)
    history[1] = {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "AAAA"}]}
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=2000, messages=history, thinking=THINKING)


# -- validation -----------------------------------------------------------------------------------

USE = {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "P"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "Sunny"}
ASK = {"role": "user", "content": "Weather?"}
CALLED = {"role": "assistant", "content": [USE]}
CC = {"type": "ephemeral"}
MISSING = (
    "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after:"
    " toolu_01A. Each `tool_use` block must have a corresponding `tool_result` block in the next"
    " message."
)
UNEXPECTED = (
    "messages.{}.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_01A."
    " Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
)


def _five_breakpoints() -> dict[str, Any]:
    text = [{"type": "text", "text": f"part {i}", "cache_control": CC} for i in range(5)]
    return body(messages=[{"role": "user", "content": text}])


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("extra field", body(foo=1), "foo: Extra inputs are not permitted"),
    ("no max_tokens", {"model": MODEL, "messages": HELLO}, "max_tokens: Field required"),
    (
        "metadata",
        body(metadata={"user_id": "u", "session_id": "s"}),
        "metadata.session_id: Extra inputs are not permitted",
    ),
    (
        "beta field without its beta",
        body(context_management={"edits": []}),
        "context_management: Extra inputs are not permitted",
    ),
    (
        "empty messages",
        body(messages=[]),
        "messages: List should have at least 1 item after validation, not 0",
    ),
    (
        "role",
        body(messages=[{"role": "tool", "content": "x"}]),
        "messages.0.role: Input should be 'user', 'assistant' or 'system'",
    ),
    (
        "tool_use input",
        body(messages=[ASK, {"role": "assistant", "content": [{**USE, "input": "{}"}]}]),
        "messages.1.content.0.tool_use.input: Input should be a valid dictionary",
    ),
    (
        "cache_control on thinking",
        body(
            messages=[
                ASK,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": "s", "cache_control": CC}
                    ],
                },
            ]
        ),
        "messages.1.content.0.thinking.cache_control: Extra inputs are not permitted",
    ),
    ("tool_use without result", body(messages=[ASK, CALLED, ASK]), MISSING),
    (
        "result after text",
        body(
            messages=[
                ASK,
                CALLED,
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, RESULT]},
            ]
        ),
        MISSING,
    ),
    (
        "result without use",
        body(
            messages=[
                ASK,
                {"role": "assistant", "content": "Ok"},
                {"role": "user", "content": [RESULT]},
            ]
        ),
        UNEXPECTED.format(2),
    ),
    ("result first", body(messages=[{"role": "user", "content": [RESULT]}]), UNEXPECTED.format(0)),
    (
        "empty message",
        body(messages=[ASK, {"role": "assistant", "content": []}, ASK]),
        "messages.1: all messages must have non-empty content except for the optional final"
        " assistant message",
    ),
    (
        "empty text block",
        body(messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}]),
        "messages: text content blocks must be non-empty",
    ),
    (
        "prefill ending in whitespace",
        body(messages=[ASK, {"role": "assistant", "content": "The answer is "}]),
        "messages: final assistant content cannot end with trailing whitespace",
    ),
    (
        "five breakpoints",
        _five_breakpoints(),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    (
        "1h after 5m",
        body(
            system=[{"type": "text", "text": "Be brief.", "cache_control": CC}],
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Hi", "cache_control": {**CC, "ttl": "1h"}}
                    ],
                }
            ],
        ),
        "messages.0.content.0.cache_control.ttl: a ttl='1h' cache_control block must not come"
        " after a ttl='5m' cache_control block. Note that blocks are processed in the following"
        " order: `tools`, `system`, `messages`.",
    ),
    (
        "ttl value",
        body(system=[{"type": "text", "text": "Hi", "cache_control": {**CC, "ttl": "10m"}}]),
        "system.0.cache_control.ephemeral.ttl: Input should be '5m' or '1h'",
    ),
    (
        "small thinking budget",
        body(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 500}),
        "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
    ),
    (
        "forced tool with thinking",
        body(max_tokens=2000, thinking=THINKING, tools=[WEATHER], tool_choice={"type": "any"}),
        "Thinking may not be enabled when tool_choice forces tool use.",
    ),
    (
        "tool_choice without tools",
        body(tool_choice={"type": "auto"}),
        "tool_choice may only be specified while providing tools.",
    ),
    ("duplicate tools", body(tools=[WEATHER, WEATHER]), "tools: Tool names must be unique."),
    (
        "OpenAI-style tool",
        body(tools=[{"name": "f", "parameters": {"type": "object"}}]),
        "tools.0.custom.parameters: Extra inputs are not permitted",
    ),
]


@pytest.mark.parametrize(
    ("payload", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_rejects_as_the_api_does(http: httpx.Client, payload: dict[str, Any], message: str) -> None:
    assert rejects(http, payload) == message


def test_rejects_unknown_blocks_and_budgets(http: httpx.Client) -> None:
    url = {"type": "image_url", "image_url": {"url": "x"}}
    message = rejects(http, body(messages=[{"role": "user", "content": [url]}]))
    assert message.startswith(
        "messages.0.content.0: Input tag 'image_url' found using 'type' does not match any of the"
        " expected tags: 'bash_code_execution_tool_result', "
    )
    assert "'text', " in message and "'tool_result', " in message
    message = rejects(http, body(max_tokens=1024, thinking=THINKING))
    assert message.startswith("`max_tokens` must be greater than `thinking.budget_tokens`.")


VALID: list[tuple[str, list[dict[str, Any]]]] = [
    ("consecutive turns merged", [ASK, ASK]),
    ("assistant first", [{"role": "assistant", "content": "Hi."}, ASK]),
    ("prefill", [ASK, {"role": "assistant", "content": "The answer is"}]),
    ("empty final assistant", [ASK, {"role": "assistant", "content": ""}]),
    ("system after user", [ASK, {"role": "system", "content": "Be brief."}]),
    (
        "results then text",
        [ASK, CALLED, {"role": "user", "content": [RESULT, {"type": "text", "text": "More?"}]}],
    ),
    ("results over two user messages", [ASK, CALLED, {"role": "user", "content": [RESULT]}, ASK]),
]


@pytest.mark.parametrize("messages", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_accepts_as_the_api_does(http: httpx.Client, messages: list[dict[str, Any]]) -> None:
    response = http.post("/v1/messages", json=body(messages=messages, tools=[WEATHER]))
    assert response.status_code == 200, response.text


def test_first_user_rule_on_request() -> None:
    with FakeAnthropic(user_first=True) as strict:
        headers = {"anthropic-version": "2023-06-01"}
        payload = body(messages=[{"role": "assistant", "content": "Hi."}, ASK])
        response = httpx.post(f"{strict.base_url}/v1/messages", json=payload, headers=headers)
    assert error_of(response)[2] == 'messages: first message must use the "user" role'


def test_beta_fields_and_beta_path(client: anthropic.Anthropic, up: FakeAnthropic) -> None:
    message = client.beta.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=HELLO,
        betas=["context-management-2025-06-27"],
        context_management={"edits": []},
        extra_query={"beta": "true"},  # as Claude Code sends it
    )
    assert message.stop_reason == "end_turn"
    request = up.requests[-1]
    assert (request.path, request.query) == ("/v1/messages", "beta=true")
    assert request.headers["anthropic-beta"] == "context-management-2025-06-27"


def test_a_turns_own_output_config_needs_its_beta(http: httpx.Client) -> None:
    turn = {"role": "user", "content": "Hi", "output_config": {"effort": "medium"}}
    payload = body(messages=[turn])
    assert rejects(http, payload) == "messages.0.output_config: Extra inputs are not permitted"
    beta = {"anthropic-beta": "per-turn-control-2026-07-01"}  # Claude Code 2.1.332's
    answer = http.post("/v1/messages", json=payload, headers=beta)
    assert answer.status_code == 200, answer.text


def test_thinking_display_updates_needs_its_beta(http: httpx.Client) -> None:
    thinking = {**THINKING, "display": "updates"}
    payload = body(max_tokens=2000, thinking=thinking)
    message = rejects(http, payload)
    assert message == "thinking.enabled.display: Input should be 'summarized' or 'omitted'"
    beta = {"anthropic-beta": "thinking-display-updates-2026-08-18"}  # Claude Code 2.1.332's
    answer = http.post("/v1/messages", json=payload, headers=beta)
    assert answer.status_code == 200, answer.text
    assert answer.json()["content"][0]["thinking"].startswith("Fake thinking")


def test_count_tokens_validates_the_same_way(http: httpx.Client) -> None:
    count = {"model": MODEL, "messages": [ASK, CALLED, ASK]}
    assert rejects(http, count, "/v1/messages/count_tokens") == MISSING
    extra = {"model": MODEL, "messages": HELLO, "max_tokens": 10}
    message = rejects(http, extra, "/v1/messages/count_tokens")
    assert message == "max_tokens: Extra inputs are not permitted"


# -- the window -----------------------------------------------------------------------------------


def test_both_overflow_errors(client: anthropic.Anthropic) -> None:
    long = [{"role": "user", "content": BIG * 4}]
    total = client.messages.count_tokens(model="claude-small", messages=long).input_tokens
    assert total > 4000
    with pytest.raises(anthropic.BadRequestError) as too_long:
        client.messages.create(model="claude-small", max_tokens=100, messages=long)
    assert too_long.value.body["error"]["message"] == (
        f"prompt is too long: {total} tokens > 4000 maximum"
    )
    fits = [{"role": "user", "content": BIG}] * 3
    total = client.messages.count_tokens(model="claude-small", messages=fits).input_tokens
    assert total < 4000 < total + 1000
    with pytest.raises(anthropic.BadRequestError) as with_output:
        client.messages.create(model="claude-small", max_tokens=1000, messages=fits)
    assert with_output.value.body["error"]["message"] == (
        f"input length and `max_tokens` exceed context limit: {total} + 1000 > 4000, decrease"
        " input length or `max_tokens` and try again"
    )
    with pytest.raises(anthropic.BadRequestError) as capped:
        client.messages.create(model="claude-small", max_tokens=1500, messages=HELLO)
    assert capped.value.body["error"]["message"] == (
        "max_tokens: 1500 > 1000, which is the maximum allowed number of output tokens for"
        " claude-small"
    )


def test_long_context_beta_header(client: anthropic.Anthropic) -> None:
    long = [{"role": "user", "content": BIG * 4}]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="claude-long", max_tokens=100, messages=long)
    beta = {"anthropic-beta": "interleaved-thinking-2025-05-14,context-1m-2025-08-07"}
    message = client.messages.create(
        model="claude-long", max_tokens=100, messages=long, extra_headers=beta
    )
    assert message.usage.input_tokens > 4000
    with pytest.raises(anthropic.BadRequestError):  # only for the models that have it
        client.messages.create(
            model="claude-small", max_tokens=100, messages=long, extra_headers=beta
        )


# -- prompt caching -------------------------------------------------------------------------------


def cached_system(ttl: str = "5m") -> list[dict[str, Any]]:
    return [{"type": "text", "text": BIG, "cache_control": {"type": "ephemeral", "ttl": ttl}}]


def usage_of(client: anthropic.Anthropic, **fields: Any) -> tuple[int, int, int]:
    """(cache read, cache creation, input) tokens of a request."""
    fields = {"model": MODEL, "max_tokens": 10, "messages": HELLO, **fields}
    usage = client.messages.create(**fields).usage
    total = client.messages.count_tokens(
        **{k: v for k, v in fields.items() if k != "max_tokens"}
    ).input_tokens
    read, created = usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0
    assert read + created + usage.input_tokens == total
    return read, created, usage.input_tokens


def test_cache_write_read_and_expiry(client: anthropic.Anthropic, up: FakeAnthropic) -> None:
    prefix = 7 + tokens(BIG)
    rest = 3 + tokens("Hello, world")
    assert prefix >= 1024
    assert usage_of(client, system=cached_system()) == (0, prefix, rest)
    other = [{"role": "user", "content": "Another question"}]
    assert usage_of(client, system=cached_system(), messages=other) == (
        prefix,
        0,
        3 + tokens("Another question"),
    )
    up.advance(200)
    assert usage_of(client, system=cached_system())[0] == prefix  # a read refreshes the entry
    up.advance(200)
    assert usage_of(client, system=cached_system())[0] == prefix
    up.advance(301)
    assert usage_of(client, system=cached_system()) == (0, prefix, rest)
    assert up.cache_entries == 1


def test_one_hour_ttl(client: anthropic.Anthropic, up: FakeAnthropic) -> None:
    usage = client.messages.create(
        model=MODEL, max_tokens=10, messages=HELLO, system=cached_system("1h")
    ).usage
    assert usage.cache_creation.ephemeral_1h_input_tokens == 7 + tokens(BIG)
    assert usage.cache_creation.ephemeral_5m_input_tokens == 0
    up.advance(301)
    assert usage_of(client, system=cached_system("1h"))[0] == 7 + tokens(BIG)
    up.advance(3601)
    assert usage_of(client, system=cached_system("1h"))[0] == 0


def conversation(turns: int, cached: set[int]) -> list[dict[str, Any]]:
    """A big first user message, then short turns; `cached` holds the message indexes with a
    breakpoint on their (only) block."""
    messages: list[dict[str, Any]] = []
    for index in range(turns):
        role = "user" if index % 2 == 0 else "assistant"
        text = BIG if index == 0 else f"turn {index}"
        block: dict[str, Any] = {"type": "text", "text": text}
        if index in cached:
            block["cache_control"] = CC
        messages.append({"role": role, "content": [block]})
    return messages


def test_cache_lookback_follows_a_moving_breakpoint(
    client: anthropic.Anthropic, up: FakeAnthropic
) -> None:
    first = conversation(3, {2})
    read, created, _ = usage_of(client, messages=first)
    written = up.count({"model": MODEL, "messages": first})
    assert (read, created) == (0, written)
    second = conversation(5, {4})  # the breakpoint moved two blocks on: found by the lookback
    read, created, rest = usage_of(client, messages=second)
    assert read == written and rest == 0
    assert created == up.count({"model": MODEL, "messages": second}) - written


def test_cache_lookback_is_twenty_blocks(client: anthropic.Anthropic) -> None:
    usage_of(client, messages=conversation(3, {2}))
    far = conversation(25, {24})  # 22 blocks after the cached prefix
    read, created, _ = usage_of(client, messages=far)
    assert read == 0 and created > 0
    usage_of(client, messages=conversation(3, {2}))
    read, _, _ = usage_of(client, messages=conversation(25, {12, 24}))
    assert read > 0  # a second breakpoint reaches back to it


def test_minimum_cacheable_length(client: anthropic.Anthropic) -> None:
    small = [{"type": "text", "text": "Be brief.", "cache_control": CC}]
    assert usage_of(client, system=small)[:2] == (0, 0)
    assert usage_of(client, system=cached_system(), model=HAIKU)[:2] == (0, 0)  # 2048 for Haiku
    assert usage_of(client, system=cached_system())[1] > 0


def test_automatic_cache_control_marks_the_last_block(client: anthropic.Anthropic) -> None:
    messages = conversation(1, set())
    read, created, rest = usage_of(client, messages=messages, cache_control=CC)
    assert (read, rest) == (0, 0) and created > 0
    assert usage_of(client, messages=messages, cache_control=CC)[0] == created


# -- headers, errors and behaviours ---------------------------------------------------------------


def test_credentials_and_version(up: FakeAnthropic) -> None:
    url = f"{up.base_url}/v1/messages"
    version = {"anthropic-version": "2023-06-01"}
    assert error_of(httpx.post(url, json=body(), headers=version)) == (
        401,
        "authentication_error",
        "x-api-key header is required",
    )
    wrong = {**version, "x-api-key": "sk-ant-wrong"}
    assert error_of(httpx.post(url, json=body(), headers=wrong))[2] == "invalid x-api-key"
    assert httpx.post(url, json=body(), headers={**version, "x-api-key": KEY}).status_code == 200
    missing = httpx.post(url, json=body(), headers={"x-api-key": KEY})
    assert error_of(missing) == (
        400,
        "invalid_request_error",
        "anthropic-version: header is required",
    )


STATUSES = [
    (400, anthropic.BadRequestError, "invalid_request_error"),
    (401, anthropic.AuthenticationError, "authentication_error"),
    (403, anthropic.PermissionDeniedError, "permission_error"),
    (404, anthropic.NotFoundError, "not_found_error"),
    (413, anthropic.APIStatusError, "request_too_large"),
    (429, anthropic.RateLimitError, "rate_limit_error"),
    (500, anthropic.InternalServerError, "api_error"),
    (529, anthropic.OverloadedError, "overloaded_error"),
]


@pytest.mark.parametrize(("status", "error", "kind"), STATUSES)
def test_status_behaviour_in_anthropic_shape(
    client: anthropic.Anthropic, status: int, error: type[Exception], kind: str
) -> None:
    with pytest.raises(error) as raised:
        client.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=HELLO,
            extra_headers={"x-fake-behavior": f"status:{status}"},
        )
    assert isinstance(raised.value, anthropic.APIStatusError)
    assert raised.value.status_code == status
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["type"] == kind
    assert raised.value.request_id == raised.value.body["request_id"]


def test_unknown_paths_and_behaviours(http: httpx.Client, client: anthropic.Anthropic) -> None:
    assert error_of(http.get("/v1/nothing")) == (404, "not_found_error", "Not Found")
    response = http.post("/v1/messages", json=body(), headers={"x-fake-behavior": "explode"})
    assert error_of(response)[2] == "unknown fake behavior 'explode'"
    assert [m.id for m in client.models.list()] == list(WINDOWS)


def test_hang_counts_a_cancellation(up: FakeAnthropic) -> None:
    with (
        anthropic.Anthropic(base_url=up.base_url, api_key=KEY, max_retries=0, timeout=0.3) as slow,
        pytest.raises(anthropic.APITimeoutError),
    ):
        slow.messages.create(
            model=MODEL, max_tokens=10, messages=HELLO, extra_headers={"x-fake-behavior": "hang"}
        )
    assert up.wait_for(lambda: up.cancelled == 1)


def test_slow_reset_and_failing_streams(client: anthropic.Anthropic, up: FakeAnthropic) -> None:
    started = time.monotonic()
    events = list(
        client.messages.create(
            model=MODEL,
            max_tokens=100,
            messages=HELLO,
            stream=True,
            extra_headers={"x-fake-behavior": "slow-stream:0.02"},
        )
    )
    assert time.monotonic() - started >= 0.02 * len(events)  # the ping is one more
    with pytest.raises(anthropic.APIConnectionError):
        client.messages.create(
            model=MODEL,
            max_tokens=100,
            messages=HELLO,
            extra_headers={"x-fake-behavior": "reset-mid-stream"},
        )
    received = []
    with pytest.raises(anthropic.APIStatusError) as failed:  # after a 200: no status class
        for event in client.messages.create(
            model=MODEL,
            max_tokens=100,
            messages=HELLO,
            stream=True,
            extra_headers={"x-fake-behavior": "error-mid-stream:3"},
        ):
            received.append(event.type)
    assert received == ["message_start", "content_block_start"]  # ping is not surfaced
    assert failed.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}


def test_gzip_behaviour(http: httpx.Client) -> None:
    headers = {"x-fake-behavior": "gzip", "accept-encoding": "gzip"}
    response = http.post("/v1/messages", json=body(), headers=headers)
    assert response.headers["content-encoding"] == "gzip"
    assert response.json()["type"] == "message"  # httpx decoded it


def test_summary_requests(client: anthropic.Anthropic, up: FakeAnthropic) -> None:
    seen: list[dict[str, Any]] = []

    def summarize(request: dict[str, Any]) -> str:
        seen.append(request)
        return "The summary."

    up.summarizer = summarize
    by_header = client.messages.create(
        model=MODEL, max_tokens=100, messages=HELLO, extra_headers={"x-compaction-summary": "1"}
    )
    assert by_header.content[0].text == "The summary."
    by_prompt = client.messages.create(
        model=MODEL, max_tokens=100, messages=HELLO, system=SUMMARY_PROMPT_PREFIX + " below."
    )
    assert by_prompt.content[0].text == "The summary." and up.summary_calls == 2
    assert seen[0]["messages"] == HELLO

    def fail(request: dict[str, Any]) -> str:
        raise RuntimeError("no summary")

    up.summarizer = fail
    with pytest.raises(anthropic.InternalServerError) as failed:
        client.messages.create(
            model=MODEL, max_tokens=100, messages=HELLO, extra_headers={"x-compaction-summary": "1"}
        )
    assert failed.value.body["error"]["type"] == "api_error"


def test_a_script_answers_with_its_calls_and_texts(
    client: anthropic.Anthropic, up: FakeAnthropic
) -> None:
    seen: list[list[Any]] = []

    def script(headers: Any, request: dict[str, Any]) -> Scripted | None:
        seen.append(request["messages"])
        last = request["messages"][-1]["content"]
        if isinstance(last, list) and last[0]["type"] == "tool_result":
            return Scripted(text="Oslo is sunny.")
        wanted = headers.get("x-wanted", "get_weather")
        return None if wanted == "own" else Scripted(tool=wanted, arguments={"city": "Oslo"})

    up.script = script
    try:
        history, call = tool_round(client, thinking=THINKING)
        assert [b.type for b in call.content] == ["thinking", "tool_use"]
        assert call.content[1].type == "tool_use" and call.content[1].input == {"city": "Oslo"}
        final = client.messages.create(
            model=MODEL, max_tokens=2000, messages=history, tools=[WEATHER]
        )
        assert final.content[0].type == "text" and final.content[0].text == "Oslo is sunny."
        own = client.messages.create(
            model=MODEL, max_tokens=100, messages=HELLO, extra_headers={"x-wanted": "own"}
        )
        assert own.content[0].type == "text" and own.content[0].text.startswith("Fake reply")
        with pytest.raises(anthropic.InternalServerError) as failed:
            client.messages.create(
                model=MODEL,
                max_tokens=100,
                messages=HELLO,
                tools=[WEATHER],
                extra_headers={"x-wanted": "get_time"},
            )
        assert "'get_time', not among the request's tools" in failed.value.body["error"]["message"]
        client.messages.create(
            model=MODEL, max_tokens=100, messages=HELLO, extra_headers={"x-compaction-summary": "1"}
        )
    finally:
        up.script = None
    assert len(seen) == 4  # the summary request never reached the script


def test_answers_keep_their_usage_and_errors_are_counted(
    client: anthropic.Anthropic, up: FakeAnthropic
) -> None:
    answer = client.messages.create(model=MODEL, max_tokens=100, messages=HELLO)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="claude-small", max_tokens=100, messages=[{"role": "user", "content": BIG * 4}]
        )
    (answered,) = up.answered
    assert answered.request is up.requests[0]
    assert answered.usage["input_tokens"] == answer.usage.input_tokens
    assert answered.usage["output_tokens"] == answer.usage.output_tokens
    assert up.rejected == 1
