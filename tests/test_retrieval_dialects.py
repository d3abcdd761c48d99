"""The retrieval tool in the Responses API and Anthropic Messages, through the real SDKs: the
upstream's model reads an elided output back through the proxy's tool, and the client gets
only the final answer, valid, with the usage of both upstream calls added up."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import anthropic
import openai
import orjson
import pytest

from proxy.dialects.retrieval import TOOL_CALLS
from tests.conftest import config_for
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.base import Scripted
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server

TOOL = "compaction_retrieve"
HANDLE = re.compile(r"handle=(o[0-9a-f]{16})")
ASK = "What exactly was in f0.py?"
MODEL, CLAUDE = "gpt-4", "claude-small"
POLICY = {
    "layers": [{"clear_tool_results": {"keep_last": 1}}],
    "retrieval": {"enabled": True},
    "cache_breakpoints": False,
}
MODELS = [{"match": MODEL, "context_window": 4096}, {"match": CLAUDE, "context_window": 2048}]


def output(turn: int) -> str:
    return f"contents of f{turn}.py: " + "x = 1\n" * 150


def answered_text(text: str) -> str:
    return f"READ {len(text)} chars"


# -- Responses ---------------------------------------------------------------------------------


def responses_history() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for turn in range(6):
        call = {"type": "function_call", "call_id": f"c{turn}", "name": "read"}
        items += [
            {"role": "user", "content": f"Read file {turn}."},
            {**call, "arguments": json.dumps({"path": f"f{turn}.py"})},
            {"type": "function_call_output", "call_id": f"c{turn}", "output": output(turn)},
            {"role": "assistant", "content": f"File {turn} read."},
        ]
    return [*items, {"role": "user", "content": ASK}]


def responses_model(_headers: Mapping[str, str], body: dict[str, Any]) -> Scripted | None:
    items = body["input"]
    last = items[-1]
    calls = {i["call_id"]: i["name"] for i in items if i.get("type") == "function_call"}
    if last.get("type") == "function_call_output" and calls.get(last["call_id"]) == TOOL:
        return Scripted(text=answered_text(last["output"]))
    if last.get("content") == ASK:
        outputs = [str(i["output"]) for i in items if i.get("type") == "function_call_output"]
        found = [h for text in outputs for h in HANDLE.findall(text)]
        return Scripted(tool=TOOL, arguments={"handle": found[0]})
    return None


@pytest.fixture(scope="module")
def openai_proxy() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    with FakeUpstream(windows={MODEL: 8192}) as up:
        config = config_for(up, policies={"default": POLICY}, models=MODELS)
        with proxy_server(config) as server:
            yield up, server


@pytest.mark.parametrize("reasoning", [False, True], ids=["", "reasoning"])
@pytest.mark.parametrize("stream", [False, True])
def test_responses(
    openai_proxy: tuple[FakeUpstream, ServerThread], stream: bool, reasoning: bool
) -> None:
    up, server = openai_proxy
    up.reset()
    up.script = responses_model
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
    with client:
        session = {"X-Session-Id": f"responses-{stream}-{reasoning}"}
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "input": responses_history(),
            "extra_headers": session,
        }
        if reasoning:  # stateless, as Codex: the reasoning goes back encrypted with its call
            kwargs |= {"reasoning": {"effort": "low"}, "store": False}
            kwargs["include"] = ["reasoning.encrypted_content"]
        if stream:
            with client.responses.stream(**kwargs) as events:
                answer = events.get_final_response()
        else:
            answer = client.responses.create(**kwargs)
    assert answer.output_text == answered_text(output(0))
    assert [item.type for item in answer.output] == ["reasoning"] * reasoning + ["message"]
    bodies = [r.json for r in up.requests if r.path == "/v1/responses"]
    hidden, final = bodies[-2:]
    assert final["input"][-1] == {
        "type": "function_call_output",
        "call_id": final["input"][-2]["call_id"],
        "output": output(0),
    }
    assert hidden["tools"] == final["tools"] and hidden["tools"][-1]["name"] == TOOL
    if reasoning:  # the call's reasoning went back with it, readable without a stored response
        thought = final["input"][-3]
        assert thought["type"] == "reasoning" and "id" not in thought
        assert thought["encrypted_content"]
    first, second = up.answered[-2:]
    assert answer.usage is not None
    assert answer.usage.input_tokens == first.usage["input_tokens"] + second.usage["input_tokens"]

    # The next request, with the answer as the client holds it, has the hidden round back.
    said = [item.model_dump(exclude_none=True) for item in answer.output]
    again = [*responses_history(), *said, {"role": "user", "content": "Thanks."}]
    with openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0) as client:
        client.responses.create(**{**kwargs, "input": again})
    forwarded = up.requests[-1].json["input"]
    assert forwarded[: len(final["input"])] == final["input"]


# -- Messages ----------------------------------------------------------------------------------


def messages_history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(6):
        use = {"type": "tool_use", "id": f"toolu_{turn}", "name": "read", "input": {"n": turn}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": output(turn)}
        messages += [
            {"role": "user", "content": f"Read file {turn}."},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": f"File {turn} read."},
        ]
    return [*messages, {"role": "user", "content": ASK}]


def messages_model(_headers: Mapping[str, str], body: dict[str, Any]) -> Scripted | None:
    *_, asked, last = body["messages"]
    uses = [b for b in asked["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
    if uses and uses[0]["name"] == TOOL:
        return Scripted(text=answered_text(last["content"][0]["content"]))
    if last["content"] == ASK:
        found = HANDLE.findall(json.dumps(body["messages"]))
        return Scripted(tool=TOOL, arguments={"handle": found[0]})
    return None


@pytest.fixture(scope="module")
def anthropic_proxy() -> Iterator[tuple[FakeAnthropic, ServerThread]]:
    with FakeAnthropic(windows={CLAUDE: 8192}) as up:
        config = config_for(
            up,
            upstreams={"fake": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
            policies={"default": POLICY},
            models=MODELS,
        )
        with proxy_server(config) as server:
            yield up, server


@pytest.mark.parametrize("thinking", [False, True], ids=["", "thinking"])
@pytest.mark.parametrize("stream", [False, True])
def test_messages(
    anthropic_proxy: tuple[FakeAnthropic, ServerThread], stream: bool, thinking: bool
) -> None:
    up, server = anthropic_proxy
    up.reset()
    up.script = messages_model
    client = anthropic.Anthropic(base_url=server.url, api_key="sk-ant-test", max_retries=0)
    with client:
        kwargs: dict[str, Any] = {
            "model": CLAUDE,
            "max_tokens": 1200 if thinking else 200,
            "messages": messages_history(),
            "extra_headers": {"X-Session-Id": f"messages-{stream}-{thinking}"},
        }
        if thinking:  # the fake checks that each thinking block comes back signed, in place
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        if stream:
            with client.messages.stream(**kwargs) as events:
                answer = events.get_final_message()
        else:
            answer = client.messages.create(**kwargs)
    assert [block.type for block in answer.content] == ["thinking"] * thinking + ["text"]
    assert answer.content[-1].text == answered_text(output(0))  # type: ignore[union-attr]
    bodies = [r.json for r in up.requests if r.path == "/v1/messages"]
    hidden, final = bodies[-2:]
    result = final["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["content"] == output(0)
    assert hidden["tools"] == final["tools"] and hidden["tools"][-1]["name"] == TOOL
    first, second = (a.usage for a in up.answered[-2:])
    assert answer.usage.input_tokens == first["input_tokens"] + second["input_tokens"]
    assert answer.usage.output_tokens == first["output_tokens"] + second["output_tokens"]

    # The next request, with the answer as the client holds it, has the hidden round back.
    said = {"role": "assistant", "content": [block.model_dump() for block in answer.content]}
    kwargs["messages"] = [*messages_history(), said, {"role": "user", "content": "Thanks."}]
    with anthropic.Anthropic(base_url=server.url, api_key="sk-ant-test", max_retries=0) as again:
        again.messages.create(**kwargs)
    forwarded = messages_sent_last(up)["messages"]
    hidden_round = final["messages"][-2:]  # at this small window, compacted again around it
    at = forwarded.index(hidden_round[0])
    assert forwarded[at : at + 3] == [*hidden_round, said]


def messages_sent_last(up: FakeAnthropic) -> dict[str, Any]:
    return [r.json for r in up.requests if r.path == "/v1/messages"][-1]


def mixed_answer(dialect: str) -> dict[str, Any]:
    """An answer that calls the proxy's tool and a client's `read`, in each API's shape."""
    if dialect == "chat":
        calls = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
            for i, n in enumerate((TOOL, "read"))
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    if dialect == "responses":
        reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
        return {
            "output": [
                reasoning,
                *(
                    {"type": "function_call", "call_id": f"c{i}", "name": n, "arguments": "{}"}
                    for i, n in enumerate((TOOL, "read"))
                ),
            ]
        }
    thinking = {"type": "thinking", "thinking": "t", "signature": "s"}
    uses = [
        {"type": "tool_use", "id": f"c{i}", "name": n, "input": {}}
        for i, n in enumerate((TOOL, "read"))
    ]
    return {"content": [thinking, *uses], "stop_reason": "tool_use"}


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_the_proxys_calls_are_taken_out_beside_the_clients(dialect: str) -> None:
    calls = TOOL_CALLS[dialect]
    answer = mixed_answer(dialect)
    assert [c.name for c in calls.calls(answer)] == [TOOL, "read"]
    kept = calls.without_calls(answer, TOOL, "note")
    assert [c.name for c in calls.calls(kept)] == ["read"]
    assert "note" not in json.dumps(kept)
    alone = calls.without_calls(kept, "read", "note")  # nothing but the proxy's: the note
    assert calls.calls(alone) == [] and "note" in json.dumps(alone)


def sse_of(events: list[dict[str, Any]], named: bool) -> bytes:
    return b"".join(
        (f"event: {e['type']}\n".encode() if named else b"") + b"data: " + orjson.dumps(e) + b"\n\n"
        for e in events
    )


async def relayed_through(dialect: str, sent: bytes) -> bytes:
    async def chunks() -> AsyncIterator[bytes]:
        for at in range(0, len(sent), 7):  # events split anywhere
            yield sent[at : at + 7]

    return b"".join([c async for c in TOOL_CALLS[dialect].call_filter(TOOL).filtered(chunks())])


def chat_call(index: int, name: str | None, arguments: str) -> dict[str, Any]:
    function = {"arguments": arguments} if name is None else {"name": name, "arguments": ""}
    call = {"index": index, "function": function}
    return {"type": "chunk", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


async def test_a_later_call_of_the_proxys_tool_is_taken_out_of_a_relayed_stream() -> None:
    # chat: the client's call (index 0), the proxy's (1), the client's again (2 -> 1)
    events = [
        chat_call(0, "read", ""),
        chat_call(1, TOOL, ""),
        chat_call(1, None, '{"handle": "o1"}'),
        chat_call(2, "read", ""),
        chat_call(2, None, "{}"),
    ]
    got = await relayed_through("chat", sse_of(events, named=False))
    pieces = [
        piece
        for line in got.split(b"\n\n")
        if line
        for piece in orjson.loads(line[6:])["choices"][0]["delta"]["tool_calls"]
    ]
    assert [p["index"] for p in pieces] == [0, 1, 1]
    assert TOOL.encode() not in got and b"o1" not in got
    assert got.startswith(sse_of(events[:1], named=False))  # untouched events: their own bytes

    # Messages: blocks 0 (text), 1 (the client's), 2 (the proxy's), 3 (the client's -> 2)
    def block(index: int, name: str) -> list[dict[str, Any]]:
        use = {"type": "tool_use", "id": f"t{index}", "name": name, "input": {}}
        return [
            {"type": "content_block_start", "index": index, "content_block": use},
            {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta"}},
            {"type": "content_block_stop", "index": index},
        ]

    events = [*block(1, "read"), *block(2, TOOL), *block(3, "read"), {"type": "message_stop"}]
    got = await relayed_through("messages", sse_of(events, named=True))
    kept = [orjson.loads(part.split(b"data: ")[1]) for part in got.split(b"\n\n") if part]
    assert [e.get("index") for e in kept] == [1, 1, 1, 2, 2, 2, None]
    assert TOOL.encode() not in got

    # Responses: output items 0 (the client's), 1 (the proxy's), 2 (the client's -> 1)
    def item(index: int, name: str) -> dict[str, Any]:
        call = {"type": "function_call", "name": name, "call_id": f"c{index}", "arguments": ""}
        return {"type": "response.output_item.added", "output_index": index, "item": call}

    done = {"type": "function_call", "name": TOOL, "call_id": "c1", "arguments": ""}
    completed = {"type": "response.completed", "response": {"id": "r", "output": [done]}}
    events = [item(0, "read"), item(1, TOOL), item(2, "read"), completed]
    got = await relayed_through("responses", sse_of(events, named=True))
    kept = [orjson.loads(part.split(b"data: ")[1]) for part in got.split(b"\n\n") if part]
    assert [e.get("output_index") for e in kept] == [0, 1, None]
    assert kept[-1]["response"]["output"] == [] and TOOL.encode() not in got
