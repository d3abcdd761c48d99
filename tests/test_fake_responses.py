"""The fake's Responses API against the real openai SDK, byte by byte on the wire, and its rules."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
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
    ENCRYPTED_TOKENS,
    REASONING_TOKENS,
    ApiError,
    FakeUpstream,
    count_input_tokens,
    count_prompt_tokens,
    reply_text,
)
from tests.fakes.openai.responses_input import check_pairs

WINDOWS = {"gpt-4o-mini": 128_000, "small-8k": 8192, "gpt-5-small": 8192}
RESPONSES = "/v1/responses"
O200K = tiktoken.get_encoding("o200k_base")
HELLO = [{"role": "user", "content": "hello there"}]
TRIGGER = "compaction_trigger"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch."}
OVERFLOW = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
NOT_PERSISTED = (
    " Items are not persisted when `store` is set to false. Try again with `store` set to true,"
    " or remove this item from your input."
)
UNDECRYPTABLE = "Reason: Encrypted content could not be decrypted or parsed."
ERROR = "invalid_request_error"


def error(message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = "server_error" if message.startswith("The server had") else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The events of a Responses stream, checking the framing byte by byte on the way."""
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"" and b"[DONE]" not in raw
    events = []
    for frame in frames[:-1]:
        head, data = frame.split(b"\n")
        event = orjson.loads(data.removeprefix(b"data: "))
        assert head == b"event: " + event["type"].encode() and data.startswith(b"data: ")
        assert orjson.dumps(event) == data.removeprefix(b"data: ")  # compact JSON
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def types(events: list[dict[str, Any]]) -> list[str]:
    """Event types, runs of one delta type folded into one."""
    folded: list[str] = []
    for event in events:
        if not (event["type"].endswith(".delta") and folded and folded[-1] == event["type"]):
            folded.append(event["type"])
    return folded


def dump(item: Any) -> dict[str, Any]:
    return item.model_dump(exclude_none=True, warnings=False)


def stateless(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as Codex sends it back: without its id (and status)."""
    return {k: v for k, v in item.items() if k not in ("id", "status")}


@pytest.fixture(scope="module")
def up() -> Iterator[FakeUpstream]:
    with FakeUpstream(windows=WINDOWS) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh(up: FakeUpstream) -> None:
    up.reset()
    up.behavior = ""


@pytest.fixture
def client(up: FakeUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def http(up: FakeUpstream) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=up.origin, timeout=5) as session:
        yield session


# -- answers, counting, recording -----------------------------------------------------------------


def test_answers_like_openai_and_records_the_request(
    up: FakeUpstream, client: openai.OpenAI
) -> None:
    answer = client.responses.create(
        model="gpt-4o-mini", instructions="Be brief.", input="hello there", metadata={"k": "v"}
    )
    body = {"model": "gpt-4o-mini", "instructions": "Be brief.", "input": "hello there"}
    prompt = count_input_tokens(body)
    assert answer.output_text == reply_text(prompt, "hello there")
    assert (answer.object, answer.status, answer.model) == ("response", "completed", "gpt-4o-mini")
    assert answer.id.startswith("resp_") and answer.instructions == "Be brief."
    assert answer.metadata == {"k": "v"} and answer.store is True
    (message,) = answer.output
    assert message.type == "message" and message.id.startswith("msg_")
    assert message.role == "assistant" and message.status == "completed"
    assert answer.usage is not None
    assert answer.usage.input_tokens == prompt
    assert answer.usage.output_tokens == len(O200K.encode(answer.output_text))
    assert answer.usage.total_tokens == prompt + answer.usage.output_tokens
    assert answer.usage.input_tokens_details.cached_tokens == 0
    assert answer.usage.output_tokens_details.reasoning_tokens == 0
    (seen,) = up.requests
    assert (seen.method, seen.path) == ("POST", RESPONSES)
    assert seen.json == {**body, "metadata": {"k": "v"}}


def test_counts_like_the_same_chat_request() -> None:
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    chat = {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": "Be brief."}, *HELLO],
        "tools": [chat_tool],
    }
    responses = {"model": "gpt-4o", "instructions": "Be brief.", "input": HELLO, "tools": [WEATHER]}
    assert count_input_tokens(responses) == count_prompt_tokens(chat)
    parts = [{"role": "user", "content": [{"type": "input_text", "text": "hello there"}]}]
    assert count_input_tokens({"model": "gpt-4o", "input": parts}) == count_input_tokens(
        {"model": "gpt-4o", "input": "hello there"}
    )


def test_items_count_their_text_and_encrypted_content_a_fixed_amount() -> None:
    def n(text: str) -> int:
        return len(O200K.encode(text))

    items = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}], "id": "rs_1"},
        {"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "noon"},
        {"type": "compaction", "encrypted_content": "gAAAAA..."},
    ]
    expected = 3 + (3 + ENCRYPTED_TOKENS + n("hm")) + (3 + n("get_time") + n("{}"))
    expected += (3 + n("noon")) + (3 + ENCRYPTED_TOKENS)
    assert count_input_tokens({"model": "gpt-5", "input": items}) == expected


def test_reasoning_models_think_first(client: openai.OpenAI) -> None:
    answer = client.responses.create(
        model="gpt-5",
        input="hello there",
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
    )
    reasoning, message = answer.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.encrypted_content and reasoning.summary[0].type == "summary_text"
    assert message.type == "message"
    assert answer.reasoning is not None and answer.reasoning.effort == "low"
    assert answer.usage is not None
    assert answer.usage.output_tokens_details.reasoning_tokens == REASONING_TOKENS
    text = len(O200K.encode(answer.output_text))
    assert answer.usage.output_tokens == REASONING_TOKENS + text
    plain = client.responses.create(model="o4-mini", input="hello there")
    assert [o.type for o in plain.output] == ["reasoning", "message"]
    assert plain.output[0].encrypted_content is None and plain.output[0].summary == []
    asked = client.responses.create(model="gpt-4o-mini", input="hi", reasoning={"effort": "low"})
    assert [o.type for o in asked.output] == ["reasoning", "message"]
    none = client.responses.create(model="gpt-5.1", input="hi", reasoning={"effort": "none"})
    assert [o.type for o in none.output] == ["message"]


# -- streaming ------------------------------------------------------------------------------------


def test_stream_framing_and_event_sequence(http: httpx.Client) -> None:
    body = {
        "model": "gpt-5",
        "input": HELLO,
        "stream": True,
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
    }
    with http.stream("POST", RESPONSES, json=body) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    created, in_progress, completed = events[0], events[1], events[-1]
    for opening in (created, in_progress):
        assert opening["response"]["status"] == "in_progress"
        assert opening["response"]["output"] == [] and opening["response"]["usage"] is None
    final = completed["response"]
    assert final["status"] == "completed" and final["id"] == created["response"]["id"]
    reasoning, message = final["output"]
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert added[0] == {"id": reasoning["id"], "type": "reasoning", "summary": []}
    assert added[1] == {**message, "status": "in_progress", "content": []}
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"] and reasoning["encrypted_content"].startswith("gAAAAA")
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    text = "".join(e["delta"] for e in deltas)
    assert len(deltas) > 3 and text == message["content"][0]["text"]
    assert all(e["item_id"] == message["id"] and e["output_index"] == 1 for e in deltas)
    assert all(e["content_index"] == 0 and e["logprobs"] == [] for e in deltas)
    assert all(e["obfuscation"] for e in deltas)
    assert final["usage"]["input_tokens"] == count_input_tokens(body)
    assert final["usage"]["output_tokens"] == REASONING_TOKENS + len(O200K.encode(text))
    unpadded = {**body, "stream_options": {"include_obfuscation": False}}
    events = sse_events(http.post(RESPONSES, json=unpadded).content)
    assert not any("obfuscation" in e for e in events)


def test_sdk_streams_both_ways(client: openai.OpenAI) -> None:
    stream = client.responses.create(model="gpt-4o-mini", input=HELLO, stream=True)
    events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == text
    assert text == reply_text(
        count_input_tokens({"model": "gpt-4o-mini", "input": HELLO}), "hello there"
    )
    with client.responses.stream(model="gpt-4o-mini", input=HELLO) as helper:
        pieces = [e.delta for e in helper if e.type == "response.output_text.delta"]
        final = helper.get_final_response()
    assert final.output_text == "".join(pieces) == text
    assert final.usage is not None and final.usage.input_tokens > 0


async def test_async_sdk_stream(up: FakeUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0) as aio:
        stream = await aio.responses.create(model="gpt-5", input="hi", stream=True)
        kinds = [event.type async for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"


# -- tools ----------------------------------------------------------------------------------------


def test_tool_call_round_trip(client: openai.OpenAI) -> None:
    asked = [{"role": "user", "content": "weather in Oslo?"}]
    answer = client.responses.create(
        model="gpt-4o-mini",
        input=asked,
        tools=[WEATHER],
        extra_headers={"x-fake-behavior": "tool-call"},
    )
    (call,) = answer.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id and call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "x", "days": 1}
    assert answer.usage is not None
    assert answer.usage.output_tokens == len(
        O200K.encode("get_weather") + O200K.encode(call.arguments)
    )
    follow_up = [
        *asked,
        dump(call),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    again = client.responses.create(model="gpt-4o-mini", input=follow_up, tools=[WEATHER])
    body = {"model": "gpt-4o-mini", "input": follow_up, "tools": [WEATHER]}
    assert again.output_text == reply_text(count_input_tokens(body), "weather in Oslo?")


def test_tool_calls_stream_as_argument_deltas(http: httpx.Client) -> None:
    body = {
        "model": "gpt-4o-mini",
        "input": HELLO,
        "tools": [TIME, WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "stream": True,
    }
    events = sse_events(http.post(RESPONSES, json=body).content)
    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    call = events[-1]["response"]["output"][0]
    assert events[2]["item"] == {**call, "status": "in_progress", "arguments": ""}
    deltas = [e["delta"] for e in events if e["type"].endswith("arguments.delta")]
    assert len(deltas) > 1 and "".join(deltas) == call["arguments"]
    assert json.loads(call["arguments"]) == {"city": "x", "days": 1}


@pytest.mark.parametrize(
    ("tool_choice", "behavior", "called"),
    [
        ("none", "tool-call", None),
        ("auto", "", None),
        ("required", "", "get_time"),
        ("auto", "tool-call", "get_time"),
        ({"type": "custom", "name": "apply_patch"}, "", "apply_patch"),
    ],
)
def test_tool_choice_decides(
    client: openai.OpenAI, tool_choice: Any, behavior: str, called: str | None
) -> None:
    answer = client.responses.create(
        model="gpt-4o-mini",
        input=HELLO,
        tools=[{"type": "web_search"}, TIME, PATCH],
        tool_choice=tool_choice,
        extra_headers={"x-fake-behavior": behavior},
    )
    calls = [o for o in answer.output if o.type in ("function_call", "custom_tool_call")]
    assert [c.name for c in calls] == ([called] if called else [])
    if called == "apply_patch":
        assert calls[0].type == "custom_tool_call" and calls[0].input == "x"


# -- errors ---------------------------------------------------------------------------------------

CALL = {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}
ANSWER = {"type": "function_call_output", "call_id": "call_a", "output": "A"}
FOREIGN = "gAAAAABnot-from-this-fake"


def request(input_: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "input": input_, **fields}


def missing(param: str) -> dict[str, Any]:
    return error(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def invalid(value: str, supported: str, param: str) -> dict[str, Any]:
    message = f"Invalid value: '{value}'. Supported values are: {supported}."
    return error(message, param, "invalid_value")


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        (
            request(HELLO, foo=1),
            400,
            error("Unknown parameter: 'foo'.", "foo", "unknown_parameter"),
        ),
        (
            request(HELLO, messages=HELLO),
            400,
            error("Unknown parameter: 'messages'.", "messages", "unknown_parameter"),
        ),
        ({"input": "hi"}, 400, missing("model")),
        ({"model": "gpt-4o-mini"}, 400, missing("input")),
        (
            request([{"role": "bot", "content": "x"}]),
            400,
            invalid("bot", "'user', 'assistant', 'system', and 'developer'", "input[0].role"),
        ),
        (
            request([{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]),
            400,
            invalid("input_text", "'output_text' and 'refusal'", "input[0].content[0]"),
        ),
        (
            request([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]),
            400,
            invalid(
                "output_text",
                "'input_text', 'input_image', and 'input_file'",
                "input[0].content[0]",
            ),
        ),
        (request([{"role": "user"}]), 400, missing("input[0].content")),
        (
            request([{k: v for k, v in CALL.items() if k != "call_id"}]),
            400,
            missing("input[0].call_id"),
        ),
        (
            request([*HELLO, ANSWER]),
            400,
            error("No tool call found for function call output with call_id call_a.", "input"),
        ),
        (
            request([*HELLO, ANSWER, CALL]),
            400,
            error("No tool call found for function call output with call_id call_a.", "input"),
        ),
        (
            request([*HELLO, {"type": "custom_tool_call_output", "call_id": "c9", "output": "x"}]),
            400,
            error("No tool call found for custom tool call output with call_id c9.", "input"),
        ),
        (
            request([*HELLO, CALL, {**ANSWER, "type": "custom_tool_call_output"}]),
            400,
            error("No tool call found for custom tool call output with call_id call_a.", "input"),
        ),
        (
            request([*HELLO, CALL, *HELLO]),
            400,
            error("No tool output found for function call call_a.", "input"),
        ),
        (
            request([*HELLO, CALL, *HELLO, ANSWER]),
            400,
            error("No tool output found for function call call_a.", "input"),
        ),
        (
            request(HELLO, tools=[{"type": "function", "function": {"name": "f"}}]),
            400,
            missing("tools[0].name"),
        ),
        (
            request(HELLO, max_output_tokens=10),
            400,
            error(
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16,"
                " but got 10 instead.",
                "max_output_tokens",
                "integer_below_min_value",
            ),
        ),
        (
            request(HELLO, include=["reasoning.summary"]),
            400,
            error(
                "Invalid value: 'reasoning.summary'. Supported values are:"
                " 'file_search_call.results', 'web_search_call.results',"
                " 'web_search_call.action.sources', 'message.input_image.image_url',"
                " 'computer_call_output.output.image_url', 'code_interpreter_call.outputs',"
                " 'reasoning.encrypted_content', and 'message.output_text.logprobs'.",
                "include[0]",
                "invalid_value",
            ),
        ),
        (
            request(HELLO, stream="false"),
            400,
            error(
                "Invalid type for 'stream': expected a boolean, but got a string instead.",
                "stream",
                "invalid_type",
            ),
        ),
        (
            request(HELLO, metadata="x"),
            400,
            error(
                "Invalid type for 'metadata': expected a metadata object, but got a string"
                " instead.",
                "metadata",
                "invalid_type",
            ),
        ),
        (
            request(HELLO, stream_options={"include_obfuscation": False}),
            400,
            error(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            ),
        ),
        (
            {"model": "gpt-5-mini", "input": "hi", "temperature": 0.2},
            400,
            error(
                "Unsupported parameter: 'temperature' is not supported with this model.",
                "temperature",
            ),
        ),
        (
            request(HELLO, previous_response_id="resp_nope"),
            400,
            error(
                "Previous response with id 'resp_nope' not found.",
                "previous_response_id",
                "previous_response_not_found",
            ),
        ),
        (
            request([{"type": "reasoning", "id": "rs_gone", "summary": []}, *HELLO], store=False),
            404,
            error("Item with id 'rs_gone' not found." + NOT_PERSISTED, "input"),
        ),
        (
            request([{"type": "item_reference", "id": "msg_gone"}, *HELLO], store=False),
            404,
            error("Item with id 'msg_gone' not found." + NOT_PERSISTED, "input"),
        ),
        (
            request([{"id": "msg_gone"}, *HELLO]),
            404,
            error("Item with id 'msg_gone' not found.", "input"),
        ),
        (
            request([{"type": "compaction", "encrypted_content": FOREIGN}, *HELLO]),
            400,
            error(
                f"The encrypted content for item input[0] could not be verified. {UNDECRYPTABLE}",
                None,
                "invalid_encrypted_content",
            ),
        ),
        (
            request(
                [{"type": "reasoning", "id": "rs_x", "summary": [], "encrypted_content": FOREIGN}],
                store=False,
            ),
            400,
            error(
                f"The encrypted content for item rs_x could not be verified. {UNDECRYPTABLE}",
                None,
                "invalid_encrypted_content",
            ),
        ),
    ],
)
def test_rejects_bad_requests_like_openai(
    http: httpx.Client, body: dict[str, Any], status: int, expected: dict[str, Any]
) -> None:
    response = http.post(RESPONSES, json=body)
    assert (response.status_code, response.json()) == (status, expected)


@pytest.mark.parametrize(
    ("item", "kind"),
    [
        ({"type": "function_call_result", "call_id": "c", "output": "x"}, "function_call_result"),
        ({"content": "no role, no type"}, ""),
    ],
)
def test_rejects_unknown_item_types(http: httpx.Client, item: dict[str, Any], kind: str) -> None:
    got = http.post(RESPONSES, json=request([*HELLO, item])).json()["error"]
    assert (got["param"], got["code"], got["type"]) == ("input[1]", "invalid_value", ERROR)
    supported = got["message"].removeprefix(f"Invalid value: '{kind}'. Supported values are: ")
    names = supported.removesuffix(".").replace(", and ", ", ").split(", ")
    assert names == sorted(names) and len(names) > 25
    for name in ("'message'", "'function_call_output'", "'reasoning'", "'item_reference'"):
        assert name in names


def test_accepts_what_the_real_api_accepts(http: httpx.Client) -> None:
    accepted = [
        request([*HELLO, CALL]),  # a call still waiting for its output
        request([*HELLO, CALL, ANSWER, *HELLO]),
        {"model": "gpt-5-mini", "input": "hi", "temperature": 1},
        request(HELLO, tools=[TIME], tool_choice="auto", parallel_tool_calls=False, top_p=0.5),
        request(
            [
                {"type": "message", "role": "developer", "content": "Be brief."},
                {"role": "assistant", "content": "earlier answer"},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                    ],
                },
                {
                    "type": "local_shell_call",
                    "call_id": "sh_1",
                    "status": "completed",
                    "action": {"type": "exec", "command": ["ls"], "env": {}},
                },
                {"type": "function_call_output", "call_id": "sh_1", "output": "a.txt"},
                {
                    "type": "custom_tool_call",
                    "call_id": "ct_1",
                    "name": "apply_patch",
                    "input": "*** Begin Patch",
                },
                {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "done"},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            ]
        ),
        request(
            HELLO,
            store=False,
            prompt_cache_key="k",
            safety_identifier="u1",
            service_tier="auto",
            truncation="disabled",
            user="u",
            max_tool_calls=3,
            top_logprobs=0,
            text={"verbosity": "low"},
            prompt_cache_retention="24h",
        ),
        request(HELLO, client_metadata={"thread_id": "t1"}),  # Codex CLI 0.171 sends it
    ]
    for body in accepted:
        response = http.post(RESPONSES, json=body)
        assert response.status_code == 200, (body, response.json())


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Rounds of a user message, then calls each answered before the next user message."""
    items: list[dict[str, Any]] = []
    ids = iter(range(10**6))
    for _ in range(draw(st.integers(1, 4))):
        items.append({"role": "user", "content": "go"})
        for _ in range(draw(st.integers(0, 3))):
            calls = [f"call_{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
            items += [{**CALL, "call_id": c} for c in calls]
            items += [{**ANSWER, "call_id": c} for c in draw(st.permutations(calls))]
        items.append({"role": "assistant", "content": "done"})
    return items


@settings(max_examples=examples(80), deadline=None)
@given(items=histories(), data=st.data())
def test_tool_pairing_rules(items: list[dict[str, Any]], data: st.DataObject) -> None:
    check_pairs(items)
    outputs = [i for i, item in enumerate(items) if item.get("type") == "function_call_output"]
    if not outputs:
        return
    gone = data.draw(st.sampled_from(outputs))
    call = items[gone]["call_id"]
    without_output = items[:gone] + items[gone + 1 :]
    later_user = any(item.get("role") == "user" for item in items[gone:])
    if later_user:
        with pytest.raises(ApiError) as caught:
            check_pairs(without_output)
        assert caught.value.body == error(
            f"No tool output found for function call {call}.", "input"
        )
    else:
        check_pairs(without_output)  # the last round may still wait for its outputs
    called_at = next(i for i, item in enumerate(items) if item.get("call_id") == call)
    with pytest.raises(ApiError) as caught:
        check_pairs(items[:called_at] + items[called_at + 1 :])
    message = f"No tool call found for function call output with call_id {call}."
    assert caught.value.body == error(message, "input")


# -- reasoning items, encrypted content, stored items ---------------------------------------------


def codex_request(items: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """A request as Codex CLI builds it (codex-rs ResponsesApiRequest)."""
    return {
        "model": "gpt-5-codex",
        "instructions": "You are a coding agent.",
        "input": items,
        "tools": [TIME],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "conversation-1",
        **fields,
    }


def final_response(raw: bytes) -> dict[str, Any]:
    events = sse_events(raw)
    assert events[-1]["type"] == "response.completed", events[-1]
    return events[-1]["response"]


def test_stateless_codex_turns(up: FakeUpstream, http: httpx.Client) -> None:
    user = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]}]
    headers = {"session_id": "conversation-1", "x-fake-behavior": "tool-call"}
    first = final_response(http.post(RESPONSES, json=codex_request(user), headers=headers).content)
    reasoning, call = first["output"]
    assert (reasoning["type"], call["type"]) == ("reasoning", "function_call")
    assert first["store"] is False and reasoning["encrypted_content"]
    history = [*user, stateless(reasoning), stateless(call)]
    history.append({"type": "function_call_output", "call_id": call["call_id"], "output": "ok"})
    second = final_response(http.post(RESPONSES, json=codex_request(history)).content)
    assert second["output"][-1]["type"] == "message"
    assert [r.headers.get("session_id") for r in up.requests] == ["conversation-1", None]
    # the reasoning item kept its id: fine too
    with_ids = [*user, reasoning, call, history[-1]]
    assert http.post(RESPONSES, json=codex_request(with_ids)).status_code == 200


def test_a_call_needs_the_reasoning_item_it_came_with(client: openai.OpenAI) -> None:
    asked = [{"role": "user", "content": "time?"}]
    answer = client.responses.create(
        model="gpt-5",
        input=asked,
        tools=[TIME],
        tool_choice="required",
        include=["reasoning.encrypted_content"],
        store=False,
    )
    reasoning, call = (dump(o) for o in answer.output)
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "noon"}
    kwargs: dict[str, Any] = {"model": "gpt-5", "tools": [TIME], "store": False}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(input=[*asked, call, output], **kwargs)
    assert (
        caught.value.body
        == error(
            f"Item '{call['id']}' of type 'function_call' was provided without its required"
            f" 'reasoning' item: '{reasoning['id']}'.",
            "input",
        )["error"]
    )
    for ok in ([*asked, reasoning, call, output], [*asked, stateless(call), output]):
        assert client.responses.create(input=ok, **kwargs).status == "completed"
    moved = {**reasoning, "id": "rs_other"}  # its encrypted content is bound to its id
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(input=[*asked, moved, call, output], **kwargs)
    assert (
        caught.value.body
        == error(
            "The encrypted content for item rs_other could not be verified. Reason: Encrypted"
            " content item_id did not match the target item id.",
            None,
            "invalid_encrypted_content",
        )["error"]
    )
    bare = {k: v for k, v in reasoning.items() if k != "encrypted_content"}
    with pytest.raises(openai.NotFoundError) as missing_:
        client.responses.create(input=[*asked, bare, call, output], **kwargs)
    assert (
        missing_.value.body
        == error(f"Item with id '{reasoning['id']}' not found." + NOT_PERSISTED, "input")["error"]
    )


def test_a_message_needs_its_reasoning_item_too(client: openai.OpenAI) -> None:
    first = client.responses.create(model="o3", input="hi", store=False)
    message = dump(first.output[1])
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="o3", input=[*HELLO, message, *HELLO], store=False)
    assert f"Item '{message['id']}' of type 'message'" in caught.value.message
    assert client.responses.create(model="o3", input=[*HELLO, stateless(message), *HELLO])


def test_stored_responses_and_items(client: openai.OpenAI) -> None:
    first = client.responses.create(model="gpt-5", input="hello there")
    assert first.store is True
    reasoning, message = first.output
    chained = client.responses.create(model="gpt-5", input="more", previous_response_id=first.id)
    assert chained.previous_response_id == first.id
    history = [
        {"role": "user", "content": "hello there"},
        dump(reasoning),
        dump(message),
        {"role": "user", "content": "more"},
    ]
    assert chained.usage is not None
    assert chained.usage.input_tokens == count_input_tokens({"model": "gpt-5", "input": history})
    # stored items may be referred to, or sent without their encrypted content
    referred = [*HELLO, {"type": "item_reference", "id": reasoning.id}, {"id": message.id}, *HELLO]
    assert client.responses.create(model="gpt-5", input=referred).status == "completed"
    unstored = client.responses.create(model="gpt-5", input="x", store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="gpt-5", input="y", previous_response_id=unstored.id)


# -- the context window, max_output_tokens, truncation --------------------------------------------


def lorem(words: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "lorem " * words}]


def test_overflow_is_a_400_before_streaming(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="small-8k", input=lorem(9000))
    assert caught.value.body == error(OVERFLOW, "input", "context_length_exceeded")["error"]


def test_overflow_streamed_is_a_failed_response(
    up: FakeUpstream, client: openai.OpenAI, http: httpx.Client
) -> None:
    body = {"model": "small-8k", "input": lorem(9000), "stream": True}
    with http.stream("POST", RESPONSES, json=body) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200
    events = sse_events(raw)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["output"] == [] and failed["usage"] is None
    assert failed["error"] == {"code": "context_length_exceeded", "message": OVERFLOW}
    stream = client.responses.create(model="small-8k", input=lorem(9000), stream=True)
    last = list(stream)[-1]
    assert last.type == "response.failed" and last.response.error is not None
    assert last.response.error.code == "context_length_exceeded"
    assert up.rejected == 2  # an error, though streamed after a 200


def test_window_boundary_and_output_budget(up: FakeUpstream, client: openai.OpenAI) -> None:
    body = {"model": "edge", "input": lorem(100)}
    prompt = count_input_tokens(body)
    up.windows["edge"] = prompt + 5  # 5 tokens left for the answer
    short = client.responses.create(**body)
    assert short.status == "incomplete" and short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_output_tokens"
    assert short.usage is not None and short.usage.output_tokens == 5
    assert short.output[0].status == "incomplete"
    up.windows["edge"] = prompt
    exact = client.responses.create(**body)
    assert exact.status == "incomplete" and exact.output_text == ""
    up.windows["edge"] = prompt - 1
    with pytest.raises(openai.BadRequestError):
        client.responses.create(**body)
    capped = client.responses.create(model="gpt-5", input="hi", max_output_tokens=70)
    assert capped.status == "incomplete" and capped.usage is not None
    assert (capped.usage.output_tokens, capped.usage.output_tokens_details.reasoning_tokens) == (
        70,
        REASONING_TOKENS,
    )
    assert len(O200K.encode(capped.output_text)) == 70 - REASONING_TOKENS
    thinking = client.responses.create(model="gpt-5", input="hi", max_output_tokens=64)
    assert thinking.status == "incomplete" and [o.type for o in thinking.output] == ["reasoning"]
    stream = client.responses.create(model="gpt-5", input="hi", max_output_tokens=70, stream=True)
    assert list(stream)[-1].type == "response.incomplete"


def test_truncation_auto_drops_the_oldest_items(client: openai.OpenAI) -> None:
    items = [*lorem(3000), {"role": "assistant", "content": "ok"}] * 3 + HELLO
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="small-8k", input=items)
    answer = client.responses.create(model="small-8k", input=items, truncation="auto")
    assert answer.usage is not None and answer.usage.input_tokens <= 8192
    kept = items[1:]  # dropping the first item is enough
    assert answer.usage.input_tokens == count_input_tokens({"model": "small-8k", "input": kept})
    assert answer.truncation == "auto"


# -- prompt caching -------------------------------------------------------------------------------


def test_cached_tokens_follow_the_common_prefix(client: openai.OpenAI) -> None:
    instructions = "Follow the rules. " * 400  # about 1600 tokens
    turn = [{"role": "user", "content": "first"}]

    def ask(items: list[dict[str, Any]], **fields: Any) -> tuple[int, int]:
        fields = {"model": "gpt-4o-mini", "instructions": instructions, **fields}
        usage = client.responses.create(input=items, **fields).usage
        assert usage is not None
        return usage.input_tokens, usage.input_tokens_details.cached_tokens

    first, cached = ask(turn, prompt_cache_key="a")
    assert cached == 0 and first > 1024
    longer = [*turn, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    total, cached = ask(longer, prompt_cache_key="a")
    assert cached == first // 128 * 128 and 0 < cached < total
    assert ask(longer, prompt_cache_key="b")[1] == 0  # another key: another cache
    assert ask(longer, prompt_cache_key="a")[1] == total // 128 * 128  # the same prompt again
    assert ask(longer)[1] == 0  # no key: by the first item, seen now for the first time
    assert ask(longer)[1] == total // 128 * 128
    changed = [{"role": "user", "content": "other"}, *longer[1:]]
    shared = count_input_tokens({"model": "gpt-4o-mini", "instructions": instructions, "input": []})
    assert ask(changed, prompt_cache_key="a")[1] == shared // 128 * 128  # tools, instructions
    small = client.responses.create(model="gpt-4o-mini", input="hi", prompt_cache_key="s")
    again = client.responses.create(model="gpt-4o-mini", input="hi", prompt_cache_key="s")
    assert small.usage is not None and again.usage is not None
    assert again.usage.input_tokens_details.cached_tokens == 0  # under 1024 tokens


# -- summaries ------------------------------------------------------------------------------------


def test_summary_requests_go_to_the_hook() -> None:
    seen: list[dict[str, Any]] = []

    def hook(body: dict[str, Any]) -> str:
        seen.append(body)
        return "## Goal\ndeploy svc-42"

    with (
        FakeUpstream(summarizer=hook) as up,
        openai.OpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0) as client,
    ):
        by_prompt = client.responses.create(
            model="gpt-5-mini",
            instructions="You are compacting a conversation. Keep ids verbatim.",
            input="user: deploy svc-42",
        )
        assert [o.type for o in by_prompt.output] == ["reasoning", "message"]
        assert by_prompt.output_text == "## Goal\ndeploy svc-42"
        developer = [{"role": "developer", "content": "You are compacting a conversation."}]
        client.responses.create(model="gpt-4o-mini", input=[*developer, *HELLO])
        by_header = client.responses.create(
            model="gpt-4o-mini", input=HELLO, extra_headers={"x-compaction-summary": "1"}
        )
        assert by_header.output_text == "## Goal\ndeploy svc-42"
        ordinary = client.responses.create(model="gpt-4o-mini", input=HELLO, tools=[TIME])
        assert ordinary.output_text != "## Goal\ndeploy svc-42"
        assert up.summary_calls == 3 and len(seen) == 3 and seen[2]["input"] == HELLO
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(
                model="gpt-5-mini", instructions="You are compacting", input="x", temperature=0
            )
        assert caught.value.param == "temperature" and up.summary_calls == 3
        up.summarizer = lambda body: RuntimeError("overloaded")
        with pytest.raises(openai.InternalServerError):
            client.responses.create(
                model="gpt-4o-mini",
                input=HELLO,
                stream=True,
                extra_headers={"x-compaction-summary": "1"},
            )


# -- a scripted model -----------------------------------------------------------------------------


def test_a_script_answers_with_its_calls_and_texts(up: FakeUpstream, http: httpx.Client) -> None:
    said: list[tuple[str, list[Any]]] = []

    def script(headers: Any, body: dict[str, Any]) -> Scripted | None:
        said.append((headers["x-turn"], body["input"]))
        turn = headers["x-turn"]
        if turn == "function":
            return Scripted(tool="get_weather", arguments={"city": "Oslo", "days": 2})
        if turn == "custom":
            return Scripted(tool="apply_patch", arguments="*** Begin Patch")
        if turn == "missing":
            return Scripted(tool="get_time")
        return Scripted(text="All done.") if turn == "text" else None

    up.script = script
    try:
        answers = {}
        for turn in ("function", "custom", "text", "own", "missing"):
            body = request(HELLO, tools=[WEATHER, PATCH])
            answers[turn] = http.post(RESPONSES, json=body, headers={"x-turn": turn})
        summary = request(HELLO, tools=[WEATHER])
        http.post(
            RESPONSES, json=summary, headers={"x-turn": "summary", "x-compaction-summary": "1"}
        )
    finally:
        up.script = None
    (call,) = answers["function"].json()["output"]
    assert (call["type"], call["name"]) == ("function_call", "get_weather")
    assert orjson.loads(call["arguments"]) == {"city": "Oslo", "days": 2}
    (custom,) = answers["custom"].json()["output"]
    assert (custom["type"], custom["input"]) == ("custom_tool_call", "*** Begin Patch")
    assert answers["text"].json()["output"][0]["content"][0]["text"] == "All done."
    assert answers["own"].json()["output"][0]["content"][0]["text"].startswith("Fake reply")
    assert answers["missing"].status_code == 500
    assert "'get_time', not among the request's tools" in answers["missing"].text
    assert [turn for turn, _ in said] == ["function", "custom", "text", "own", "missing"]
    assert said[0][1] == HELLO  # the summary request never reached the script


def test_answers_keep_their_usage_and_errors_are_counted(
    up: FakeUpstream, client: openai.OpenAI
) -> None:
    answer = client.responses.create(model="gpt-4o-mini", input=HELLO)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="small-8k", input="word " * 9000)
    (answered,) = up.answered
    assert answered.request is up.requests[0]
    assert answer.usage is not None and answered.usage["input_tokens"] == answer.usage.input_tokens
    assert answered.usage["output_tokens"] == answer.usage.output_tokens
    assert up.rejected == 1


# -- provider compaction --------------------------------------------------------------------------


def test_compact_then_continue(up: FakeUpstream, client: openai.OpenAI, http: httpx.Client) -> None:
    history = [
        *lorem(2000),
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and now?"},
    ]
    compacted = client.responses.compact(model="gpt-5", input=history)
    assert compacted.object == "response.compaction" and up.compact_calls == 1
    users = compacted.output[:-1]
    assert [(u.type, u.role) for u in users] == [("message", "user"), ("message", "user")]
    assert users[1].content[0].text == "and now?"
    compaction = compacted.output[-1]
    assert compaction.type == "compaction" and compaction.id.startswith("cmp_")
    assert compacted.usage.input_tokens == count_input_tokens({"model": "gpt-5", "input": history})
    follow_up = [dump(o) for o in compacted.output] + [{"role": "user", "content": "go on"}]
    answer = client.responses.create(model="gpt-5", input=follow_up, store=False)
    assert answer.usage is not None
    assert answer.usage.input_tokens == count_input_tokens({"model": "gpt-5", "input": follow_up})
    forged = {**dump(compaction), "encrypted_content": compaction.encrypted_content[:-4] + "AAAA"}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="gpt-5", input=[forged, *HELLO])
    assert caught.value.code == "invalid_encrypted_content"
    unknown = http.post(
        RESPONSES + "/compact", json={"model": "gpt-5", "input": "x", "store": False}
    )
    assert unknown.json() == error("Unknown parameter: 'store'.", "store", "unknown_parameter")


def test_a_compaction_trigger_is_answered_by_the_compaction_item_alone(
    up: FakeUpstream, client: openai.OpenAI, http: httpx.Client
) -> None:
    history = [*HELLO, {"role": "assistant", "content": "hi"}, {"type": "compaction_trigger"}]
    answer = client.responses.create(model="gpt-5", input=history, store=False)
    (item,) = answer.output
    assert item.type == "compaction" and up.compact_calls == 1
    follow_up = [stateless(dump(item)), {"role": "user", "content": "go on"}]
    assert client.responses.create(model="gpt-5", input=follow_up, store=False).output_text
    body = {"model": "gpt-5", "input": history, "stream": True, "store": False}
    events = sse_events(http.post(RESPONSES, json=body).content)
    kinds = [e["type"] for e in events]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert "encrypted_content" not in events[2]["item"]
    assert events[3]["item"]["encrypted_content"].startswith("gAAAAA")
    misplaced = {"model": "gpt-5", "input": [{"type": "compaction_trigger"}, *HELLO]}
    refused = http.post(RESPONSES, json=misplaced)
    message = "A compaction_trigger item must be the final input item."
    assert refused.json() == error(message, "input[0]")


def test_codex_compact_requests_carry_its_tools(client: openai.OpenAI) -> None:
    tool = {"type": "function", "name": "shell", "parameters": {"type": "object"}}
    compacted = client.responses.compact(
        model="gpt-5",
        input=HELLO,
        extra_body={
            "tools": [tool],
            "parallel_tool_calls": False,
            "reasoning": {"effort": "low"},
            "text": {"verbosity": "low"},
        },
    )
    assert compacted.output[-1].type == "compaction"


def test_a_server_without_provider_compaction_knows_none_of_it(http: httpx.Client) -> None:
    with FakeUpstream(provider_compaction=False) as local:
        base = local.origin
        compact = http.post(base + RESPONSES + "/compact", json={"model": "m", "input": "x"})
        assert compact.status_code == 404
        for kind, extra in (("compaction", {"encrypted_content": "gAAAAAxx"}), (TRIGGER, {})):
            body = {"model": "m", "input": [*HELLO, {"type": kind, **extra}]}
            refused = http.post(base + RESPONSES, json=body)
            assert refused.status_code == 400
            assert refused.json()["error"]["message"].startswith(f"Invalid value: '{kind}'.")
            assert refused.json()["error"]["param"] == "input[1].type"
        assert local.rejected == 3
        assert http.post(base + RESPONSES, json={"model": "m", "input": HELLO}).status_code == 200
        assert local.rejected == 3


# -- behaviours -----------------------------------------------------------------------------------


def test_hang_and_slow_stream(up: FakeUpstream, client: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.APITimeoutError):
        client.responses.create(
            model="gpt-4o-mini", input="hi", timeout=0.3, extra_headers={"x-fake-behavior": "hang"}
        )
    assert up.wait_for(lambda: up.cancelled == 1)
    body = {"model": "gpt-4o-mini", "input": "hi", "stream": True}
    started = time.monotonic()
    raw = http.post(RESPONSES, json=body, headers={"x-fake-behavior": "slow-stream:0.02"}).content
    assert time.monotonic() - started >= 0.02 * (len(sse_events(raw)) - 1)


def test_reset_mid_stream(http: httpx.Client, client: openai.OpenAI) -> None:
    body = {"model": "gpt-4o-mini", "input": "hi", "stream": True}
    received = b""
    headers = {"x-fake-behavior": "reset-mid-stream:3"}
    with (
        pytest.raises(httpx.ReadError),
        http.stream("POST", RESPONSES, json=body, headers=headers) as r,
    ):
        for part in r.iter_raw():
            received += part
    assert received.count(b"event: ") == 3 and b"response.completed" not in received
    with pytest.raises(openai.APIConnectionError):
        client.responses.create(
            model="gpt-4o-mini", input="hi", extra_headers={"x-fake-behavior": "reset-mid-stream"}
        )


@pytest.mark.parametrize(
    ("status", "sdk_error"),
    [(429, openai.RateLimitError), (500, openai.InternalServerError)],
)
def test_status_behavior(client: openai.OpenAI, status: int, sdk_error: type[Exception]) -> None:
    for path in ("create", "compact"):
        with pytest.raises(sdk_error):
            getattr(client.responses, path)(
                model="gpt-5", input="hi", extra_headers={"x-fake-behavior": f"status:{status}"}
            )


@pytest.mark.parametrize("stream", [False, True])
def test_gzip(http: httpx.Client, stream: bool) -> None:
    body = {"model": "gpt-4o-mini", "input": "hi", "stream": stream}
    headers = {"x-fake-behavior": "gzip", "accept-encoding": "gzip"}
    with http.stream("POST", RESPONSES, json=body, headers=headers) as response:
        raw = b"".join(response.iter_raw())
    assert response.headers["content-encoding"] == "gzip"
    plain = gzip.decompress(raw)
    if stream:
        assert sse_events(plain)[-1]["type"] == "response.completed"
    else:
        assert orjson.loads(plain)["object"] == "response"
