"""The retrieval tool: elided tool outputs kept with the session under a handle derived from
their content, a tool the proxy adds once something was elided and answers itself, the client
given only the final answer with the usage of every upstream call added up."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from proxy.server.retrieval_rounds import LIMIT_NOTE
from tests.conftest import config_for
from tests.fakes.base import Scripted
from tests.fakes.scripted import (
    Request,
    Script,
    ScriptedUpstream,
    chunk,
    event,
    response,
    stream_head,
)
from tests.harness import Harness, harness
from tests.servers import proxy_server
from tests.test_replayed_plans import tool_round

TOOL = "compaction_retrieve"
HANDLE = re.compile(r"handle=(o[0-9a-f]{16})")
ASK = "What exactly was in f0.py?"
CLEARING = {"layers": [{"clear_tool_results": {"keep_last": 1}}]}
RETRIEVING = {**CLEARING, "retrieval": {"enabled": True}}


def handles(messages: list[dict[str, Any]]) -> list[str]:
    return [h for m in messages if m["role"] == "tool" for h in HANDLE.findall(str(m["content"]))]


def chat_model(_headers: Mapping[str, str], body: dict[str, Any]) -> Scripted | None:
    """A model that reads back the first elided output when asked about f0, then answers
    with the length of what it was given."""
    *_, asked, last = body["messages"]
    names = [c["function"]["name"] for c in asked.get("tool_calls") or []]
    if last["role"] == "tool" and names == [TOOL]:
        return Scripted(text=f"READ {len(last['content'])} chars")
    if last["role"] == "user" and last["content"] == ASK:
        found = handles(body["messages"])
        return Scripted(tool=TOOL, arguments={"handle": found[0] if found else "o" + "0" * 16})
    return None


def rounds(turns: int, owner: str = "") -> list[dict[str, Any]]:
    """Rounds of file reads, the outputs' text told apart by `owner`."""
    messages = []
    for turn in range(turns):
        user, call, output, answer = tool_round(turn, 150)
        messages += [user, call, {**output, "content": owner + output["content"]}, answer]
    return messages


def compacted(h: Harness, session: str = "s1", owner: str = "", **kwargs: Any) -> Any:
    chat = h.conversation(session, **kwargs)
    chat.messages = [{"role": "system", "content": "You read files."}, *rounds(6, owner)]
    assert chat.say("Go on.")["x-compaction-action"].endswith("compacted")
    return chat


def original(turn: int, owner: str = "") -> str:
    return str(rounds(turn + 1, owner)[-2]["content"])


def test_the_model_reads_an_elided_output_back_and_the_client_gets_only_the_answer() -> None:
    with harness(policies={"default": RETRIEVING}) as h:
        h.up.script = chat_model
        chat = compacted(h)
        view = h.forwarded()[-1]
        found = handles(view)
        assert found and len(found) == len(set(found))
        tools = h.up.requests[-1].json["tools"]
        assert [t["function"]["name"] for t in tools] == [TOOL]

        before = len(h.up.requests)
        headers = chat.say(ASK)
        assert headers["x-compaction-retrievals"] == "1"
        assert chat.messages[-1]["content"] == f"READ {len(original(0))} chars"
        hidden, final = h.up.requests[before:]
        # The proxy's result is the exact original, answering the model's call.
        call = hidden.json  # the request the model answered with a call
        result = final.json["messages"][-1]
        assert result["role"] == "tool" and result["content"] == original(0)
        assert final.json["messages"][:-2] == call["messages"]
        assert final.json["tools"] == call["tools"] == tools
        # Usage: both upstream calls added up.
        first, second = h.up.answered[-2:]
        assert chat.usage[-1] == first.usage["prompt_tokens"] + second.usage["prompt_tokens"]

        # The tool list stays byte for byte on every later turn, and the hidden round is put
        # back in its place: the next request goes on from the hidden round's.
        chat.say("Thanks.")
        after = h.up.requests[-1].json
        assert after["tools"] == tools
        hidden_round = len(final.json["messages"])
        assert after["messages"][:hidden_round] == final.json["messages"]
        assert after["messages"][hidden_round]["content"] == chat.messages[-3]["content"]
        assert h.metric("compaction_proxy_retrievals_total", outcome="served") == 1
        assert h.metric("compaction_proxy_retrieval_rounds_total", dialect="chat") == 1
        served = len(original(0).encode())
        assert h.metric("compaction_proxy_retrieval_bytes_total") == served


def test_a_handle_is_the_same_on_every_turn_and_replica_and_served_by_each() -> None:
    with harness(replicas=2, policies={"default": RETRIEVING}) as h:
        h.up.script = chat_model
        chat = compacted(h)
        first = handles(h.forwarded()[-1])
        other = h.conversation("s1", server=1)
        other.messages = list(chat.messages)
        assert other.say(ASK)["x-compaction-retrievals"] == "1"
        assert other.messages[-1]["content"] == f"READ {len(original(0))} chars"
        assert handles(h.forwarded()[-2])[: len(first)] == first


def test_a_foreign_handle_reveals_nothing() -> None:
    with harness(policies={"default": RETRIEVING}) as h:
        h.up.script = chat_model
        chat = compacted(h)
        stolen = handles(h.forwarded()[-1])[0]

        def thief(headers: Mapping[str, str], body: dict[str, Any]) -> Scripted | None:
            if body["messages"][-1]["content"] == ASK:
                return Scripted(tool=TOOL, arguments={"handle": stolen})
            return chat_model(headers, body)

        h.up.script = thief
        stranger = compacted(h, owner="theirs: ", api_key="sk-someone-else")
        stranger.say(ASK)
        result = h.up.requests[-1].json["messages"][-1]
        assert result["role"] == "tool" and "no output is kept" in result["content"]
        assert original(0) not in str(h.up.requests[-1].json)
        assert h.metric("compaction_proxy_retrievals_total", outcome="unknown") == 1
        assert chat.key != stranger.key


@pytest.mark.parametrize(("policy", "kept"), [(CLEARING, 0), ({**RETRIEVING, "shadow": True}, 5)])
def test_no_handle_and_no_tool_without_retrieval_or_under_shadow(policy: dict, kept: int) -> None:
    with harness(policies={"default": policy}) as h:
        chat = compacted(h)
        body = h.up.requests[-1].json
        assert not handles(body["messages"]) and "tools" not in body
        # Shadow mode keeps the originals all the same; without retrieval nothing is kept.
        key = f"{h.config.store.key_prefix}:{{{chat.key}}}:orig:order"
        assert h.redis.llen(key) == kept


def test_the_originals_are_read_by_the_admin_api_and_by_their_own_client_only() -> None:
    with harness(policies={"default": RETRIEVING}) as h:
        chat = compacted(h)
        handle = handles(h.forwarded()[-1])[0]
        admin = h.admin("GET", f"/admin/sessions/{chat.key}/originals/{handle}")
        assert admin.status_code == 200 and admin.text == original(0)
        own = {"authorization": "Bearer sk-test", "x-session-id": "s1"}
        path = f"{h.url}/v1/compaction/originals/{handle}"
        assert httpx.get(path, headers=own).text == original(0)
        for other in ({**own, "authorization": "Bearer sk-else"}, {**own, "x-session-id": "s2"}):
            refused = httpx.get(path, headers=other)
            assert refused.status_code == 404 and original(0) not in refused.text
        assert httpx.get(path, headers={"authorization": "Bearer sk-test"}).status_code == 400


def test_under_tool_choice_none_the_tool_is_there_and_never_called() -> None:
    with harness(policies={"default": RETRIEVING}) as h:
        h.up.behavior = "tool-call"  # the fake calls a tool whenever tool_choice lets it
        chat = compacted(h)
        tools = h.up.requests[-1].json["tools"]
        raw = h.openai().chat.completions.with_raw_response.create(
            model=chat.model,
            messages=[*chat.messages, {"role": "user", "content": "Say hi."}],
            tool_choice="none",
            extra_headers={"X-Session-Id": "s1"},
        )
        assert raw.parse().choices[0].message.tool_calls is None
        assert raw.headers["x-compaction-retrievals"] == "0"
        sent = h.up.requests[-1].json
        assert sent["tool_choice"] == "none" and sent["tools"] == tools


def test_calls_past_max_rounds_never_reach_the_client() -> None:
    policy = {**RETRIEVING, "retrieval": {"enabled": True, "max_rounds": 1}}
    with harness(policies={"default": policy}) as h:
        chat = compacted(h)
        handle = handles(h.forwarded()[-1])[0]

        def greedy(_headers: Mapping[str, str], body: dict[str, Any]) -> Scripted | None:
            return Scripted(tool=TOOL, arguments={"handle": handle})

        h.up.script = greedy  # calls the proxy's tool again and again
        before = len(h.up.requests)
        chat.say("Once more.")
        assert len(h.up.requests) - before == 2  # the request and one hidden round
        assert chat.messages[-1]["content"] == LIMIT_NOTE


def test_a_streamed_chat_answer_after_a_hidden_round_is_valid_with_the_usage_summed() -> None:
    with harness(policies={"default": RETRIEVING}) as h:
        h.up.script = chat_model
        chat = compacted(h)
        stream = h.openai().chat.completions.create(
            model=chat.model,
            messages=[*chat.messages, {"role": "user", "content": ASK}],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"X-Session-Id": "s1"},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == f"READ {len(original(0))} chars"
        first, second = h.up.answered[-2:]
        usage = chunks[-1].usage
        assert usage is not None
        assert usage.prompt_tokens == first.usage["prompt_tokens"] + second.usage["prompt_tokens"]
        # Not a call of the proxy's tool: relayed as it comes.
        plain = h.openai().chat.completions.create(
            model=chat.model,
            messages=[*chat.messages, {"role": "user", "content": "Hi."}],
            stream=True,
            extra_headers={"X-Session-Id": "s1"},
        )
        assert "".join(c.choices[0].delta.content or "" for c in plain if c.choices)


TEXT_EVENTS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]},
    {"choices": [{"index": 0, "delta": {"content": "lo."}, "finish_reason": "stop"}]},
]
CALL = {"index": 0, "id": "call_r", "type": "function"}
CALL_EVENTS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me read."}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{**CALL, "function": {"name": "read"}}]}}]},
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}
        ]
    },
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
]


@pytest.mark.parametrize("events", [TEXT_EVENTS, CALL_EVENTS], ids=["text", "client-call"])
def test_a_stream_that_does_not_call_the_proxys_tool_is_relayed_byte_for_byte(
    events: list[dict[str, Any]],
) -> None:
    sent = b"".join(event(json.dumps(e, separators=(",", ":"))) for e in events)
    sent += event("[DONE]")

    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(stream_head())
        for piece in (sent[: len(sent) // 3], sent[len(sent) // 3 :], chunk(b"")):
            writer.write(piece)
            await writer.drain()
        return True

    received, forwarded, _ = through_scripted(answer, stream=True)
    assert forwarded["tools"][-1]["function"]["name"] == TOOL  # the hold-back was on
    assert received == b"".join(_unchunked(sent))


def through_scripted(answer: Script, *, stream: bool) -> tuple[bytes, dict[str, Any], Any]:
    """The bytes a client receives for a compacted request with a client tool `read`, what
    was forwarded, and the answer's headers, with `answer` as the upstream."""
    body = {
        "model": "gpt-4",
        "stream": stream,
        "messages": [{"role": "system", "content": "You read files."}, *rounds(6)],
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {}}}],
    }
    with ScriptedUpstream(answer) as up:
        models = [{"match": "gpt-4", "context_window": 4096}]
        config = config_for(up, policies={"default": RETRIEVING}, models=models)
        with proxy_server(config) as proxy, httpx.Client(timeout=10) as client:
            with client.stream("POST", proxy.url + "/v1/chat/completions", json=body) as got:
                received = b"".join(got.iter_raw())
            return received, json.loads(up.requests[-1].body), got.headers


def test_a_call_of_the_proxys_tool_beside_a_clients_is_taken_out() -> None:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for i, name in enumerate((TOOL, "read"))
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
    answered = {"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage}
    payload = json.dumps(answered).encode()

    async def answer(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(200, payload))
        return True

    received, _, headers = through_scripted(answer, stream=False)
    given = json.loads(received)["choices"][0]
    assert [c["function"]["name"] for c in given["message"]["tool_calls"]] == ["read"]
    assert given["finish_reason"] == "tool_calls" and headers["x-compaction-retrievals"] == "0"


def _unchunked(framed: bytes) -> list[bytes]:
    """The data of chunked framing."""
    out, rest = [], framed
    while rest:
        size, rest = rest.split(b"\r\n", 1)
        out.append(rest[: int(size, 16)])
        rest = rest[int(size, 16) + 2 :]
    return out
