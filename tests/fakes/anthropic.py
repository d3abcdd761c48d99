"""A strict fake of the Anthropic Messages API, for the proxy's Anthropic dialect.

It validates, counts, caches and streams like the real API where a proxy can get it wrong (tool
pairs, thinking blocks, cache breakpoints, the context window, SSE framing, error bodies) and
misbehaves on request::

    with FakeAnthropic(windows={"claude-small": 8192}) as up:
        client = anthropic.Anthropic(base_url=up.base_url, api_key="sk-ant-test", max_retries=0)

Endpoints: ``POST /v1/messages`` (also ``?beta=true``, as Claude Code sends it),
``POST /v1/messages/count_tokens``, ``GET /v1/models``; any other path is a 404.

Facts of the real API it relies on (the SDK's types in anthropic-sdk-python, the API docs, and
error texts users reported verbatim in issue trackers):

- Headers: ``x-api-key`` or ``Authorization: Bearer`` (the current SDK sends the latter) and
  ``anthropic-version`` (400 without it; the current SDK sends 2026-10-21). Every answer has a
  ``request-id`` header; error bodies are ``{"type": "error", "error": {"type", "message"},
  "request_id"}``: 400 invalid_request_error, 401 authentication_error, 403 permission_error,
  404 not_found_error, 413 request_too_large (32 MB), 429 rate_limit_error, 500 api_error,
  529 overloaded_error. An overload after the 200 of a stream comes as ``event: error``.
- Bodies are validated strictly (pydantic): an unknown field is ``"<path>: Extra inputs are not
  permitted"``, also in blocks (``messages.1.content.0.thinking.cache_control``: thinking blocks
  take no cache_control) and tools (``tools.0.custom.parameters``); beta fields
  (``context_management``, ``mcp_servers``) only with their ``anthropic-beta`` value;
  ``metadata`` only has ``user_id``; a message's ``output_config`` with ``per-turn-control-``.
- Messages: roles user and assistant, and ``system`` right after a user turn (Opus 4.8's
  mid-conversation system messages); consecutive same-role turns are merged; the first message
  may be an assistant one (Anthropic's API accepts it since late 2024; Bedrock, and this fake
  with ``user_first=True``, still answer 'first message must use the "user" role'); every
  message but a final assistant one must be non-empty, and so must every text block.
- Each ``tool_use`` needs its ``tool_result`` at the start of the next user turn and each
  ``tool_result`` its ``tool_use`` in the previous assistant turn (``messages.N: `tool_use` ids
  were found without `tool_result` blocks immediately after: ...``, ``messages.N.content.M:
  unexpected `tool_use_id` found in `tool_result` blocks: ...``).
- Thinking (``enabled`` with 1024 <= ``budget_tokens`` < ``max_tokens``, ``adaptive``, display
  ``omitted``, or ``updates`` with its beta as Claude Code 2.1.332 sends it): blocks must come
  back unmodified (``Invalid `signature` in `thinking` block``); the final assistant turn with
  ``tool_use`` must start with one (``Expected `thinking` or `redacted_thinking`, but found
  ...``); the blocks of earlier turns are stripped and not counted; a forcing ``tool_choice``
  or a temperature other than 1 is refused.
- Prompt caching: at most 4 ``cache_control`` blocks (``A maximum of 4 blocks with
  cache_control may be provided. Found N.``), read in the order tools, system, messages, and a
  ``ttl='1h'`` one must not follow a 5m one; a top-level ``cache_control`` marks the last block;
  a breakpoint also hits a prefix cached up to 20 blocks before it; prefixes under 1024 tokens
  (2048 for Haiku) are not cached; entries live 5 minutes (or 1 hour) from their last use.
  ``input_tokens`` counts only what follows the last breakpoint: the whole input is
  ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``.
- The window: ``prompt is too long: N tokens > W maximum``, else ``input length and
  `max_tokens` exceed context limit: N + M > W, decrease input length or `max_tokens` and try
  again``; ``anthropic-beta: context-1m-...`` opens 1M tokens on the models that have it.
- Streams: ``message_start`` (usage), ``ping``, per block ``content_block_start``,
  ``content_block_delta`` (``text_delta``, ``input_json_delta``, ``thinking_delta``,
  ``signature_delta``), ``content_block_stop``, then ``message_delta`` (stop_reason, usage) and
  ``message_stop``, each framed ``event: <type>\ndata: <json>\n\n``.

Counting: Claude's tokenizer is not public, so the fake counts tiktoken ``cl100k_base`` tokens
times 1.15, rounded up per block, plus fixed overheads (see the constants): on purpose unlike
any local estimate, so that the proxy's calibration against ``usage`` and ``count_tokens`` is
exercised. Images and PDFs cost a constant, as do signatures and redacted thinking.

Simplifications: the cache key is the model and the exact blocks (JSON without cache_control),
so changes to ``tool_choice``, images or thinking settings alone do not invalidate it; any model
accepts system messages, any ``anthropic-version`` date from 2023-01-01 on is accepted, every
thinking signature is checked even with thinking disabled, and texts marked "approximate" are
the fake's own wording where the real one is unknown. Signatures are an HMAC of the thinking
text under a per-fake key (``signing_key`` shares it): ``up.sign(text)`` and
``up.redacted_data()`` make valid blocks for hand-built histories, ``up.count(body)`` is the
fake's ``count_tokens`` without HTTP.

Behaviours come from the ``x-fake-behavior`` header, else ``up.count_behavior`` for
``count_tokens`` requests (when set), else ``up.behavior``: a comma separated list of
``hang``, ``slow-stream[:seconds]``, ``reset-mid-stream[:events]``, ``error-mid-stream[:events]``,
``status:NNN``, ``tool-call``, ``redacted-thinking``, ``gzip``, ``output-only-delta`` (a
stream's ``message_delta`` usage with ``output_tokens`` alone, as the API sent it before 2025).
Summary requests (header ``x-compaction-summary: 1``, or a system prompt starting with
``SUMMARY_PROMPT_PREFIX``) are answered by the ``summarizer`` hook as in the OpenAI fake, and
other requests by the ``script`` when one is set (a ``Scripted`` tool_use or text, as in the
OpenAI fake). ``up.answered`` keeps the usage of every answer, ``up.rejected`` counts the
errors. The cache clock is ``time.monotonic()`` plus what ``up.advance(seconds)`` added.

``python -m tests.fakes.anthropic --port 8002 --window claude-small=8192`` serves it until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import re
import secrets
import string
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

import orjson
import tiktoken
from aiohttp import web

from tests.fakes.base import Behaviors, FakeAPI, Scripted, Settings, serve_until_interrupted
from tests.fakes.openai import (  # importing it also points tiktoken at its offline files
    SUMMARY_HEADER,
    SUMMARY_PROMPT_PREFIX,
    count_text,
    reply_text,
)

__all__ = ["SUMMARY_HEADER", "SUMMARY_PROMPT_PREFIX", "AnthropicError", "FakeAnthropic", "scaled"]

API_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")
OLDEST_API_VERSION = "2023-01-01"
DEFAULT_WINDOW = 200_000
LONG_CONTEXT_WINDOW = 1_000_000
LONG_CONTEXT_BETA = "context-1m-"
DISPLAY_UPDATES_BETA = "thinking-display-updates-"
MAX_BODY_BYTES = 32 * 2**20  # the Messages API's request size limit
ENCODING = "cl100k_base"
SCALE_PERCENT = 115  # Claude's tokenizer yields more tokens than cl100k on English and code
REQUEST_TOKENS = 7  # a request's fixed framing
MESSAGE_TOKENS = 3  # each message's role markers
TOOLS_TOKENS = {"auto": 346, "none": 346, "any": 313, "tool": 313}  # the tool-use system prompt
IMAGE_TOKENS = 1600  # about a 1.15 megapixel image (width * height / 750)
DOCUMENT_TOKENS = 1600  # a PDF, whatever its pages
SIGNATURE_TOKENS = 16  # a thinking block's signature, or a redacted_thinking block
CACHE_LOOKBACK = 20  # blocks before a breakpoint where earlier cache entries are looked for
CACHE_TTLS = {"5m": 300.0, "1h": 3600.0}
THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"

_BEHAVIORS: Behaviors = dict.fromkeys(
    ("hang", "tool-call", "redacted-thinking", "gzip", "output-only-delta"), str
) | {
    "slow-stream": float,
    "reset-mid-stream": int,
    "error-mid-stream": int,
    "status": int,
}
_STATUS_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Fake error 400."),
    401: ("authentication_error", "invalid x-api-key"),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "Not Found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your per-minute rate limit."),
    500: ("api_error", "Internal server error"),
    504: ("timeout_error", "Request timeout"),
    529: ("overloaded_error", "Overloaded"),
}


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


_MESSAGE_FIELDS = _names(
    "model max_tokens messages system tools tool_choice thinking stream metadata stop_sequences"
    " temperature top_p top_k service_tier container cache_control output_config inference_geo"
    " speed diagnostics"
)
_COUNT_FIELDS = _names(
    "model messages system tools tool_choice thinking cache_control output_config speed"
)
_BETA_FIELDS = {"context_management": "context-management-", "mcp_servers": "mcp-client-"}
# a message's own settings (Claude Code 2.1.332 sends its effort on each turn with this beta)
_MESSAGE_BETA_FIELDS = {"output_config": "per-turn-control-"}
_BLOCK_FIELDS = {  # the fields of each content block param, by type (the SDK's TypedDicts)
    "text": _names("type text cache_control citations"),
    "image": _names("type source cache_control transformations"),
    "document": _names("type source cache_control citations context title"),
    "search_result": _names("type source title content cache_control citations"),
    "tool_use": _names("type id name input cache_control caller toolset_name"),
    "tool_result": _names("type tool_use_id content is_error cache_control toolset_name"),
    "thinking": _names("type thinking signature"),
    "redacted_thinking": _names("type data"),
    "server_tool_use": _names("type id name input cache_control caller"),
    "web_search_tool_result": _names("type tool_use_id content cache_control caller"),
}
_LENIENT_BLOCKS = _names(  # server tool results and the like: any fields, counted as JSON
    "web_fetch_tool_result code_execution_tool_result bash_code_execution_tool_result"
    " text_editor_code_execution_tool_result tool_search_tool_result container_upload"
)
_NESTED_BLOCKS = _names("text image document search_result tool_reference")  # in tool_result
_REQUIRED: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "image": ("source",),
    "document": ("source",),
    "search_result": ("source", "title", "content"),
    "tool_use": ("id", "name", "input"),
    "tool_result": ("tool_use_id",),
    "thinking": ("signature", "thinking"),
    "redacted_thinking": ("data",),
    "server_tool_use": ("id", "name", "input"),
    "web_search_tool_result": ("content", "tool_use_id"),
}
_ASSISTANT_ONLY = (
    _names("tool_use thinking redacted_thinking server_tool_use web_search_tool_result")
    | _LENIENT_BLOCKS
) - {"container_upload"}
_TOOL_FIELDS = _names(
    "type name description input_schema cache_control strict allowed_callers defer_loading"
    " eager_input_streaming input_examples"
)
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,128}")
_THINKING_FIELDS = {
    "enabled": _names("type budget_tokens display"),
    "adaptive": _names("type display"),
    "disabled": _names("type"),
    "between_tools": _names("type"),
}
_SAMPLE_INPUT: dict[Any, Any] = {"integer": 1, "number": 1, "boolean": True, "array": []}
_ID_ALPHABET = string.ascii_letters + string.digits


# -- errors ---------------------------------------------------------------------------------------


class AnthropicError(Exception):
    """An error answered with Anthropic's body ``{"type": "error", "error": {type, message}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        default = _STATUS_ERRORS.get(status, ("api_error" if status >= 500 else "", ""))[0]
        self.status = status
        self.kind = kind or default or "invalid_request_error"
        self.message = message
        self.headers = dict(headers or {})

    def body(self, request_id: str) -> dict[str, Any]:
        error = {"type": self.kind, "message": self.message}
        return {"type": "error", "error": error, "request_id": request_id}


def _bad(message: str) -> AnthropicError:
    return AnthropicError(400, message, "invalid_request_error")


def _extra(where: str) -> AnthropicError:
    return _bad(f"{where}: Extra inputs are not permitted")


def _required(where: str) -> AnthropicError:
    return _bad(f"{where}: Field required")


def _tag_error(where: str, tag: Any, tags: Iterable[str]) -> AnthropicError:
    expected = ", ".join(f"'{t}'" for t in sorted(tags))
    return _bad(
        f"{where}: Input tag '{tag}' found using 'type' does not match any of the expected"
        f" tags: {expected}"
    )


# -- tokens ---------------------------------------------------------------------------------------


def scaled(raw: int) -> int:
    """cl100k tokens as the fake's Claude counts them: times 1.15, rounded up."""
    return (raw * SCALE_PERCENT + 99) // 100


def _raw(text: str) -> int:
    return count_text(text, ENCODING)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _sans_cache_control(block: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in block.items() if k != "cache_control"}
    if isinstance(out.get("content"), list):
        out["content"] = [
            _sans_cache_control(b) if isinstance(b, dict) else b for b in out["content"]
        ]
    return out


def _content_cost(block: Mapping[str, Any]) -> tuple[int, int]:
    """(cl100k tokens, fixed tokens) of a content block that stays in the context."""
    kind = block.get("type")
    if kind == "text":
        return _raw(block["text"]), 0
    if kind == "image":
        return 0, IMAGE_TOKENS
    if kind == "document":
        source = block.get("source") or {}
        if source.get("type") == "text":
            return _raw(str(source.get("data", ""))), 0
        if source.get("type") == "content":
            return _nested_cost(source.get("content"))
        return 0, DOCUMENT_TOKENS
    if kind in ("tool_use", "server_tool_use"):
        return _raw(str(block["name"])) + _raw(_json(block["input"])), 0
    if kind == "tool_result":
        return _nested_cost(block.get("content"))
    if kind == "thinking":
        return _raw(block["thinking"]), SIGNATURE_TOKENS
    if kind == "redacted_thinking":
        return 0, SIGNATURE_TOKENS
    return _raw(_json(_sans_cache_control(block))), 0


def _nested_cost(content: Any) -> tuple[int, int]:
    if isinstance(content, str):
        return _raw(content), 0
    raw = fixed = 0
    for item in content if isinstance(content, list) else ():
        r, f = _content_cost(item) if isinstance(item, dict) else (0, 0)
        raw, fixed = raw + r, fixed + f
    return raw, fixed


def _min_cacheable(model: str) -> int:
    return 2048 if "haiku" in model else 1024


# -- the parsed request ---------------------------------------------------------------------------


@dataclass
class _Block:
    """One block of the prompt in cache order (tools, system, messages), as it is counted."""

    path: (
        str  # where it is in the body, as the API names it: tools.0, system.1, messages.2.content.0
    )
    key: bytes  # what identifies it in a cached prefix
    tokens: int
    ttls: list[str] = field(default_factory=list)  # its cache breakpoints, "5m" or "1h"


@dataclass
class _Turn:
    """Consecutive messages of one role, merged as the API merges them."""

    role: str
    first: int  # index of its first message
    blocks: list[tuple[int, int, dict[str, Any]]]  # (message index, block index, block)


@dataclass
class _Prompt:
    body: dict[str, Any]
    model: str
    blocks: list[_Block]
    turns: list[_Turn]
    thinking: str  # "disabled", "enabled", "adaptive" or "between_tools"
    display: str  # "summarized", "omitted" or "updates" (shown as "summarized" is)
    total: int = 0
    prefix: list[int] = field(default_factory=list)  # tokens up to and including each block
    hashes: list[bytes] = field(default_factory=list)  # the hash of each prefix

    @property
    def thinking_on(self) -> bool:
        return self.thinking != "disabled"


@dataclass(frozen=True)
class _Usage:
    input: int
    read: int = 0
    created_5m: int = 0
    created_1h: int = 0

    def fields(self, output: int) -> dict[str, Any]:
        return {
            "input_tokens": self.input,
            "cache_creation_input_tokens": self.created_5m + self.created_1h,
            "cache_read_input_tokens": self.read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.created_5m,
                "ephemeral_1h_input_tokens": self.created_1h,
            },
            "output_tokens": output,
            "service_tier": "standard",
        }


@dataclass
class _Reply:
    content: list[dict[str, Any]]
    stop_reason: str
    stop_sequence: str | None
    output_tokens: int


# -- validation -----------------------------------------------------------------------------------


def _betas(headers: Mapping[str, str]) -> list[str]:
    values = headers.getall("anthropic-beta", []) if hasattr(headers, "getall") else []
    if not values and headers.get("anthropic-beta"):
        values = [headers["anthropic-beta"]]
    return [b.strip() for v in values for b in v.split(",") if b.strip()]


def _check_int(where: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{where}: Input should be a valid integer")
    if minimum is not None and value < minimum:
        raise _bad(f"{where}: Input should be greater than or equal to {minimum}")
    return value


def _check_unit(where: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"{where}: Input should be a valid number")
    if value < 0:
        raise _bad(f"{where}: Input should be greater than or equal to 0")
    if value > 1:
        raise _bad(f"{where}: Input should be less than or equal to 1")


def _check_cache_control(where: str, value: Any) -> str | None:
    """The breakpoint's TTL, or None when there is none."""
    if value is None:
        return None
    where = f"{where}.cache_control" if where else "cache_control"
    if not isinstance(value, dict):
        raise _bad(f"{where}: Input should be a valid dictionary")
    if "type" not in value:
        raise _required(f"{where}.type")
    if value["type"] != "ephemeral":
        raise _tag_error(where, value["type"], ["ephemeral"])
    for key in value:
        if key not in ("type", "ttl"):
            raise _extra(f"{where}.ephemeral.{key}")
    ttl = value.get("ttl", "5m")
    if ttl not in CACHE_TTLS:
        raise _bad(f"{where}.ephemeral.ttl: Input should be '5m' or '1h'")
    return str(ttl)


def _check_block(where: str, block: Any, nested: bool = False) -> list[str]:
    """Validate one content block; its breakpoints' TTLs (nested tool_result content included)."""
    if not isinstance(block, dict):
        raise _bad(f"{where}: Input should be a valid dictionary")
    if "type" not in block:
        raise _required(f"{where}.type")
    kind = block["type"]
    known = _NESTED_BLOCKS if nested else _BLOCK_FIELDS.keys() | _LENIENT_BLOCKS
    if kind not in known:
        raise _tag_error(where, kind, known)
    if kind in _LENIENT_BLOCKS or kind == "tool_reference":
        ttl = _check_cache_control(f"{where}.{kind}", block.get("cache_control"))
        return [ttl] if ttl else []
    inner = f"{where}.{kind}"
    for key in block:
        if key not in _BLOCK_FIELDS[kind]:
            raise _extra(f"{inner}.{key}")
    for key in _REQUIRED[kind]:
        if key not in block:
            raise _required(f"{inner}.{key}")
    for key in ("text", "id", "name", "tool_use_id", "thinking", "signature", "data"):
        if key in _REQUIRED[kind] and not isinstance(block[key], str):
            raise _bad(f"{inner}.{key}: Input should be a valid string")
    if kind in ("tool_use", "server_tool_use") and not isinstance(block["input"], dict):
        raise _bad(f"{inner}.input: Input should be a valid dictionary")
    if kind in ("image", "document") and not isinstance(block["source"], dict):
        raise _bad(f"{inner}.source: Input should be a valid dictionary")
    if "is_error" in block and not isinstance(block["is_error"], bool):
        raise _bad(f"{inner}.is_error: Input should be a valid boolean")
    ttls = []
    ttl = _check_cache_control(inner, block.get("cache_control"))
    if ttl:
        ttls.append(ttl)
    if kind == "tool_result" and "content" in block:
        content = block["content"]
        if isinstance(content, list):
            for index, item in enumerate(content):
                ttls += _check_block(f"{inner}.content.{index}", item, nested=True)
                if item.get("type") == "text":
                    _check_text(item["text"])
        elif not isinstance(content, str):
            raise _bad(f"{inner}.content: Input should be a valid list")
    return ttls


def _check_text(text: str, where: str = "messages") -> None:
    if not text:
        raise _bad(f"{where}: text content blocks must be non-empty")
    if not text.strip():
        raise _bad(f"{where}: text content blocks must contain non-whitespace text")


def _message_blocks(
    index: int, message: Any, betas: list[str]
) -> tuple[str, list[dict[str, Any]], list[list[str]]]:
    """(role, its content as blocks, each block's breakpoint TTLs) of a schema-valid message."""
    where = f"messages.{index}"
    if not isinstance(message, dict):
        raise _bad(f"{where}: Input should be a valid dictionary")
    if "role" not in message:
        raise _required(f"{where}.role")
    role = message["role"]
    if role not in ("user", "assistant", "system"):
        raise _bad(f"{where}.role: Input should be 'user', 'assistant' or 'system'")
    for key in message:
        prefix = _MESSAGE_BETA_FIELDS.get(key)
        if key not in ("role", "content") and not (
            prefix and any(b.startswith(prefix) for b in betas)
        ):
            raise _extra(f"{where}.{key}")
    if "content" not in message:
        raise _required(f"{where}.content")
    content = message["content"]
    if isinstance(content, str):
        return role, ([{"type": "text", "text": content}] if content else []), [[]]
    if not isinstance(content, list):
        raise _bad(f"{where}.content: Input should be a valid list")
    ttls = []
    for m, block in enumerate(content):
        ttls.append(_check_block(f"{where}.content.{m}", block))
        if role == "system" and block["type"] != "text":
            raise _bad(f"{where}.content.{m}.type: Input should be 'text'")
    return role, list(content), ttls


def _check_roles(role: str, index: int, blocks: list[dict[str, Any]]) -> None:
    """Approximate wording: blocks only one side of the conversation can send."""
    for m, block in enumerate(blocks):
        kind = block["type"]
        wrong = (role != "assistant" and kind in _ASSISTANT_ONLY) or (
            role != "user" and kind == "tool_result"
        )
        if wrong:
            allowed = "user" if kind == "tool_result" else "assistant"
            raise _bad(
                f"messages.{index}.content.{m}: `{kind}` blocks can only be in `{allowed}` messages"
            )


def _check_tools(body: Mapping[str, Any]) -> list[list[str]]:
    tools = body.get("tools")
    if tools is None:
        if body.get("tool_choice") not in (None, {"type": "none"}):
            raise _bad("tool_choice may only be specified while providing tools.")
        return []
    if not isinstance(tools, list):
        raise _bad("tools: Input should be a valid list")
    ttls, names = [], []
    for index, tool in enumerate(tools):
        where = f"tools.{index}"
        if not isinstance(tool, dict):
            raise _bad(f"{where}: Input should be a valid dictionary")
        kind = tool.get("type") or "custom"
        if kind == "custom":
            for key in tool:
                if key not in _TOOL_FIELDS:
                    raise _extra(f"{where}.custom.{key}")
            for key in ("name", "input_schema"):
                if key not in tool:
                    raise _required(f"{where}.custom.{key}")
            if not isinstance(tool["name"], str) or not _TOOL_NAME.fullmatch(tool["name"]):
                pattern = "String should match pattern '^[a-zA-Z0-9_-]{1,128}$'"
                raise _bad(f"{where}.custom.name: {pattern}")
            schema = tool["input_schema"]
            if not isinstance(schema, dict) or schema.get("type") != "object":
                raise _bad(f"{where}.custom.input_schema.type: Input should be 'object'")
        elif not isinstance(kind, str):
            raise _bad(f"{where}.type: Input should be a valid string")
        if "name" in tool:
            names.append(tool["name"])
        ttl = _check_cache_control(f"{where}.{kind}", tool.get("cache_control"))
        ttls.append([ttl] if ttl else [])
    if len(set(names)) != len(names):
        raise _bad("tools: Tool names must be unique.")
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict):
            raise _bad("tool_choice: Input should be a valid dictionary")
        tags = ("auto", "any", "tool", "none")
        if choice.get("type") not in tags:
            raise _tag_error("tool_choice", choice.get("type"), tags)
        allowed = {"type", "disable_parallel_tool_use"} | (
            {"name"} if choice["type"] == "tool" else set()
        )
        for key in choice:
            if key not in allowed:
                raise _extra(f"tool_choice.{choice['type']}.{key}")
        if choice["type"] == "tool" and "name" not in choice:
            raise _required("tool_choice.tool.name")
    return ttls


def _check_thinking(body: Mapping[str, Any], betas: list[str], count_only: bool) -> tuple[str, str]:
    """(mode, display) of the request's thinking config."""
    thinking = body.get("thinking")
    if thinking is None:
        return "disabled", "summarized"
    if not isinstance(thinking, dict):
        raise _bad("thinking: Input should be a valid dictionary")
    mode = thinking.get("type")
    if mode not in _THINKING_FIELDS:
        raise _tag_error("thinking", mode, _THINKING_FIELDS)
    for key in thinking:
        if key not in _THINKING_FIELDS[mode]:
            raise _extra(f"thinking.{mode}.{key}")
    display = thinking.get("display") or "summarized"
    # Claude Code 2.1.332 sends "updates" with its beta (shown here as "summarized" is)
    updates = display == "updates" and any(b.startswith(DISPLAY_UPDATES_BETA) for b in betas)
    if display not in ("summarized", "omitted") and not updates:
        raise _bad(f"thinking.{mode}.display: Input should be 'summarized' or 'omitted'")
    if mode == "enabled":
        if "budget_tokens" not in thinking:
            raise _required("thinking.enabled.budget_tokens")
        budget = _check_int("thinking.enabled.budget_tokens", thinking["budget_tokens"], 1024)
        if not count_only and body["max_tokens"] <= budget:
            raise _bad(
                "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our"
                f" documentation at {THINKING_DOCS}#max-tokens-and-context-window-size"
            )
    if mode != "disabled":
        temperature = body.get("temperature")
        if temperature is not None and temperature != 1:
            raise _bad(
                "`temperature` may only be set to 1 when thinking is enabled. Please consult our"
                f" documentation at {THINKING_DOCS}"
                "#important-considerations-when-using-extended-thinking"
            )
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
            raise _bad("Thinking may not be enabled when tool_choice forces tool use.")
    return mode, display


def _check_top(body: Any, betas: list[str], count_only: bool) -> None:
    if not isinstance(body, dict):
        raise _bad("Invalid request body: expected a JSON object.")  # approximate
    allowed = _COUNT_FIELDS if count_only else _MESSAGE_FIELDS
    for key in body:
        prefix = _BETA_FIELDS.get(key)
        if key not in allowed and not (prefix and any(b.startswith(prefix) for b in betas)):
            raise _extra(key)
    for key in ("messages", "model") if count_only else ("max_tokens", "messages", "model"):
        if key not in body:
            raise _required(key)
    if not isinstance(body["model"], str):
        raise _bad("model: Input should be a valid string")
    if not count_only:
        _check_int("max_tokens", body["max_tokens"], 0)
    if not isinstance(body["messages"], list):
        raise _bad("messages: Input should be a valid list")
    if not body["messages"]:
        raise _bad("messages: List should have at least 1 item after validation, not 0")
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise _bad("metadata: Input should be a valid dictionary")
        for key in metadata:
            if key != "user_id":
                raise _extra(f"metadata.{key}")
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            _check_unit(key, body[key])
    if body.get("top_k") is not None:
        _check_int("top_k", body["top_k"], 0)
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _bad("stream: Input should be a valid boolean")
    stops = body.get("stop_sequences")
    if stops is not None and not (
        isinstance(stops, list) and all(isinstance(s, str) for s in stops)
    ):
        raise _bad("stop_sequences: Input should be a valid list")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise _bad("service_tier: Input should be 'auto' or 'standard_only'")


def _system_blocks(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[list[str]]]:
    system = body.get("system")
    if system is None:
        return [], []
    if isinstance(system, str):
        return ([{"type": "text", "text": system}] if system else []), [[]]
    if not isinstance(system, list):
        raise _bad("system: Input should be a valid list")
    ttls = []
    for index, block in enumerate(system):
        where = f"system.{index}"
        if not isinstance(block, dict):
            raise _bad(f"{where}: Input should be a valid dictionary")
        if block.get("type") != "text":
            raise _bad(f"{where}.type: Input should be 'text'")
        for key in block:
            if key not in _BLOCK_FIELDS["text"]:
                raise _extra(f"{where}.{key}")
        if not isinstance(block.get("text"), str):
            raise _required(f"{where}.text")
        _check_text(block["text"], "system")
        ttl = _check_cache_control(where, block.get("cache_control"))
        ttls.append([ttl] if ttl else [])
    return list(system), ttls


def _merge(roles_blocks: list[tuple[str, list[dict[str, Any]]]]) -> list[_Turn]:
    turns: list[_Turn] = []
    for index, (role, blocks) in enumerate(roles_blocks):
        if not turns or turns[-1].role != role:
            turns.append(_Turn(role, index, []))
        turns[-1].blocks += [(index, m, block) for m, block in enumerate(blocks)]
    return turns


def _check_tool_pairs(turns: list[_Turn]) -> None:
    chat = [t for t in turns if t.role != "system"]
    for position, turn in enumerate(chat):
        previous = chat[position - 1] if position else None
        if turn.role == "user":
            uses = set()
            if previous is not None and previous.role == "assistant":
                uses = {b["id"] for _, _, b in previous.blocks if b["type"] == "tool_use"}
            stray = [(n, m, b) for n, m, b in turn.blocks if b["type"] == "tool_result"]
            stray = [(n, m, b) for n, m, b in stray if b["tool_use_id"] not in uses]
            if stray:
                n, m, _ = stray[0]
                ids = ", ".join(b["tool_use_id"] for _, _, b in stray)
                raise _bad(
                    f"messages.{n}.content.{m}: unexpected `tool_use_id` found in `tool_result`"
                    f" blocks: {ids}. Each `tool_result` block must have a corresponding"
                    " `tool_use` block in the previous message."
                )
            continue
        uses_at = [(n, b["id"]) for n, _, b in turn.blocks if b["type"] == "tool_use"]
        if not uses_at:
            continue
        answered = set()
        following = chat[position + 1] if position + 1 < len(chat) else None
        for _, _, block in following.blocks if following is not None else ():
            if block["type"] != "tool_result":
                break  # results must lead the next turn; later ones do not count
            answered.add(block["tool_use_id"])
        missing = [(n, use) for n, use in uses_at if use not in answered]
        if missing:
            raise _bad(
                f"messages.{missing[0][0]}: `tool_use` ids were found without `tool_result` blocks"
                f" immediately after: {', '.join(use for _, use in missing)}. Each `tool_use`"
                " block must have a corresponding `tool_result` block in the next message."
            )


def _check_nonempty(
    roles_blocks: list[tuple[str, list[dict[str, Any]]]], messages: list[Any]
) -> None:
    last = len(roles_blocks) - 1
    for index, (role, blocks) in enumerate(roles_blocks):
        final_assistant = index == last and role == "assistant"
        if not blocks and not final_assistant:
            raise _bad(
                f"messages.{index}: all messages must have non-empty content except for the"
                " optional final assistant message"
            )
        for block in blocks:
            if block["type"] == "text":
                _check_text(block["text"])
        last_text = blocks[-1].get("text") if blocks and blocks[-1]["type"] == "text" else None
        if final_assistant and last_text is not None and last_text != last_text.rstrip():
            raise _bad("messages: final assistant content cannot end with trailing whitespace")
    for index, message in enumerate(messages):
        if message["role"] == "system" and (
            index == 0 or messages[index - 1]["role"] != "user"
        ):  # approximate wording
            raise _bad(
                f"messages.{index}: a `system` message must immediately follow a `user` message"
            )


def _kept_thinking_turn(turns: list[_Turn]) -> _Turn | None:
    """The assistant turn whose thinking stays in context: the last one, when only tool results
    (or nothing) follow it. Earlier thinking is stripped by the API."""
    chat = [t for t in turns if t.role != "system"]
    for position in range(len(chat) - 1, -1, -1):
        if chat[position].role == "assistant":
            after = [b for t in chat[position + 1 :] for _, _, b in t.blocks]
            if all(b["type"] == "tool_result" for b in after):
                return chat[position]
            return None
    return None


class _Signer:
    def __init__(self, key: bytes) -> None:
        self.key = key

    def _mac(self, data: bytes) -> bytes:
        return hmac.new(self.key, data, hashlib.sha256).digest()

    def sign(self, thinking: str) -> str:
        return base64.b64encode(b"FAKE" + self._mac(b"thinking\0" + thinking.encode())).decode()

    def redacted(self) -> str:
        nonce = os.urandom(24)
        return base64.b64encode(nonce + self._mac(b"redacted\0" + nonce)).decode()

    def valid_signature(self, thinking: str, signature: str) -> bool:
        return hmac.compare_digest(self.sign(thinking), signature)

    def valid_redacted(self, data: str) -> bool:
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            return False
        nonce, mac = raw[:-32], raw[-32:]
        return len(nonce) == 24 and hmac.compare_digest(self._mac(b"redacted\0" + nonce), mac)


def _check_thinking_blocks(prompt: _Prompt, signer: _Signer) -> None:
    turns, last_index = prompt.turns, len(prompt.body["messages"]) - 1
    for turn in turns:
        if turn.role != "assistant":
            continue
        by_message: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        for n, m, block in turn.blocks:
            by_message.setdefault(n, []).append((m, block))
        for n, blocks in by_message.items():
            kinds = [b["type"] for _, b in blocks]
            has_thinking = "thinking" in kinds or "redacted_thinking" in kinds
            if has_thinking and kinds[0] not in ("thinking", "redacted_thinking"):
                raise _bad(
                    f"messages.{n}.content.0: If an assistant message contains any thinking"
                    f" blocks, the first block must be thinking or redacted_thinking. Found"
                    f" {kinds[0]}."
                )
            if n == last_index and "thinking" in kinds and not prompt.thinking_on:
                m = kinds.index("thinking")
                raise _bad(
                    f"messages.{n}.content.{m}: When thinking is disabled, an `assistant` message"
                    " in the final position cannot contain `thinking`. To use thinking blocks,"
                    " enable `thinking` in your request."
                )
            if n == last_index and kinds and kinds[-1] == "thinking":
                raise _bad(
                    f"messages.{n}: The final block in an assistant message cannot be `thinking`."
                )
            for m, block in blocks:
                if block["type"] == "thinking" and not signer.valid_signature(
                    block["thinking"], block["signature"]
                ):
                    raise _bad(f"messages.{n}.content.{m}: Invalid `signature` in `thinking` block")
                if block["type"] == "redacted_thinking" and not signer.valid_redacted(
                    block["data"]
                ):
                    # approximate wording
                    raise _bad(
                        f"messages.{n}.content.{m}: Invalid `data` in `redacted_thinking` block"
                    )
    final = next((t for t in reversed(turns) if t.role == "assistant"), None)
    if not prompt.thinking_on or final is None:
        return
    if any(b["type"] == "tool_use" for _, _, b in final.blocks):
        n, m, first = final.blocks[0]
        if first["type"] not in ("thinking", "redacted_thinking"):
            raise _bad(
                f"messages.{n}.content.{m}.type: Expected `thinking` or `redacted_thinking`, but"
                f" found `{first['type']}`. When `thinking` is enabled, a final `assistant` message"
                " must start with a thinking block (preceeding the lastmost set of `tool_use` and"
                " `tool_result` blocks). We recommend you include thinking blocks from previous"
                " turns. To avoid this requirement, disable `thinking`. Please consult our"
                f" documentation at {THINKING_DOCS}"
            )


def _check_breakpoints(blocks: list[_Block]) -> None:
    found = sum(len(b.ttls) for b in blocks)
    if found > 4:
        raise _bad(f"A maximum of 4 blocks with cache_control may be provided. Found {found}.")
    seen_5m = False
    for block in blocks:
        for ttl in block.ttls:
            if ttl == "1h" and seen_5m:
                raise _bad(
                    f"{block.path}.cache_control.ttl: a ttl='1h' cache_control block must not"
                    " come after a ttl='5m' cache_control block. Note that blocks are processed"
                    " in the following order: `tools`, `system`, `messages`."
                )
            seen_5m = seen_5m or ttl == "5m"


def parse_request(
    body: Any, headers: Mapping[str, str], signer: _Signer, *, count_only: bool = False
) -> _Prompt:
    """Validate a Messages (or count_tokens) request as the API does; the prompt, counted."""
    betas = _betas(headers)
    _check_top(body, betas, count_only)
    system, system_ttls = _system_blocks(body)
    tool_ttls = _check_tools(body)
    mode, display = _check_thinking(body, betas, count_only)
    messages = body["messages"]
    parsed = [_message_blocks(n, message, betas) for n, message in enumerate(messages)]
    roles_blocks = [(role, blocks) for role, blocks, _ in parsed]
    for index, (role, blocks) in enumerate(roles_blocks):
        _check_roles(role, index, blocks)
    _check_nonempty(roles_blocks, messages)
    turns = _merge(roles_blocks)
    _check_tool_pairs(turns)
    prompt = _Prompt(body, body["model"], [], turns, mode, display)
    _check_thinking_blocks(prompt, signer)
    _count(prompt, system, system_ttls, tool_ttls, parsed)
    _check_breakpoints(prompt.blocks)
    return prompt


def _count(
    prompt: _Prompt,
    system: list[dict[str, Any]],
    system_ttls: list[list[str]],
    tool_ttls: list[list[str]],
    parsed: list[tuple[str, list[dict[str, Any]], list[list[str]]]],
) -> None:
    """Lay the prompt out in cache order with each block's tokens, prefix sums and hashes."""
    body, blocks = prompt.body, prompt.blocks
    choice = (body.get("tool_choice") or {}).get("type", "auto")
    for index, tool in enumerate(body.get("tools") or []):
        tokens = scaled(_raw(_json(_sans_cache_control(tool))))
        tokens += TOOLS_TOKENS[choice] if index == 0 else 0
        blocks.append(_Block(f"tools.{index}", _key("tool", "", tool), tokens, tool_ttls[index]))
    for index, text in enumerate(system):
        tokens = scaled(_raw(text["text"]))
        marks = system_ttls[index] if isinstance(body.get("system"), list) else []
        blocks.append(_Block(f"system.{index}", _key("system", "", text), tokens, marks))
    kept = _kept_thinking_turn(prompt.turns)
    kept_messages = {n for n, _, _ in kept.blocks} if kept else set()
    for n, (role, content, content_ttls) in enumerate(parsed):
        overhead = MESSAGE_TOKENS
        for m, item in enumerate(content):
            thinking = item["type"] in ("thinking", "redacted_thinking")
            if thinking and n not in kept_messages:
                continue  # stripped from context: neither counted nor part of cached prefixes
            raw, fixed = _content_cost(item)
            tokens, role_key = scaled(raw) + fixed + overhead, role if overhead else ""
            marks = content_ttls[m] if m < len(content_ttls) else []
            key = _key("message", role_key, item)
            blocks.append(_Block(f"messages.{n}.content.{m}", key, tokens, marks))
            overhead = 0
        if overhead:  # an empty final assistant message still has its role markers
            blocks.append(_Block(f"messages.{n}", _key("message", role, {}), overhead))
    automatic = _check_cache_control("", body.get("cache_control"))
    if automatic and blocks and not blocks[-1].ttls:  # a breakpoint on the last block
        blocks[-1].ttls = [automatic]
    running = REQUEST_TOKENS
    chain = hashlib.blake2b(prompt.model.encode(), digest_size=16).digest()  # caches are per model
    for laid in blocks:
        running += laid.tokens
        chain = hashlib.blake2b(chain + laid.key, digest_size=16).digest()
        prompt.prefix.append(running)
        prompt.hashes.append(chain)
    prompt.total = running


def _key(section: str, role: str, block: Mapping[str, Any]) -> bytes:
    return orjson.dumps([section, role, _sans_cache_control(block)], option=orjson.OPT_SORT_KEYS)


# -- answers --------------------------------------------------------------------------------------


def _last_user_text(prompt: _Prompt) -> str:
    for turn in reversed(prompt.turns):
        if turn.role == "user":
            return "".join(b["text"] for _, _, b in turn.blocks if b["type"] == "text")
    return ""


def _system_text(body: Mapping[str, Any]) -> list[str]:
    texts = []
    system = body.get("system")
    if isinstance(system, str):
        texts.append(system)
    elif isinstance(system, list):
        texts.append("".join(b.get("text", "") for b in system))
    for message in body["messages"]:
        if message["role"] == "system":
            content = message["content"]
            texts.append(
                content if isinstance(content, str) else "".join(b["text"] for b in content)
            )
    return texts


def is_summary_request(headers: Mapping[str, str], body: Mapping[str, Any]) -> bool:
    return headers.get(SUMMARY_HEADER) == "1" or any(
        t.startswith(SUMMARY_PROMPT_PREFIX) for t in _system_text(body)
    )


def _random_id(prefix: str, length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def _request_id() -> str:
    return _random_id("req_011C", 20)


def _hashed_id(prefix: str, data: bytes, length: int = 22) -> str:
    number = int.from_bytes(hashlib.blake2b(data, digest_size=24).digest())
    chars = []
    for _ in range(length):
        number, rest = divmod(number, len(_ID_ALPHABET))
        chars.append(_ID_ALPHABET[rest])
    return prefix + "".join(chars)


def _tool_use(body: Mapping[str, Any], raw: bytes) -> dict[str, Any] | None:
    """A call of the tool tool_choice names, else of the first custom tool, with sample input."""
    custom = [t for t in body.get("tools") or [] if (t.get("type") or "custom") == "custom"]
    if not custom:
        return None
    choice = body.get("tool_choice") or {}
    tool = next((t for t in custom if t["name"] == choice.get("name")), custom[0])
    schema = tool.get("input_schema") or {}
    types = {k: (v or {}).get("type") for k, v in (schema.get("properties") or {}).items()}
    sample = {k: _SAMPLE_INPUT.get(types.get(k), "x") for k in schema.get("required") or []}
    return {
        "type": "tool_use",
        "id": _hashed_id("toolu_01", raw),
        "name": tool["name"],
        "input": sample,
    }


def _scripted_use(body: Mapping[str, Any], scripted: Scripted, raw: bytes) -> dict[str, Any]:
    """The script's call, of a tool the request has."""
    if not any(t.get("name") == scripted.tool for t in body.get("tools") or []):
        raise AnthropicError(
            500, f"the script called {scripted.tool!r}, not among the request's tools", "api_error"
        )
    use = {"type": "tool_use", "id": _hashed_id("toolu_01", raw), "name": scripted.tool}
    return {**use, "input": scripted.arguments}


def _cut_text(text: str, limit: int) -> str:
    encoding = tiktoken.get_encoding(ENCODING)
    tokens = encoding.encode(text, disallowed_special=())
    return encoding.decode(tokens[: max(limit, 0) * 100 // SCALE_PERCENT])


# -- the server -----------------------------------------------------------------------------------


def _json_response(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _pieces(text: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+$", text)  # words with their leading space: they join back


class FakeAnthropic(FakeAPI):
    """The fake API on 127.0.0.1, served from a background thread with its own event loop; its
    `base_url` is what the SDK's ``base_url`` and Claude Code's ``ANTHROPIC_BASE_URL`` take
    (no /v1).

    ``windows`` maps models to context windows (``default_window`` otherwise); the models in
    ``long_context`` get ``long_context_window`` with an ``anthropic-beta: context-1m-...``
    header. ``max_output`` caps ``max_tokens`` per model. ``min_cacheable`` overrides the
    minimum cacheable prefix per model. ``api_key`` None accepts any credential, or none.
    ``signing_key`` lets two fakes accept each other's thinking blocks.
    """

    known_behaviors = _BEHAVIORS
    error_type = AnthropicError

    def __init__(
        self,
        *,
        default_window: int = DEFAULT_WINDOW,
        long_context: Iterable[str] = (),
        long_context_window: int = LONG_CONTEXT_WINDOW,
        max_output: Mapping[str, int] | None = None,
        min_cacheable: Mapping[str, int] | None = None,
        user_first: bool = False,
        signing_key: bytes | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        **settings: Unpack[Settings],
    ) -> None:
        # A larger body gets the API's own 413, not aiohttp's.
        limit = max_body_bytes + 2**20
        super().__init__(default_window=default_window, max_body_bytes=limit, **settings)
        self.long_context = set(long_context)
        self.long_context_window = long_context_window
        self.max_output = dict(max_output or {})
        self.min_cacheable = dict(min_cacheable or {})
        self.count_behavior = ""  # count_tokens requests only: a proxy's own counts failing
        self.user_first = user_first  # Bedrock's (and the 2024 API's) rule
        self.max_body_bytes = max_body_bytes
        self._signer = _Signer(signing_key or os.urandom(32))
        self._cache: dict[tuple[str, bytes], tuple[float, float]] = {}  # -> (expiry, ttl)
        self._offset = 0.0

    # -- for the tests ----------------------------------------------------------------------------

    @property
    def cache_entries(self) -> int:
        """Live prompt cache entries."""
        with self._changed:
            now = self.now()
            return sum(1 for expiry, _ in self._cache.values() if expiry > now)

    def now(self) -> float:
        """The cache clock."""
        return time.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the cache clock forward, e.g. past a TTL."""
        with self._changed:
            self._offset += seconds

    def clear_cache(self) -> None:
        with self._changed:
            self._cache.clear()

    def reset(self) -> None:
        """Forget the requests, the counters and the prompt cache (settings are kept)."""
        with self._changed:
            self._forget()
            self._cache.clear()

    def sign(self, thinking: str) -> str:
        """The signature this fake gives, and accepts, for a thinking block with this text."""
        return self._signer.sign(thinking)

    def redacted_data(self) -> str:
        """A ``data`` value this fake accepts in a ``redacted_thinking`` block."""
        return self._signer.redacted()

    def count(self, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> int:
        """The input tokens of a request (messages or count_tokens) by the fake's count, as
        ``count_tokens`` answers; AnthropicError if it is invalid."""
        fields = _COUNT_FIELDS | _BETA_FIELDS.keys()
        body = {k: v for k, v in body.items() if k in fields}
        return parse_request(body, headers or {}, self._signer, count_only=True).total

    async def _prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers.setdefault("request-id", _request_id())

    # -- requests ---------------------------------------------------------------------------------

    def _behavior_of(self, request: web.Request) -> str:
        counting = request.path == "/v1/messages/count_tokens" and self.count_behavior
        return self.count_behavior if counting else self.behavior

    def _error_response(self, request: web.Request, error: Exception) -> web.StreamResponse:
        assert isinstance(error, AnthropicError)
        request_id = _request_id()  # the same in the body and the header
        headers = {**error.headers, "request-id": request_id}
        return web.Response(
            body=orjson.dumps(error.body(request_id)),
            status=error.status,
            content_type="application/json",
            headers=headers,
        )

    def _check_headers(self, request: web.Request) -> None:
        headers = request.headers
        if self.api_key is not None:
            bearer = headers.get("authorization", "")
            scheme, _, token = bearer.partition(" ")
            given = headers.get("x-api-key") or (
                token.strip() if scheme.lower() == "bearer" else ""
            )
            if not given:
                raise AnthropicError(401, "x-api-key header is required", "authentication_error")
            if given != self.api_key:
                raise AnthropicError(401, "invalid x-api-key", "authentication_error")
        version = headers.get("anthropic-version")
        if version is None:
            raise _bad("anthropic-version: header is required")
        if not (API_VERSION.fullmatch(version) and version >= OLDEST_API_VERSION):
            raise _bad(f"anthropic-version: invalid version {version!r}")  # approximate

    async def _respond(
        self, request: web.Request, raw: bytes, data: Any, behaviors: dict[str, str]
    ) -> web.StreamResponse:
        method, path = request.method, request.path
        if len(raw) > self.max_body_bytes:
            raise AnthropicError(413, _STATUS_ERRORS[413][1], "request_too_large")
        if not path.startswith("/v1/"):
            raise AnthropicError(404, "Not Found", "not_found_error")
        self._check_headers(request)
        if "hang" in behaviors:
            await asyncio.Event().wait()
        if "status" in behaviors:
            status = int(behaviors["status"])
            kind, message = _STATUS_ERRORS.get(status, ("", f"Fake error {status}."))
            headers = {"retry-after": "1"} if status in (429, 529) else {}
            raise AnthropicError(status, message, kind or None, headers)
        if (method, path) == ("POST", "/v1/messages"):
            return await self._messages(request, raw, data, behaviors)
        if (method, path) == ("POST", "/v1/messages/count_tokens"):
            if raw and data is None:
                raise _bad("Invalid request body: expected a JSON object.")  # approximate
            prompt = parse_request(data, request.headers, self._signer, count_only=True)
            return _json_response({"input_tokens": prompt.total})
        if (method, path) == ("GET", "/v1/models"):
            models = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in self.windows
            ]
            first, last = (models[0]["id"], models[-1]["id"]) if models else (None, None)
            page = {"data": models, "has_more": False, "first_id": first, "last_id": last}
            return _json_response(page)
        raise AnthropicError(404, "Not Found", "not_found_error")

    def _window(self, model: str, headers: Mapping[str, str]) -> int:
        long = any(b.startswith(LONG_CONTEXT_BETA) for b in _betas(headers))
        if long and model in self.long_context:
            return self.long_context_window
        return self.window_of(model)

    async def _messages(
        self, request: web.Request, raw: bytes, body: Any, behaviors: dict[str, str]
    ) -> web.StreamResponse:
        if raw and body is None:
            raise _bad("Invalid request body: expected a JSON object.")  # approximate
        prompt = parse_request(body, request.headers, self._signer)
        if self.user_first and body["messages"][0]["role"] != "user":
            raise _bad('messages: first message must use the "user" role')
        model, limit = prompt.model, body["max_tokens"]
        cap = self.max_output.get(model)
        if cap is not None and limit > cap:
            raise _bad(
                f"max_tokens: {limit} > {cap}, which is the maximum allowed number of output"
                f" tokens for {model}"
            )
        window = self._window(model, request.headers)
        if prompt.total > window:
            raise _bad(f"prompt is too long: {prompt.total} tokens > {window} maximum")
        if prompt.total + limit > window:
            raise _bad(
                f"input length and `max_tokens` exceed context limit: {prompt.total} + {limit} >"
                f" {window}, decrease input length or `max_tokens` and try again"
            )
        if is_summary_request(request.headers, body):
            text, tool = await self.summarize(body), None
        else:
            text, tool = self._answer(request, body, raw, prompt, behaviors)
        usage = self._use_cache(prompt)
        reply = self._reply(prompt, text, tool, "redacted-thinking" in behaviors)
        self.note_usage(request, usage.fields(reply.output_tokens))
        message = {
            "id": _random_id("msg_01", 22),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": reply.content,
            "stop_reason": reply.stop_reason,
            "stop_sequence": reply.stop_sequence,
            "usage": usage.fields(reply.output_tokens),
        }
        if body.get("stream"):
            events = _stream_events(message, usage, reply, "output-only-delta" in behaviors)
            kind = "text/event-stream; charset=utf-8"
            return await self.stream(request, events, behaviors, kind, _overloaded)
        payload = orjson.dumps(message)
        if "reset-mid-stream" in behaviors:  # cut the JSON body half way
            return await self.stream(request, [payload], behaviors, "application/json", _overloaded)
        return web.Response(body=payload, content_type="application/json")

    def _answer(
        self,
        request: web.Request,
        body: dict[str, Any],
        raw: bytes,
        prompt: _Prompt,
        behaviors: dict[str, str],
    ) -> tuple[str, dict[str, Any] | None]:
        """(text, tool_use) of an answer that is not a summary: the script's, else the fake's."""
        scripted = None if self.script is None else self.script(request.headers, body)
        if scripted is not None:
            tool = None if scripted.tool is None else _scripted_use(body, scripted, raw)
            return scripted.text, tool
        choice = (body.get("tool_choice") or {}).get("type")
        wants_tool = "tool-call" in behaviors or choice in ("any", "tool")
        tool = _tool_use(body, raw) if wants_tool and choice != "none" else None
        return reply_text(prompt.total, _last_user_text(prompt)), tool

    def _reply(
        self, prompt: _Prompt, text: str, tool: dict[str, Any] | None, redacted: bool
    ) -> _Reply:
        limit, content, used = prompt.body["max_tokens"], [], 0
        if limit == 0:  # a cache warm-up: nothing generated
            return _Reply([], "max_tokens", None, 0)
        if prompt.thinking_on:
            thought = (
                f"Fake thinking about {hashlib.blake2b(text.encode(), digest_size=4).hexdigest()}."
            )
            used += scaled(_raw(thought)) + SIGNATURE_TOKENS
            if redacted:
                content.append({"type": "redacted_thinking", "data": self._signer.redacted()})
            else:
                shown = "" if prompt.display == "omitted" else thought
                block = {"type": "thinking", "thinking": shown, "signature": self.sign(shown)}
                content.append(block)
        if tool is not None:
            content.append(tool)
            used += scaled(_raw(tool["name"]) + _raw(_json(tool["input"])))
            return _Reply(content, "tool_use", None, used)
        stop_reason, stop_sequence = "end_turn", None
        hits = [(text.find(s), s) for s in prompt.body.get("stop_sequences") or [] if s in text]
        if hits:
            at, stop_sequence = min(hits)
            text, stop_reason = text[:at], "stop_sequence"
        tokens = scaled(_raw(text))
        if used + tokens > limit:
            text, stop_reason, stop_sequence = _cut_text(text, limit - used), "max_tokens", None
            tokens = max(limit - used, 0)
        if text:
            content.append({"type": "text", "text": text})
        return _Reply(content, stop_reason, stop_sequence, used + tokens)

    def _use_cache(self, prompt: _Prompt) -> _Usage:
        """Read and write the prompt cache for a request; its input token figures."""
        minimum = self.min_cacheable.get(prompt.model, _min_cacheable(prompt.model))
        points = [i for i, b in enumerate(prompt.blocks) if b.ttls and prompt.prefix[i] >= minimum]
        if not points:
            return _Usage(prompt.total)
        with self._changed:
            now = self.now()
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            hit = -1
            for point in reversed(points):
                for j in range(point, max(point - CACHE_LOOKBACK, 0) - 1, -1):
                    if (prompt.model, prompt.hashes[j]) in self._cache:
                        hit = j
                        break
                if hit >= 0:
                    break
            if hit >= 0:
                key = (prompt.model, prompt.hashes[hit])
                self._cache[key] = (now + self._cache[key][1], self._cache[key][1])
            created = {"5m": 0, "1h": 0}
            start = prompt.prefix[hit] if hit >= 0 else 0
            for point in points:
                ttl = max(prompt.blocks[point].ttls, key=CACHE_TTLS.__getitem__)
                if point > hit:
                    created[ttl] += prompt.prefix[point] - start
                    start = prompt.prefix[point]
                key = (prompt.model, prompt.hashes[point])
                expiry = max(self._cache.get(key, (0.0, 0.0))[0], now + CACHE_TTLS[ttl])
                self._cache[key] = (expiry, max(CACHE_TTLS[ttl], self._cache.get(key, (0, 0))[1]))
        read = prompt.prefix[hit] if hit >= 0 else 0
        rest = prompt.total - prompt.prefix[points[-1]]
        return _Usage(rest, read, created["5m"], created["1h"])

    def _invalid(self, message: str) -> Exception:
        return _bad(message)

    def _failed(self) -> Exception:
        return AnthropicError(500, _STATUS_ERRORS[500][1], "api_error")


def _overloaded(response: web.StreamResponse) -> bytes:
    """The event that ends a stream the API got overloaded in (``error-mid-stream``)."""
    error = AnthropicError(529, "Overloaded", "overloaded_error")
    return _sse("error", error.body(response.headers["request-id"]))


def _stream_events(
    message: dict[str, Any], usage: _Usage, reply: _Reply, output_only: bool
) -> list[bytes]:
    """The SSE events of a streamed answer, framed as Anthropic frames them (`output_only`:
    the final usage with output_tokens alone)."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = usage.fields(min(reply.output_tokens, 1))
    events = [_sse("message_start", {"type": "message_start", "message": start})]
    events.append(_sse("ping", {"type": "ping"}))
    for index, block in enumerate(reply.content):
        kind = block["type"]
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            opening = {**block, "input": {}}
            arguments = orjson.dumps(block["input"]).decode()
            deltas = [{"type": "input_json_delta", "partial_json": ""}]
            deltas += [
                {"type": "input_json_delta", "partial_json": arguments[i : i + 8]}
                for i in range(0, len(arguments), 8)
            ]
        else:  # redacted_thinking comes whole
            opening = block
        events.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        events += [
            _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    final = usage.fields(reply.output_tokens)
    final = {
        k: final[k]
        for k in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
        )
        if k == "output_tokens" or not output_only
    }
    delta = {"stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence}
    events.append(_sse("message_delta", {"type": "message_delta", "delta": delta, "usage": final}))
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events


if __name__ == "__main__":
    serve_until_interrupted(FakeAnthropic, "Serve the fake Anthropic API until Ctrl-C.", 8002)
