"""Chat completions (``POST /v1/chat/completions``): validation, counting, answers, SSE chunks."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from tests.fakes.base import Scripted
from tests.fakes.openai.common import (
    METADATA_OBJECT,
    PARSE_ERROR,
    ApiError,
    bad,
    call_id,
    check_flags,
    check_limit,
    content_tokens,
    count_json,
    count_text,
    cut_text,
    encoding_name,
    invalid_type,
    invalid_value,
    is_summary_request,
    missing,
    reply_text,
    sample_arguments,
    text_of,
)

if TYPE_CHECKING:
    from tests.fakes.base import Scripted
    from tests.fakes.openai.server import FakeUpstream

_ROLES = ("system", "assistant", "user", "function", "tool", "developer")


@dataclass(frozen=True)
class _Reply:
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    completion_tokens: int


# -- tokens ---------------------------------------------------------------------------------------


def _message_tokens(message: Mapping[str, Any], encoding: str) -> int:
    total = 3
    for key, value in message.items():
        if key == "content":
            total += content_tokens(value, encoding)
        elif key == "tool_calls" and isinstance(value, list):
            for call in value:
                function = call.get("function") or {}
                for field in ("name", "arguments"):
                    total += count_text(str(function.get(field, "")), encoding)
        elif isinstance(value, str):
            total += count_text(value, encoding) + (key == "name")
    return total


def count_prompt(body: Mapping[str, Any]) -> tuple[int, int]:
    """(message tokens, tools tokens) of a valid chat request, by OpenAI's published formula.

    Tools: each function's compact JSON plus OpenAI's per-function overhead, an upper bound of
    what OpenAI charges for the schema.
    """
    encoding = encoding_name(body["model"])
    messages = 3 + sum(_message_tokens(m, encoding) for m in body["messages"])
    tools = body.get("tools") or []
    schema = sum(7 + count_json(t["function"], encoding) for t in tools)
    return messages, (schema + 12 if tools else 0)


def count_prompt_tokens(body: Mapping[str, Any]) -> int:
    return sum(count_prompt(body))


# -- validation -----------------------------------------------------------------------------------


def _check_message(index: int, message: Any) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid_type(where, "an object", message)
    role = message.get("role")
    if role is None:
        raise missing(f"{where}.role")
    if role not in _ROLES:
        raise invalid_value(role, _ROLES, f"{where}.role")
    if role == "tool" and not message.get("tool_call_id"):
        raise missing(f"{where}.tool_call_id")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise invalid_type(f"{where}.content", "one of a string or array of objects", content)
    calls = role == "assistant" and any(message.get(k) for k in ("tool_calls", "function_call"))
    if content is None and not calls:
        raise missing(f"{where}.content")


def _check_tool_pairs(messages: list[dict[str, Any]]) -> None:
    """Every tool_calls answered right after it, every tool message answering one."""
    block_ids: list[str] = []  # the calls of the assistant message the current tool run answers
    pending: list[str] = []
    block_at = 0
    for index, message in enumerate([*messages, {"role": "end"}]):
        if message["role"] == "tool":
            if message["tool_call_id"] not in block_ids:
                raise bad(
                    "Invalid parameter: messages with role 'tool' must be a response to a"
                    " preceeding message with 'tool_calls'.",
                    f"messages.[{index}].role",
                )
            if message["tool_call_id"] in pending:
                pending.remove(message["tool_call_id"])
            continue
        if pending:
            raise bad(
                "An assistant message with 'tool_calls' must be followed by tool messages"
                " responding to each 'tool_call_id'. The following tool_call_ids did not have"
                f" response messages: {', '.join(pending)}",
                f"messages.[{block_at}].role",
            )
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        block_ids = [str(call.get("id")) for call in calls or []]
        pending, block_at = list(block_ids), index


def validate_chat(body: Any) -> None:
    """Raise the ApiError OpenAI answers for a malformed chat completion request."""
    if not isinstance(body, dict):
        raise bad(PARSE_ERROR)
    if not body.get("model"):
        raise bad("you must provide a model parameter")
    if not isinstance(body["model"], str):
        raise invalid_type("model", "a string", body["model"])
    if "messages" not in body:
        raise missing("messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise invalid_type("messages", "an array of objects", messages)
    if not messages:
        empty = "Expected an array with minimum length 1, but got an empty array instead."
        raise bad(f"Invalid 'messages': empty array. {empty}", "messages", "empty_array")
    for index, message in enumerate(messages):
        _check_message(index, message)
    _check_tool_pairs(messages)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid_type("tools", "an array", tools)
    for index, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            raise missing(f"tools[{index}].function")
        if not function.get("name"):
            raise missing(f"tools[{index}].function.name")
    check_flags(body, ("stream", "store", "parallel_tool_calls", "logprobs"))
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid_type("metadata", METADATA_OBJECT, metadata)
    for name in ("max_tokens", "max_completion_tokens"):
        check_limit(body, name, 1)
    if body.get("stream_options") is not None and not body.get("stream"):
        only = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        raise bad(only, "stream_options")


def max_output(body: Mapping[str, Any]) -> int:
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return limit if isinstance(limit, int) else 0


def check_window(body: Mapping[str, Any], window: int) -> tuple[int, int]:
    """(message tokens, tools tokens); ApiError context_length_exceeded when over the window."""
    messages, tools = count_prompt(body)
    completion = max_output(body)
    total = messages + tools + completion
    if total <= window:
        return messages, tools
    parts = [(messages, "messages")]
    parts += [(n, name) for n, name in ((tools, "functions"), (completion, "completion")) if n]
    names = [name for _, name in parts]
    what = " or ".join(names) if len(names) < 3 else f"{names[0]}, {names[1]}, or {names[2]}"
    detail = f" ({', '.join(f'{n} in the {name}' for n, name in parts)})" if len(parts) > 1 else ""
    asked = f"you requested {total}" if completion else f"your messages resulted in {total}"
    raise bad(
        f"This model's maximum context length is {window} tokens. However, {asked}"
        f" tokens{detail}. Please reduce the length of the {what}.",
        "messages",
        "context_length_exceeded",
    )


# -- answers --------------------------------------------------------------------------------------


def _text_reply(text: str, encoding: str, limit: int) -> _Reply:
    text, tokens, cut = cut_text(text, encoding, limit or None)
    return _Reply(text, [], "length" if cut else "stop", tokens)


def _tool_reply(body: Mapping[str, Any], raw: bytes, encoding: str) -> _Reply:
    """A call of the function tool_choice names, else of the first tool, with sample arguments."""
    functions = [t["function"] for t in body["tools"]]
    choice = body.get("tool_choice")
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    function = next((f for f in functions if f["name"] == named), functions[0])
    arguments = sample_arguments(function.get("parameters") or {})
    return _call_reply(function["name"], arguments, raw, encoding)


def _call_reply(name: str, arguments: str, raw: bytes, encoding: str) -> _Reply:
    call = {
        "id": call_id(raw),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    tokens = count_text(name, encoding) + count_text(arguments, encoding)
    return _Reply(None, [call], "tool_calls", tokens)


def _scripted_reply(
    body: Mapping[str, Any], raw: bytes, scripted: Scripted, encoding: str, limit: int
) -> _Reply:
    """A scripted model's answer: a call of the request's function `scripted.tool` (after the
    script's text, if it has one), or its text."""
    if scripted.tool is None:
        return _text_reply(scripted.text, encoding, limit)
    functions = [t["function"] for t in body.get("tools") or [] if t.get("type") == "function"]
    if not any(f["name"] == scripted.tool for f in functions):
        raise ApiError(500, f"the script called {scripted.tool!r}, not among the request's tools")
    given = scripted.arguments
    arguments = given if isinstance(given, str) else orjson.dumps(given).decode()
    call = _call_reply(scripted.tool, arguments, raw, encoding)
    return replace(call, content=scripted.text or None)


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _head(body: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-" + os.urandom(12).hex(),
        "object": kind,
        "created": int(time.time()),
        "model": body["model"],
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }


def _sse_events(body: Mapping[str, Any], reply: _Reply, prompt: int, choices: int) -> list[bytes]:
    """The chunks of a streamed answer, framed as OpenAI frames them."""
    head = _head(body, "chat.completion.chunk")
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        chunk = {**head, "choices": choices}
        if include_usage:  # then every chunk has a usage field, null but on the last one
            chunk["usage"] = usage
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def delta(index: int, fields: dict[str, Any], finish: str | None = None) -> bytes:
        return event([{"index": index, "delta": fields, "logprobs": None, "finish_reason": finish}])

    events = []
    for i in range(choices):
        if reply.tool_calls:
            call = reply.tool_calls[0]
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            opening = {
                "index": 0,
                "id": call["id"],
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            first = {"role": "assistant", "content": None, "tool_calls": [opening]}
            events.append(delta(i, {**first, "refusal": None}))
            for j in range(0, len(arguments), 8):
                piece = {"index": 0, "function": {"arguments": arguments[j : j + 8]}}
                events.append(delta(i, {"tool_calls": [piece]}))
        else:
            events.append(delta(i, {"role": "assistant", "content": "", "refusal": None}))
            words = re.findall(r"\s*\S+|\s+$", reply.content or "")  # they join back to it
            events += [delta(i, {"content": word}) for word in words]
        events.append(delta(i, {}, reply.finish_reason))
    if include_usage:
        events.append(event([], _usage(prompt, reply.completion_tokens * choices)))
    return [*events, b"data: [DONE]\n\n"]


def _completion(body: Mapping[str, Any], reply: _Reply, prompt: int, choices: int) -> bytes:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.content,
        "refusal": None,
        "annotations": [],
    }
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    answer = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": reply.finish_reason,
    }
    completion = _head(body, "chat.completion")
    completion["choices"] = [{**answer, "index": i} for i in range(choices)]
    completion["usage"] = _usage(prompt, reply.completion_tokens * choices)
    return orjson.dumps(completion)


async def handle(
    up: FakeUpstream, request: web.Request, raw: bytes, body: Any, behaviors: dict[str, str]
) -> web.StreamResponse:
    validate_chat(body)
    messages, tools = check_window(body, up.window_of(body["model"]))
    prompt, encoding, limit = messages + tools, encoding_name(body["model"]), max_output(body)
    choice = body.get("tool_choice")
    forced = choice == "required" or isinstance(choice, dict)
    summary = is_summary_request(request.headers, body)
    scripted = None if summary or up.script is None else up.script(request.headers, body)
    if summary:
        reply = _text_reply(await up.summarize(body), encoding, limit)
    elif scripted is not None:
        reply = _scripted_reply(body, raw, scripted, encoding, limit)
    elif body.get("tools") and choice != "none" and ("tool-call" in behaviors or forced):
        reply = _tool_reply(body, raw, encoding)
    else:
        users = [m for m in body["messages"] if m["role"] == "user"]
        last_user = text_of(users[-1].get("content")) if users else ""
        reply = _text_reply(reply_text(prompt, last_user), encoding, limit)
    choices = body.get("n") or 1
    up.note_usage(request, _usage(prompt, reply.completion_tokens * choices))
    if body.get("stream"):
        events = _sse_events(body, reply, prompt, choices)
        return await up.stream(request, events, behaviors, "text/event-stream; charset=utf-8")
    payload = _completion(body, reply, prompt, choices)
    if "reset-mid-stream" in behaviors:  # cut the JSON body half way
        return await up.stream(request, [payload], behaviors, "application/json")
    return web.Response(body=payload, content_type="application/json")
