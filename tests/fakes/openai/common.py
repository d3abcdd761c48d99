"""What both dialects of the fake share: token counting, errors, summaries, behaviours, framing."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import re
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any, Self

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
# The signing key of the fakes that recorded tests/data/clients (bench/agent_clients.py): fakes
# given it accept the encrypted reasoning and the thinking signatures those requests carry.
RECORDING_KEY = b"compaction-proxy agents-e2e"

SummaryResult = str | Exception | None
Summarizer = Callable[[dict[str, Any]], SummaryResult | Awaitable[SummaryResult]]

_O200K_MODELS = re.compile(r"gpt-4o|gpt-4\.1|gpt-5|chatgpt-4o|o\d")
_BEHAVIORS: dict[str, Callable[[str], object]] = dict.fromkeys(
    ("hang", "tool-call", "gzip", "redirect"), str
) | {"slow-stream": float, "reset-mid-stream": int, "status": int}  # how each argument parses
_SAMPLE_ARGUMENTS: dict[Any, Any] = {"integer": 1, "number": 1, "boolean": True, "array": []}
_TEXT_PARTS = ("text", "input_text", "output_text", "summary_text", "reasoning_text")
SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"
PARSE_ERROR = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using"
    " your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was"
    " not valid JSON. If you have trouble figuring out how to fix this, please contact us through"
    " our help center at help.openai.com.)"
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
class Answered:
    """The usage a fake reported in an answer, and the request it answered."""

    request: RecordedRequest
    usage: Mapping[str, Any]  # as the API reports it


@dataclass(frozen=True)
class Scripted:
    """A scripted model's answer: a call of the request's tool named `tool` with `arguments`
    (a JSON object for a function tool, the input text for a custom one), else `text`."""

    text: str = ""
    tool: str | None = None
    arguments: Any = None


# A scripted model (the fakes' `script`): the answer to a request's headers and body, or None
# for the fake's own answer. Summary requests never reach it.
Script = Callable[[Mapping[str, str], dict[str, Any]], Scripted | None]


# -- tokens ---------------------------------------------------------------------------------------


def encoding_name(model: str) -> str:
    return "o200k_base" if _O200K_MODELS.match(model) else "cl100k_base"


@lru_cache(maxsize=16384)  # histories are resent every turn: count each text once
def count_text(text: str, encoding: str) -> int:
    return len(tiktoken.get_encoding(encoding).encode(text, disallowed_special=()))


def count_json(value: Any, encoding: str) -> int:
    return count_text(orjson.dumps(value).decode(), encoding)


def content_tokens(content: Any, encoding: str) -> int:
    """A string, or parts of either API: text counted as text, an image as IMAGE_TOKENS, any other
    part (a file, audio) as its compact JSON."""
    if isinstance(content, str):
        return count_text(content, encoding)
    total = 0
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            total += count_text(str(part.get("text", "")), encoding)
        elif kind == "refusal":
            total += count_text(str(part.get("refusal", "")), encoding)
        elif kind in ("image_url", "input_image"):
            total += IMAGE_TOKENS
        else:
            total += count_json(part, encoding)
    return total


def cut_text(text: str, encoding: str, limit: int | None) -> tuple[str, int, bool]:
    """(text, its tokens, whether it was cut): cut at `limit` tokens, as the model would be."""
    tokens = tiktoken.get_encoding(encoding).encode(text, disallowed_special=())
    if limit is not None and len(tokens) > limit:
        return tiktoken.get_encoding(encoding).decode(tokens[: max(limit, 0)]), max(limit, 0), True
    return text, len(tokens), False


# -- errors ---------------------------------------------------------------------------------------


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


def invalid_type(param: str, expected: str, value: Any) -> ApiError:
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
    return bad(message, param, "invalid_type")


def missing(param: str) -> ApiError:
    return bad(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def invalid_value(value: Any, supported: Iterable[str], param: str) -> ApiError:
    names = [f"'{s}'" for s in supported]
    listed = names[0] if len(names) == 1 else f"{names[0]} and {names[1]}"
    if len(names) > 2:
        listed = ", ".join(names[:-1]) + f", and {names[-1]}"
    message = f"Invalid value: '{value}'. Supported values are: {listed}."
    return bad(message, param, "invalid_value")


# -- answers --------------------------------------------------------------------------------------


def text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def reply_text(prompt_tokens: int, last_user: str) -> str:
    """The fake's answer to an ordinary request, of either API."""
    return f"Fake reply to {digest(last_user)}: {prompt_tokens} prompt tokens."


def _input_items(body: Mapping[str, Any]) -> list[Any]:
    given = body.get("input")
    return given if isinstance(given, list) else [] if given is None else [given]


def default_summary(body: dict[str, Any]) -> str:
    if "messages" in body:
        return f"Summary of {len(body['messages'])} messages."
    return f"Summary of {len(_input_items(body))} input items."


def is_summary_request(headers: Mapping[str, str], body: Mapping[str, Any]) -> bool:
    """The summary header, or a system prompt (a system or developer message, or the Responses
    API's `instructions`) starting with SUMMARY_PROMPT_PREFIX."""
    if headers.get(SUMMARY_HEADER) == "1":
        return True
    if "messages" in body:
        messages = body["messages"]
    else:
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions.startswith(SUMMARY_PROMPT_PREFIX):
            return True
        messages = [i for i in _input_items(body) if isinstance(i, dict)]
    return any(
        m.get("role") in ("system", "developer")
        and text_of(m.get("content")).startswith(SUMMARY_PROMPT_PREFIX)
        for m in messages
    )


def sample_arguments(schema: Mapping[str, Any]) -> str:
    """Arguments for a function with this JSON schema: a sample value for each required field."""
    types = {k: (v or {}).get("type") for k, v in (schema.get("properties") or {}).items()}
    sample = {k: _SAMPLE_ARGUMENTS.get(types.get(k), "x") for k in schema.get("required", [])}
    return orjson.dumps(sample).decode()


def call_id(raw: bytes) -> str:
    """A tool call id, the same for the same request."""
    return "call_" + hashlib.blake2b(raw, digest_size=12).hexdigest()


# -- behaviours and the wire ----------------------------------------------------------------------


def parse_behavior(
    raw: str, known: Mapping[str, Callable[[str], object]] | None = None
) -> dict[str, str]:
    """``"slow-stream:0.1, gzip"`` -> ``{"slow-stream": "0.1", "gzip": ""}``; ValueError if bad.

    `known`: the behaviours a fake understands and how each argument is read (this fake's by
    default; other fakes pass their own)."""
    known = _BEHAVIORS if known is None else known
    behaviors = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, arg = item.partition(":")
        try:
            convert = known[name]
            if arg or name == "status":
                convert(arg)
        except (KeyError, ValueError):
            raise ValueError(f"unknown fake behavior {item!r}") from None
        behaviors[name] = arg
    return behaviors


_RECORDED = web.RequestKey("recorded", RecordedRequest)


class FakeServer:
    """A fake API on loopback, in a thread with its own loop: every request goes to `_handle`.
    It remembers its traffic: the requests (when `record`) and counters, with `wait_for` woken
    on every change."""

    def __init__(
        self, *counters: str, record: bool = True, port: int = 0, max_body_bytes: int
    ) -> None:
        self.record = record  # off for benchmarks, whose bodies would pile up
        self.port = port
        self.client_max_size = max_body_bytes
        self._changed = threading.Condition(threading.RLock())
        self._requests: list[RecordedRequest] = []
        self._answered: list[Answered] = []
        self._counts = dict.fromkeys(("cancelled", "summary_calls", "rejected", *counters), 0)
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> Self:
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
        app = web.Application(client_max_size=self.client_max_size)
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

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    @staticmethod
    async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
        raise NotImplementedError

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the requests received, oldest first."""
        with self._changed:
            return list(self._requests)

    @property
    def answered(self) -> list[Answered]:
        """A snapshot of the usage of every answer to a recorded request, oldest first."""
        with self._changed:
            return list(self._answered)

    @property
    def rejected(self) -> int:
        """Requests answered with an API error: a 4xx or 5xx, or a stream that failed."""
        with self._changed:
            return self._counts["rejected"]

    @property
    def cancelled(self) -> int:
        """Requests whose client went away before the answer was complete."""
        with self._changed:
            return self._counts["cancelled"]

    @property
    def summary_calls(self) -> int:
        with self._changed:
            return self._counts["summary_calls"]

    def bump(self, name: str) -> None:
        """Add one to a counter and wake wait_for."""
        with self._changed:
            self._counts[name] += 1
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Block until predicate() is true (re-checked on every request and count), or timeout.

        From a coroutine on a loop that serves the proxy, call it via ``asyncio.to_thread``.
        """
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def _forget(self) -> None:
        """The requests and counters, back to none (the caller holds the lock)."""
        self._requests.clear()
        self._answered.clear()
        self._counts = dict.fromkeys(self._counts, 0)

    async def _receive(self, request: web.BaseRequest) -> tuple[bytes, Any, RecordedRequest | None]:
        """The request's body, raw and parsed (None when it is not JSON), and its record."""
        raw = await request.read()
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data = None
        return raw, data, self._note(request, raw, data)

    def _note(self, request: web.BaseRequest, raw: bytes, data: Any) -> RecordedRequest | None:
        """Record the request (when recording): what was recorded."""
        if not self.record:
            return None
        recorded = RecordedRequest(
            request.method, raw_path(request), request.query_string, request.headers, raw, data
        )
        request[_RECORDED] = recorded
        with self._changed:
            self._requests.append(recorded)
            self._changed.notify_all()
        return recorded

    def note_usage(self, request: web.BaseRequest, usage: Mapping[str, Any]) -> None:
        """Remember the usage of an answer to `request` (when it was recorded)."""
        recorded = request.get(_RECORDED)
        if recorded is not None:
            with self._changed:
                self._answered.append(Answered(recorded, usage))


def raw_path(request: web.BaseRequest) -> str:
    """The path as the client encoded it (what a proxy must not rewrite)."""
    return request.raw_path.partition("?")[0]


def abort(request: web.BaseRequest) -> None:
    """Drop the connection with a TCP reset, as a failing network does."""
    if request.transport is not None:
        sock = request.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        request.transport.abort()


def maybe_gzip(request: web.BaseRequest, response: web.StreamResponse, gzip: bool) -> None:
    if gzip and "gzip" in request.headers.get("accept-encoding", ""):
        response.enable_compression(web.ContentCoding.gzip)


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
