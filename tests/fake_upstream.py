"""A strict fake of the OpenAI API, for the test suite and the benchmarks.

It validates, counts and streams like the real API where a proxy can get it wrong (tool pairing,
the context window, SSE framing, error bodies) and misbehaves on request::

    with FakeUpstream(windows={"small-8k": 8192}) as up:
        client = openai.OpenAI(base_url=up.base_url, api_key="sk-test", max_retries=0)

Behaviours come from the ``x-fake-behavior`` request header, else from ``up.behavior``: a comma
separated list of ``hang``, ``slow-stream[:seconds]``, ``reset-mid-stream[:events]``,
``status:NNN``, ``tool-call``, ``gzip``, ``redirect``. Settings (``behavior``, ``summarizer``,
``summary_delay``, ``stream_delay``, ``api_key``) may be changed between requests.

Summary requests (header ``x-compaction-summary: 1``, or a system or developer message starting with
``SUMMARY_PROMPT_PREFIX``) are answered by the ``summarizer`` hook: a string is the reply, None an
empty reply, an Exception (returned or raised) a 500.

``python tests/fake_upstream.py --port 8001 --window small-8k=8192`` serves it until interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import importlib.util
import inspect
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
import tiktoken
import uvloop
from aiohttp import web

_litellm = importlib.util.find_spec("litellm")  # its tokenizer files make tiktoken work offline
if _litellm is not None and _litellm.submodule_search_locations:
    _tokenizers = Path(_litellm.submodule_search_locations[0], "litellm_core_utils", "tokenizers")
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_tokenizers))

BEHAVIOR_HEADER = "x-fake-behavior"
SUMMARY_HEADER = "x-compaction-summary"
SUMMARY_PROMPT_PREFIX = "You are compacting a conversation"
IMAGE_TOKENS = 85  # what OpenAI charges for a low-detail image

SummaryResult = str | Exception | None
Summarizer = Callable[[dict[str, Any]], SummaryResult | Awaitable[SummaryResult]]

_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
_O200K_MODELS = re.compile(r"gpt-4o|gpt-4\.1|gpt-5|chatgpt-4o|o\d")
_BEHAVIORS: dict[str, Callable[[str], object]] = dict.fromkeys(
    ("hang", "tool-call", "gzip", "redirect"), str
) | {"slow-stream": float, "reset-mid-stream": int, "status": int}  # how each argument parses
_SAMPLE_ARGUMENTS: dict[Any, Any] = {"integer": 1, "number": 1, "boolean": True, "array": []}
_SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"
_STATUS_ERRORS: dict[int, tuple[str, str, str | None]] = {
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    429: ("Rate limit reached for requests.", "requests", "rate_limit_exceeded"),
    500: (_SERVER_ERROR, "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}
_PARSE_ERROR = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using"
    " your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was"
    " not valid JSON. If you have trouble figuring out how to fix this, please contact us through"
    " our help center at help.openai.com.)"
)
_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header"
    " using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the basic auth username and"
    " password if you're accessing the API from your browser. You can obtain an API key from"
    " https://platform.openai.com/account/api-keys."
)


class ApiError(Exception):
    """An error answered with OpenAI's body ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # as sent, percent-encoded
    query: str
    headers: Mapping[str, str]  # case-insensitive
    body: bytes
    json: Any  # the parsed body, None when it is not JSON


@dataclass(frozen=True)
class _Reply:
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    completion_tokens: int


# -- tokens ---------------------------------------------------------------------------------------


def encoding_name(model: str) -> str:
    return "o200k_base" if _O200K_MODELS.match(model) else "cl100k_base"


@lru_cache(maxsize=16384)  # histories are resent every turn: count each text once
def count_text(text: str, encoding: str) -> int:
    return len(tiktoken.get_encoding(encoding).encode(text, disallowed_special=()))


def _content_tokens(content: Any, encoding: str) -> int:
    if isinstance(content, str):
        return count_text(content, encoding)
    total = 0
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            total += count_text(str(part.get("text", "")), encoding)
        elif kind == "image_url":
            total += IMAGE_TOKENS
        else:
            total += count_text(orjson.dumps(part).decode(), encoding)
    return total


def _message_tokens(message: Mapping[str, Any], encoding: str) -> int:
    total = 3
    for key, value in message.items():
        if key == "content":
            total += _content_tokens(value, encoding)
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
    schema = sum(7 + count_text(orjson.dumps(t["function"]).decode(), encoding) for t in tools)
    return messages, (schema + 12 if tools else 0)


def count_prompt_tokens(body: Mapping[str, Any]) -> int:
    return sum(count_prompt(body))


# -- validation -----------------------------------------------------------------------------------


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


def _invalid_type(param: str, expected: str, value: Any) -> ApiError:
    names = {
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a decimal",
        dict: "an object",
        list: "an array",
        type(None): "null",
    }
    got = names.get(type(value), "a value")
    message = f"Invalid type for '{param}': expected {expected}, but got {got} instead."
    return _bad(message, param, "invalid_type")


def _missing(param: str) -> ApiError:
    return _bad(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _check_message(index: int, message: Any) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _invalid_type(where, "an object", message)
    role = message.get("role")
    if role is None:
        raise _missing(f"{where}.role")
    if role not in _ROLES:
        supported = ", ".join(f"'{r}'" for r in _ROLES[:-1]) + f", and '{_ROLES[-1]}'"
        message_ = f"Invalid value: '{role}'. Supported values are: {supported}."
        raise _bad(message_, f"{where}.role", "invalid_value")
    if role == "tool" and not message.get("tool_call_id"):
        raise _missing(f"{where}.tool_call_id")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise _invalid_type(f"{where}.content", "one of a string or array of objects", content)
    calls = role == "assistant" and any(message.get(k) for k in ("tool_calls", "function_call"))
    if content is None and not calls:
        raise _missing(f"{where}.content")


def _check_tool_pairs(messages: list[dict[str, Any]]) -> None:
    """Every tool_calls answered right after it, every tool message answering one."""
    block_ids: list[str] = []  # the calls of the assistant message the current tool run answers
    pending: list[str] = []
    block_at = 0
    for index, message in enumerate([*messages, {"role": "end"}]):
        if message["role"] == "tool":
            if message["tool_call_id"] not in block_ids:
                raise _bad(
                    "Invalid parameter: messages with role 'tool' must be a response to a"
                    " preceeding message with 'tool_calls'.",
                    f"messages.[{index}].role",
                )
            if message["tool_call_id"] in pending:
                pending.remove(message["tool_call_id"])
            continue
        if pending:
            raise _bad(
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
        raise _bad(_PARSE_ERROR)
    if not body.get("model"):
        raise _bad("you must provide a model parameter")
    if not isinstance(body["model"], str):
        raise _invalid_type("model", "a string", body["model"])
    if "messages" not in body:
        raise _missing("messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array of objects", messages)
    if not messages:
        empty = "Expected an array with minimum length 1, but got an empty array instead."
        raise _bad(f"Invalid 'messages': empty array. {empty}", "messages", "empty_array")
    for index, message in enumerate(messages):
        _check_message(index, message)
    _check_tool_pairs(messages)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _invalid_type("tools", "an array", tools)
    for index, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            raise _missing(f"tools[{index}].function")
        if not function.get("name"):
            raise _missing(f"tools[{index}].function.name")
    if body.get("stream_options") is not None and not body.get("stream"):
        only = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        raise _bad(only, "stream_options")


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
    raise _bad(
        f"This model's maximum context length is {window} tokens. However, {asked}"
        f" tokens{detail}. Please reduce the length of the {what}.",
        "messages",
        "context_length_exceeded",
    )


# -- answers --------------------------------------------------------------------------------------


def text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def reply_text(prompt_tokens: int, last_user: str) -> str:
    """The fake's answer to an ordinary chat request."""
    return f"Fake reply to {digest(last_user)}: {prompt_tokens} prompt tokens."


def default_summary(body: dict[str, Any]) -> str:
    return f"Summary of {len(body['messages'])} messages."


def is_summary_request(headers: Mapping[str, str], body: Mapping[str, Any]) -> bool:
    return headers.get(SUMMARY_HEADER) == "1" or any(
        m["role"] in ("system", "developer")
        and text_of(m.get("content")).startswith(SUMMARY_PROMPT_PREFIX)
        for m in body["messages"]
    )


def _text_reply(text: str, encoding: str, limit: int) -> _Reply:
    tokens = tiktoken.get_encoding(encoding).encode(text, disallowed_special=())
    if limit and len(tokens) > limit:  # cut at max_tokens, as the model would be
        return _Reply(tiktoken.get_encoding(encoding).decode(tokens[:limit]), [], "length", limit)
    return _Reply(text, [], "stop", len(tokens))


def _tool_reply(body: Mapping[str, Any], raw: bytes, encoding: str) -> _Reply:
    """A call of the function tool_choice names, else of the first tool, with sample arguments."""
    functions = [t["function"] for t in body["tools"]]
    choice = body.get("tool_choice")
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    function = next((f for f in functions if f["name"] == named), functions[0])
    schema = function.get("parameters") or {}
    types = {k: (v or {}).get("type") for k, v in (schema.get("properties") or {}).items()}
    sample = {k: _SAMPLE_ARGUMENTS.get(types.get(k), "x") for k in schema.get("required", [])}
    arguments = orjson.dumps(sample).decode()
    call_id = "call_" + hashlib.blake2b(raw, digest_size=12).hexdigest()
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
    tokens = count_text(function["name"], encoding) + count_text(arguments, encoding)
    return _Reply(None, [call], "tool_calls", tokens)


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


def _embeddings(body: Any) -> dict[str, Any]:
    """Deterministic unit-range vectors, one for each input, float or base64 as asked."""
    if not isinstance(body, dict):
        raise _bad(_PARSE_ERROR)
    if not body.get("model"):
        raise _bad("you must provide a model parameter")
    if "input" not in body:
        raise _missing("input")
    given = body["input"]
    single = not isinstance(given, list) or not given or isinstance(given[0], int)
    items = [given] if single else given
    size = int(body.get("dimensions") or 8)
    data = []
    for index, item in enumerate(items):
        raw = hashlib.shake_128(orjson.dumps(item)).digest(2 * size)
        vector = [v / 32768 - 1 for v in struct.unpack(f"<{size}H", raw)]  # exact in float32
        encoded = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode()
        embedding = encoded if body.get("encoding_format") == "base64" else vector
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(count_text(x, "cl100k_base") if isinstance(x, str) else len(x) for x in items)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": body["model"], "usage": usage}


def parse_behavior(raw: str) -> dict[str, str]:
    """``"slow-stream:0.1, gzip"`` -> ``{"slow-stream": "0.1", "gzip": ""}``; ValueError if bad."""
    behaviors = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, arg = item.partition(":")
        try:
            convert = _BEHAVIORS[name]
            if arg or name == "status":
                convert(arg)
        except (KeyError, ValueError):
            raise ValueError(f"unknown fake behavior {item!r}") from None
        behaviors[name] = arg
    return behaviors


def _raw_path(request: web.BaseRequest) -> str:
    """The path as the client encoded it (what a proxy must not rewrite)."""
    return request.raw_path.partition("?")[0]


def _abort(request: web.BaseRequest) -> None:
    """Drop the connection with a TCP reset, as a failing network does."""
    if request.transport is not None:
        sock = request.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        request.transport.abort()


def _maybe_gzip(request: web.BaseRequest, response: web.StreamResponse, gzip: bool) -> None:
    if gzip and "gzip" in request.headers.get("accept-encoding", ""):
        response.enable_compression(web.ContentCoding.gzip)


# -- the server -----------------------------------------------------------------------------------


class FakeUpstream:
    """The fake API on 127.0.0.1, served from a background thread with its own event loop."""

    def __init__(
        self,
        *,
        windows: Mapping[str, int] | None = None,
        default_window: int = 128_000,
        behavior: str = "",
        stream_delay: float = 0.05,
        summarizer: Summarizer = default_summary,
        summary_delay: float = 0.0,
        api_key: str | None = None,
        record: bool = True,
        port: int = 0,
    ) -> None:
        parse_behavior(behavior)
        self.windows = dict(windows or {})
        self.default_window = default_window
        self.behavior = behavior
        self.stream_delay = stream_delay
        self.summarizer = summarizer
        self.summary_delay = summary_delay
        self.api_key = api_key  # None: any credential is accepted
        self.record = record  # off for benchmarks, whose bodies would pile up
        self.port = port
        self._changed = threading.Condition(threading.RLock())
        self._requests: list[RecordedRequest] = []
        self._counts = {"cancelled": 0, "summary_calls": 0}
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the requests received, oldest first."""
        with self._changed:
            return list(self._requests)

    @property
    def cancelled(self) -> int:
        """Requests whose client went away before the answer was complete."""
        with self._changed:
            return self._counts["cancelled"]

    @property
    def summary_calls(self) -> int:
        with self._changed:
            return self._counts["summary_calls"]

    def reset(self) -> None:
        """Forget the requests and zero the counters (settings are kept)."""
        with self._changed:
            self._requests.clear()
            self._counts = dict.fromkeys(self._counts, 0)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Block until predicate() is true (re-checked on every request and count), or timeout.

        From a coroutine on a loop that serves the proxy, call it via ``asyncio.to_thread``.
        """
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def __enter__(self) -> FakeUpstream:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        sock = socket.create_server(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._closing = False
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(sock), self._loop).result(timeout=10)

    async def _serve(self, sock: socket.socket) -> None:
        app = web.Application(client_max_size=100 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_response_prepare.append(self._add_request_id)
        # a client that goes away cancels its handler, which is how cancellations are seen
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=0.1, access_log=None
        )
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    def stop(self) -> None:
        if self._loop is None or self._thread is None or self._runner is None:
            return
        self._closing = True  # handlers cancelled by the shutdown are not client cancellations
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._loop = self._thread = self._runner = None

    def _count(self, name: str) -> None:
        with self._changed:
            self._counts[name] += 1
            self._changed.notify_all()

    @staticmethod
    async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-request-id"] = "req_" + os.urandom(12).hex()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data = None
        if self.record:
            headers, query = request.headers, request.query_string
            with self._changed:
                self._requests.append(
                    RecordedRequest(request.method, _raw_path(request), query, headers, raw, data)
                )
                self._changed.notify_all()
        try:
            behaviors = parse_behavior(request.headers.get(BEHAVIOR_HEADER, self.behavior))
        except ValueError as exc:
            return web.json_response(_bad(str(exc)).body, status=400)
        try:
            response = await self._respond(request, raw, data, behaviors)
        except ApiError as exc:
            response = web.json_response(exc.body, status=exc.status, dumps=_dumps)
        except asyncio.CancelledError:
            if not self._closing:
                self._count("cancelled")
            raise
        if not response.prepared:
            _maybe_gzip(request, response, "gzip" in behaviors)
        return response

    def _check_auth(self, request: web.Request) -> None:
        if self.api_key is None or not request.path.startswith("/v1/"):
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not given:
            raise ApiError(401, _NO_KEY)
        if given != self.api_key:
            masked = given[:3] + "*" * max(len(given) - 7, 0) + given[-4:]
            where = "You can find your API key at https://platform.openai.com/account/api-keys."
            message = f"Incorrect API key provided: {masked}. {where}"
            raise ApiError(401, message, code="invalid_api_key")

    async def _respond(
        self, request: web.Request, raw: bytes, data: Any, behaviors: dict[str, str]
    ) -> web.StreamResponse:
        method, path = request.method, request.path
        if path == "/elsewhere":  # where "redirect" points: a proxy that follows lands here
            return web.json_response({"followed": "redirect"})
        self._check_auth(request)
        if "hang" in behaviors:
            await asyncio.Event().wait()
        if "redirect" in behaviors:
            return web.Response(status=302, headers={"Location": f"{self.origin}/elsewhere"})
        if "status" in behaviors:
            status = int(behaviors["status"])
            kind = "server_error" if status >= 500 else "invalid_request_error"
            message, kind, code = _STATUS_ERRORS.get(status, (f"Fake error {status}.", kind, None))
            raise ApiError(status, message, code=code, kind=kind)
        if (method, path) == ("POST", "/v1/chat/completions"):
            return await self._chat(request, raw, data, behaviors)
        if (method, path) == ("POST", "/v1/embeddings"):
            return web.json_response(_embeddings(data), dumps=_dumps)
        if (method, path) == ("GET", "/v1/models"):
            models = [
                {"id": m, "object": "model", "created": 1700000000, "owned_by": "system"}
                for m in self.windows
            ]
            return web.json_response({"object": "list", "data": models})
        raise ApiError(404, f"Invalid URL ({method} {path})")

    async def _chat(
        self, request: web.Request, raw: bytes, body: Any, behaviors: dict[str, str]
    ) -> web.StreamResponse:
        validate_chat(body)
        messages, tools = check_window(body, self.windows.get(body["model"], self.default_window))
        prompt, encoding, limit = messages + tools, encoding_name(body["model"]), max_output(body)
        choice = body.get("tool_choice")
        forced = choice == "required" or isinstance(choice, dict)
        if is_summary_request(request.headers, body):
            self._count("summary_calls")
            await asyncio.sleep(self.summary_delay)
            reply = _text_reply(await self._summarize(body), encoding, limit)
        elif body.get("tools") and choice != "none" and ("tool-call" in behaviors or forced):
            reply = _tool_reply(body, raw, encoding)
        else:
            users = [m for m in body["messages"] if m["role"] == "user"]
            last_user = text_of(users[-1].get("content")) if users else ""
            reply = _text_reply(reply_text(prompt, last_user), encoding, limit)
        choices = body.get("n") or 1
        if body.get("stream"):
            events = _sse_events(body, reply, prompt, choices)
            return await self._stream(
                request, events, behaviors, "text/event-stream; charset=utf-8"
            )
        payload = _completion(body, reply, prompt, choices)
        if "reset-mid-stream" in behaviors:  # cut the JSON body half way
            return await self._stream(request, [payload], behaviors, "application/json")
        return web.Response(body=payload, content_type="application/json")

    async def _summarize(self, body: dict[str, Any]) -> str:
        try:
            result = self.summarizer(body)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            result = exc
        if isinstance(result, Exception):
            raise ApiError(500, _SERVER_ERROR, kind="server_error")
        return result or ""

    async def _stream(
        self, request: web.Request, events: list[bytes], behaviors: dict[str, str], kind: str
    ) -> web.StreamResponse:
        """Send events one by one, slowly or cut short when asked; a single event is cut in two."""
        response = web.StreamResponse(headers={"Content-Type": kind})
        if len(events) == 1:
            response.content_length = len(events[0])
            events = [events[0][: len(events[0]) // 2], events[0][len(events[0]) // 2 :]]
        _maybe_gzip(request, response, "gzip" in behaviors)
        await response.prepare(request)
        slow = behaviors.get("slow-stream")
        delay = 0.0 if slow is None else float(slow or self.stream_delay)
        cut = behaviors.get("reset-mid-stream")
        cut_at = -1 if cut is None else min(int(cut or 2), len(events) - 1)
        try:
            for index, event in enumerate(events):
                if index == cut_at:
                    await asyncio.sleep(0.05)  # let the client read what was sent before the reset
                    _abort(request)
                    return response
                if index and delay:
                    await asyncio.sleep(delay)
                await response.write(event)
            await response.write_eof()
        except ConnectionResetError:  # the client went away between two events
            self._count("cancelled")
        return response


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the fake OpenAI upstream until Ctrl-C.")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--window", action="append", default=[], metavar="MODEL=TOKENS")
    parser.add_argument("--behavior", default="")
    args = parser.parse_args()
    windows = {m: int(n) for m, _, n in (w.partition("=") for w in args.window)}
    with FakeUpstream(windows=windows, behavior=args.behavior, record=False, port=args.port) as up:
        print(up.base_url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
