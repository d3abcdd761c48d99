"""The Responses API (``POST /v1/responses``, ``POST /v1/responses/compact``) of the fake.

Facts it relies on, from openai-python (``types/responses``) and openai/codex (``codex-rs``):

- Codex CLI sends stateless requests: ``store: false``, ``stream: true``, ``instructions`` (its
  system prompt), the whole history in ``input``, ``include: ["reasoning.encrypted_content"]``,
  ``tool_choice: "auto"``, ``parallel_tool_calls``, ``prompt_cache_key`` and a ``session_id``
  header. Its items carry no ``id`` (only Azure, with ``store: true``, gets them back), so a
  ``reasoning`` item has ``summary`` and ``encrypted_content`` but no ``id``, and a
  ``local_shell_call`` is answered by a ``function_call_output`` with the same ``call_id``.
- Streams are SSE frames ``event: <type>\\ndata: <json>\\n\\n``; every event has ``type`` and
  ``sequence_number`` (from 0). A context overflow met once streaming has begun is a
  ``response.failed`` event whose ``response.error`` is ``{"code": "context_length_exceeded",
  "message": ...}`` (codex-rs treats that code as fatal); before, it is a 400.
- Errors the real API gives, reproduced here: ``Unknown parameter: 'x'.``; ``No tool call found
  for function call output with call_id <id>.``; ``No tool output found for function call <id>.``;
  ``Item '<fc id>' of type 'function_call' was provided without its required 'reasoning' item:
  '<rs id>'.``; a 404 ``Item with id '<id>' not found. Items are not persisted when `store` is
  set to false. ...``; ``The encrypted content for item <id> could not be verified. Reason: ...``
  (code ``invalid_encrypted_content``); ``Invalid value: 'input_text'. Supported values are:
  'output_text' and 'refusal'.`` for an assistant message; ``Unsupported parameter:
  'temperature' is not supported with this model.`` for reasoning models.
- ``/v1/responses/compact`` answers ``{"object": "response.compaction", "output": [...]}``, the
  output being "all user messages, followed by a single compaction item"; Codex CLI sends it
  ``tools``, ``parallel_tool_calls``, ``reasoning`` and ``text`` as in its ``/v1/responses``
  requests (codex-rs ``core/tests/suite/compact_remote.rs``) and replaces its history with the
  output. A ``compaction_trigger`` item ("Compacts the current context. Must be the final
  input item.") makes a ``/v1/responses`` answer whose one output item is the compaction item;
  streamed, that item has only ``response.output_item.added`` (without its content) and
  ``.done``. Codex echoes a compaction item back as ``{"type": "compaction",
  "encrypted_content": ...}`` (codex-rs ``protocol/src/models.rs``: ``ResponseItem::Compaction``
  keeps nothing else).
- A server without provider compaction (``provider_compaction=False``, a local server) has no
  ``/v1/responses/compact`` (404) and answers ``Invalid value: 'compaction'`` (or
  ``'compaction_trigger'``) for those items, as for any type it does not know.

Modelled simply (documented deviations):

- Counting: 3 tokens, then the tools (as chat counts them: 12, and 7 plus its JSON per tool),
  ``instructions`` as a system message, and each item: 3 plus its role and content (a message),
  name and arguments (a call), output (a call output), ``ENCRYPTED_TOKENS`` plus its summary (a
  reasoning item), ``ENCRYPTED_TOKENS`` (a compaction item), else its JSON. The window is
  ``windows[model]`` for the input alone; the answer gets what is left, or ``max_output_tokens``,
  and is cut short (status ``incomplete``) when that is not enough. ``truncation: "auto"``
  drops items from the start until the input fits.
- Reasoning models (names ``o<digit>``, ``gpt-5``, ``codex``, or any request with a
  ``reasoning`` field, unless its effort is ``none``) spend ``REASONING_TOKENS`` and answer a
  ``reasoning`` item first, with an ``encrypted_content`` only the same fake instance can verify
  when ``include`` asks for it. An item that followed a reasoning item in the fake's output then
  needs that reasoning item (by ``id`` or by its encrypted content) earlier in any later input.
- Prompt cache: ``cached_tokens`` is the length of the longest common prefix of (tools,
  instructions, items) with the previous request of the same model and ``prompt_cache_key``
  (else the same first item), rounded down to 128 tokens, and 0 under 1024.
- ``store`` (default true) keeps the response for ``previous_response_id`` and its output items
  for ``item_reference`` and for reasoning items sent back without their encrypted content: only
  what no stored response produced is a 404 (with the ``store`` hint when ``store`` is false).
  The reasoning-item rule above holds whatever ``store`` is.
- A call not yet answered is accepted at the end of the input; only a later user message makes
  it an error. Reasoning models accept ``temperature`` 1 (or none).
- ``conversation``, ``prompt``, ``background``, ``context_management`` and the other accepted
  fields are echoed or ignored. ``/v1/responses/compact`` takes ``summary_delay``, counts
  ``compact_calls`` (not ``summary_calls``) and reports ``ENCRYPTED_TOKENS`` output tokens; so
  does a trigger. The wording of the 400 for a trigger that is not last is the fake's own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from tests.fakes.base import Scripted
from tests.fakes.openai.common import (
    ApiError,
    bad,
    call_id,
    count_text,
    cut_text,
    digest,
    encoding_name,
    is_summary_request,
    reply_text,
    sample_arguments,
    text_of,
)
from tests.fakes.openai.responses_input import (
    ENCRYPTED_TOKENS,
    Memory,
    check_pairs,
    check_reasoning,
    check_trigger,
    context,
    is_reasoning,
    item_type,
    new_id,
    prompt_units,
    put,
    refuse_provider_compaction,
    validate_compact,
    validate_responses,
)

if TYPE_CHECKING:
    from tests.fakes.openai.server import FakeUpstream

REASONING_TOKENS = 64  # what a reasoning model thinks, in output tokens, before it answers
OVERFLOW = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
SSE = "text/event-stream; charset=utf-8"


# -- answers --------------------------------------------------------------------------------------


def _last_user(items: list[dict[str, Any]]) -> str:
    users = [i for i in items if item_type(i) == "message" and i.get("role") == "user"]
    return text_of(users[-1]["content"]) if users else ""


def _tool(body: Mapping[str, Any], behaviors: Mapping[str, str]) -> dict[str, Any] | None:
    """The tool to call: the one tool_choice names, else the first, when asked to call one."""
    tools = [t for t in body.get("tools") or [] if t["type"] in ("function", "custom")]
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    named = choice.get("name") if isinstance(choice, dict) else None
    if not (named or choice == "required" or "tool-call" in behaviors):
        return None
    chosen: dict[str, Any] = next((t for t in tools if t["name"] == named), tools[0])
    return chosen


def _scripted_call(body: Mapping[str, Any], scripted: Scripted) -> tuple[Any, str | None]:
    """(the request's tool the script calls, its arguments as sent), or (None, None) for text."""
    if scripted.tool is None:
        return None, None
    tools = [t for t in body.get("tools") or [] if t.get("type") in ("function", "custom")]
    tool = next((t for t in tools if t["name"] == scripted.tool), None)
    if tool is None:
        raise ApiError(500, f"the script called {scripted.tool!r}, not among the request's tools")
    given = scripted.arguments
    return tool, given if isinstance(given, str) else orjson.dumps(given).decode()


def _usage(prompt: int, cached: int, output: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + output,
    }


def _response(body: Mapping[str, Any], response_id: str, **fields: Any) -> dict[str, Any]:
    """A Response object echoing the request's settings; `fields` set status, output, usage..."""
    reasoning = body.get("reasoning") or {}
    effort = reasoning.get("effort", "medium" if is_reasoning(body) else None)

    def given(key: str, default: Any) -> Any:
        return default if body.get(key) is None else body[key]

    response = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "background": given("background", False),
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": body["model"],
        "output": [],
        "parallel_tool_calls": given("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": effort, "summary": reasoning.get("summary")},
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": "default",
        "store": given("store", True),
        "temperature": given("temperature", 1.0),
        "text": {"format": {"type": "text"}, "verbosity": "medium", **given("text", {})},
        "tool_choice": given("tool_choice", "auto"),
        "tools": given("tools", []),
        "top_logprobs": given("top_logprobs", 0),
        "top_p": given("top_p", 1.0),
        "truncation": given("truncation", "disabled"),
        "usage": None,
        "user": body.get("user"),
        "metadata": given("metadata", {}),
        **fields,
    }
    if response["status"] == "completed":
        response["completed_at"] = response["created_at"]
    return response


async def _answer(
    up: FakeUpstream,
    request: web.Request,
    raw: bytes,
    body: dict[str, Any],
    items: list[dict[str, Any]],
    prompt: int,
    budget: int,
    behaviors: Mapping[str, str],
) -> tuple[list[dict[str, Any]], int, int, bool]:
    """The answer to `items`, a prompt of `prompt` tokens, in at most `budget` output tokens:
    (output items, output tokens, reasoning tokens, whether the budget cut it short)."""
    encoding = encoding_name(body["model"])
    output: list[dict[str, Any]] = []
    thought = 0
    summary = is_summary_request(request.headers, body)
    text = await up.summarize(body) if summary else None  # a failing hook fails before any event
    if is_reasoning(body):
        thought = min(REASONING_TOKENS, budget)
        budget -= thought
        reasoning: dict[str, Any] = {"id": new_id("rs"), "type": "reasoning", "summary": []}
        if (body.get("reasoning") or {}).get("summary") in ("auto", "concise", "detailed"):
            said = f"**Answering**\n\nFake reasoning about {digest(_last_user(items))}."
            reasoning["summary"] = [{"type": "summary_text", "text": said}]
        if "reasoning.encrypted_content" in (body.get("include") or []):
            reasoning["encrypted_content"] = up.memory.seal("reasoning", reasoning["id"])
        output.append(reasoning)
        if budget <= 0:
            return output, thought, thought, True
    scripted = None if summary or up.script is None else up.script(request.headers, body)
    if scripted is not None:
        tool, said = _scripted_call(body, scripted)
    else:
        tool, said = (None if summary else _tool(body, behaviors)), None
    if tool is not None:
        if said is None:
            sample = sample_arguments(tool.get("parameters") or {})
            said = sample if tool["type"] == "function" else "x"
        name_tokens = count_text(tool["name"], encoding)
        said, tokens, cut = cut_text(said, encoding, budget - name_tokens)
        status = "incomplete" if cut else "completed"
        if tool["type"] == "function":
            call = {"id": new_id("fc"), "type": "function_call", "status": status}
            call |= {"arguments": said, "call_id": call_id(raw), "name": tool["name"]}
        else:
            call = {"id": new_id("ctc"), "type": "custom_tool_call", "status": status}
            call |= {"call_id": call_id(raw), "input": said, "name": tool["name"]}
        output.append(call)
        return output, thought + name_tokens + tokens, thought, cut
    if text is None:
        text = scripted.text if scripted else reply_text(prompt, _last_user(items))
    text, tokens, cut = cut_text(text, encoding, budget)
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    status = "incomplete" if cut else "completed"
    message = {"id": new_id("msg"), "type": "message", "status": status, "content": [part]}
    output.append(message | {"role": "assistant"})
    return output, thought + tokens, thought, cut


# -- the wire -------------------------------------------------------------------------------------


def _pieces(text: str, size: int = 0) -> list[str]:
    """Deltas that join back to `text`: words, or `size`-character chunks."""
    if size:
        return [text[i : i + size] for i in range(0, len(text), size)]
    return re.findall(r"\s*\S+|\s+$", text)


def _events(response: dict[str, Any], obfuscate: bool) -> list[bytes]:
    """The SSE frames of a streamed response, from response.created to its final event."""
    frames: list[bytes] = []
    numbers = itertools.count()

    def emit(kind: str, **fields: Any) -> None:
        event = {"type": kind, "sequence_number": next(numbers), **fields}
        if obfuscate and "delta" in fields:  # the real API pads deltas against length attacks
            event["obfuscation"] = os.urandom(8).hex()[: 16 - len(fields["delta"]) % 16]
        frames.append(f"event: {kind}\ndata: ".encode() + orjson.dumps(event) + b"\n\n")

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    opening |= {"completed_at": None, "error": None, "incomplete_details": None}
    emit("response.created", response=opening)
    emit("response.in_progress", response=opening)
    if response["status"] == "failed":
        emit("response.failed", response=response)
        return frames
    for index, item in enumerate(response["output"]):
        _item_events(emit, index, item)
    emit(f"response.{response['status']}", response=response)
    return frames


def _item_events(emit: Callable[..., None], index: int, item: dict[str, Any]) -> None:
    at = {"item_id": item["id"], "output_index": index}
    kind = item["type"]
    if kind == "reasoning":
        opening = {k: v for k, v in item.items() if k != "encrypted_content"} | {"summary": []}
        emit("response.output_item.added", output_index=index, item=opening)
        for s, part in enumerate(item["summary"]):
            blank = {"type": "summary_text", "text": ""}
            emit("response.reasoning_summary_part.added", **at, summary_index=s, part=blank)
            for piece in _pieces(part["text"]):
                emit("response.reasoning_summary_text.delta", **at, summary_index=s, delta=piece)
            emit("response.reasoning_summary_text.done", **at, summary_index=s, text=part["text"])
            emit("response.reasoning_summary_part.done", **at, summary_index=s, part=part)
    elif kind == "message":
        opening = {**item, "status": "in_progress", "content": []}
        emit("response.output_item.added", output_index=index, item=opening)
        for c, part in enumerate(item["content"]):
            emit("response.content_part.added", **at, content_index=c, part={**part, "text": ""})
            for piece in _pieces(part["text"]):
                emit("response.output_text.delta", **at, content_index=c, delta=piece, logprobs=[])
            done = {"text": part["text"], "logprobs": []}
            emit("response.output_text.done", **at, content_index=c, **done)
            emit("response.content_part.done", **at, content_index=c, part=part)
    elif kind == "compaction":  # no events between these two; its content only when done
        opening = {k: v for k, v in item.items() if k != "encrypted_content"}
        emit("response.output_item.added", output_index=index, item=opening)
    else:  # a function or custom tool call
        field, event = (
            ("arguments", "function_call_arguments")
            if kind == "function_call"
            else ("input", "custom_tool_call_input")
        )
        opening = {**item, "status": "in_progress", field: ""}
        emit("response.output_item.added", output_index=index, item=opening)
        for piece in _pieces(item[field], 8):
            emit(f"response.{event}.delta", **at, delta=piece)
        emit(f"response.{event}.done", **at, **{field: item[field]})
    emit("response.output_item.done", output_index=index, item=item)


async def _json(
    up: FakeUpstream, request: web.Request, value: Any, behaviors: Mapping[str, str]
) -> web.StreamResponse:
    payload = orjson.dumps(value)
    if "reset-mid-stream" in behaviors:  # cut the JSON body half way
        return await up.stream(request, [payload], dict(behaviors), "application/json")
    return web.Response(body=payload, content_type="application/json")


# -- the endpoints --------------------------------------------------------------------------------


def _fit(
    body: Mapping[str, Any], items: list[dict[str, Any]], window: int
) -> tuple[list[tuple[bytes, int]], list[dict[str, Any]], str]:
    """(the prompt's units, its items, its cache key); with truncation "auto", items are dropped
    from the start until it fits."""
    units = prompt_units(body, items)
    head = len(units) - len(items)
    if body.get("truncation") == "auto":
        while sum(n for _, n in units) > window and len(units) > head + 1:
            del units[head]
    kept = items[len(items) - (len(units) - head) :]
    first = units[head][0].hex() if kept else ""
    return units, kept, body.get("prompt_cache_key") or f"first:{first}"


async def handle(
    up: FakeUpstream, request: web.Request, raw: bytes, body: Any, behaviors: dict[str, str]
) -> web.StreamResponse:
    """``POST /v1/responses``."""
    validate_responses(body)
    if not up.provider_compaction:
        refuse_provider_compaction(body)
    store = body.get("store") is not False
    items, new_from = context(up.memory, body, store)
    triggered = check_trigger(items)
    check_pairs(items)
    check_reasoning(up.memory, items, new_from)
    model, window = body["model"], up.window_of(body["model"])
    units, items, key = _fit(body, items, window)
    prompt = sum(tokens for _, tokens in units)
    response_id = new_id("resp")
    obfuscate = (body.get("stream_options") or {}).get("include_obfuscation") is not False
    if prompt > window:
        if not body.get("stream"):
            raise bad(OVERFLOW, "input", "context_length_exceeded")
        up.bump("rejected")
        error = {"code": "context_length_exceeded", "message": OVERFLOW}
        failed = _response(body, response_id, status="failed", error=error)
        return await up.stream(request, _events(failed, obfuscate), behaviors, SSE)
    cached = up.memory.cached_tokens(model, key, units)
    if triggered:  # the answer is the compaction item alone
        up.bump("compact_calls")
        compaction = _compaction_item(up)
        usage = _usage(prompt, cached, ENCRYPTED_TOKENS, 0)
        up.note_usage(request, usage)
        response = _response(body, response_id, output=[compaction], usage=usage)
        _remember(up.memory, response_id, items, [compaction], store)
        if body.get("stream"):
            return await up.stream(request, _events(response, obfuscate), behaviors, SSE)
        return await _json(up, request, response, behaviors)
    limit = body.get("max_output_tokens")
    budget = window - prompt if limit is None else min(limit, window - prompt)
    answer = await _answer(up, request, raw, body, items, prompt, budget, behaviors)
    output, spent, thought, cut = answer
    fields: dict[str, Any] = {"output": output, "usage": _usage(prompt, cached, spent, thought)}
    up.note_usage(request, fields["usage"])
    if cut:
        fields |= {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    response = _response(body, response_id, **fields)
    _remember(up.memory, response_id, items, output, store)
    if body.get("stream"):
        return await up.stream(request, _events(response, obfuscate), behaviors, SSE)
    return await _json(up, request, response, behaviors)


def _remember(
    memory: Memory, response_id: str, items: list[Any], output: list[Any], store: bool
) -> None:
    if output and output[0]["type"] == "reasoning":
        for item in output[1:]:
            put(memory.follows, item["id"], output[0]["id"], limit=65536)
    if store:
        put(memory.responses, response_id, [*items, *output], limit=256)
        for item in output:
            put(memory.items, item["id"], item, limit=65536)


def _compaction_item(up: FakeUpstream) -> dict[str, Any]:
    compaction_id = new_id("cmp")
    sealed = up.memory.seal("compaction", compaction_id)
    return {"id": compaction_id, "type": "compaction", "encrypted_content": sealed}


async def compact(
    up: FakeUpstream, request: web.Request, body: Any, behaviors: dict[str, str]
) -> web.StreamResponse:
    """``POST /v1/responses/compact``: the user messages, then one compaction item."""
    validate_compact(body)
    items, new_from = context(up.memory, body, store=True)
    check_pairs(items)
    check_reasoning(up.memory, items, new_from)
    prompt = sum(tokens for _, tokens in prompt_units(body, items))
    if prompt > up.window_of(body["model"]):
        raise bad(OVERFLOW, "input", "context_length_exceeded")
    up.bump("compact_calls")
    await asyncio.sleep(up.summary_delay)
    output = []
    for item in items:
        if item_type(item) == "message" and item["role"] == "user":
            parts = item["content"]
            if isinstance(parts, str):
                parts = [{"type": "input_text", "text": parts}]
            message = {"id": new_id("msg"), "type": "message", "status": "completed"}
            output.append(message | {"role": "user", "content": parts})
    output.append(_compaction_item(up))
    answer = {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": _usage(prompt, 0, ENCRYPTED_TOKENS, 0),
    }
    up.note_usage(request, answer["usage"])
    return await _json(up, request, answer, behaviors)
