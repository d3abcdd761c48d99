"""Anthropic Messages (`POST /v1/messages`): Claude Code and every Anthropic SDK client.

The conversation is `messages`; `system` and `tools` are never changed (they count as fixed
tokens). A request is read in `request` and a view written back in `view` (content blocks map
to canonical messages and back in `blocks`; the proxy's own prompt-cache breakpoints are placed
by `breakpoints`). The API rejects unknown body fields, so nothing is ever added to a body but
the messages of the view (and breakpoints in them). Here: the rest of what the request path
asks of the API (errors, sessions, fixed tokens, usage, overflows, counts, windows and
credentials, summary calls).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from policies import Message
from proxy.credentials import bearer
from proxy.dialects.anthropic import groups, view
from proxy.dialects.anthropic.blocks import (
    REDACTED_THINKING_TOKENS,
    SIGNATURE_TOKENS,
    thinking_turn,
)
from proxy.dialects.anthropic.request import known_messages, read_request, read_whole
from proxy.dialects.base import Entries, Parsed, Usage
from proxy.dialects.capabilities import (
    CacheBreakpoints,
    Entitlements,
    OutputLimits,
    OutputOverflow,
    StreamStartUsage,
    TokenCounting,
)
from proxy.dialects.json_checks import error_field
from proxy.dialects.raw_items import SPLIT_FROM
from proxy.errors import APIError, SummaryFailed
from proxy.models.tokens import TokenCounter

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
OVERFLOW = ("prompt is too long", "input length and `max_tokens` exceed context limit")
# The API's words, which Claude Code parses to retry with less max_tokens by itself.
_OUTPUT_OVERFLOW = re.compile(
    r"^input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)"
)
_PROMPT_OVERFLOW = re.compile(r"^prompt is too long: (\d+) tokens > \d+ maximum")
SESSION_HEADER = "x-claude-code-session-id"
# A Claude Code sub-agent sends its parent's session id and its own agent id: a conversation
# of its own, in parallel with its parent's.
AGENT_HEADER = "x-claude-code-agent-id"
# Claude Code's older `metadata.user_id`: user_<hash>_account_<uuid or nothing>_session_<uuid>;
# newer versions send a JSON object as that string, with a `session_id`.
_USER_ID_SESSION = re.compile(r"_session_([0-9A-Za-z-]+)$")
LONG_CONTEXT_BETA = "context-1m-"
LONG_CONTEXT_WINDOW = 1_000_000
TOOL_USE_SYSTEM_TOKENS = 346  # the tool-use system prompt Anthropic adds (its pricing docs)
OAUTH_PREFIX = "sk-ant-oat"  # a subscription's token (Claude Code signed in with an account)
# What count_tokens takes of a Messages request (the API refuses any other field): the prompt
# and what changes its count, not how to answer it. The last two are beta fields.
COUNT_FIELDS = frozenset(
    {
        *("model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control"),
        *("output_config", "speed", "context_management", "mcp_servers"),
    }
)


class Messages(CacheBreakpoints, TokenCounting, Entitlements, StreamStartUsage, OutputLimits):
    name = "messages"
    path = "/v1/messages"
    upstream_path = "/messages"  # below a base URL such as https://api.anthropic.com/v1
    conversation_param = "messages"
    call_headers = {"anthropic-version": "2023-06-01"}
    count_path = "/v1/messages/count_tokens"
    count_upstream_path = "/messages/count_tokens"

    def __init__(self, *, split_from: int = SPLIT_FROM) -> None:
        self.known = known_messages(split_from)

    def parse(self, raw: bytes) -> Parsed:
        return read_request(self.known, raw)

    def parse_whole(self, raw: bytes) -> Parsed:
        """The request read whole, every message mapped: what the split reads, and for a body
        it does not read, what is wrong with it."""
        return read_whole(raw)

    def error_body(self, error: APIError) -> bytes:
        return anthropic_error_body(error)

    def session_hint(self, headers: Mapping[str, str], parsed: Parsed) -> str | None:
        named = headers.get(SESSION_HEADER)
        if not named:
            metadata = parsed.body.get("metadata")
            user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
            named = user_id_session(user_id) if isinstance(user_id, str) else None
        agent = headers.get(AGENT_HEADER)
        return f"{named}/agent/{agent}" if named and agent else named

    def fixed_tokens(self, parsed: Parsed, counter: TokenCounter) -> int:
        body = parsed.body
        tokens = 0
        if body.get("system"):
            tokens += counter.message({"role": "system", "content": body["system"]})
        if body.get("tools"):
            tokens += TOOL_USE_SYSTEM_TOKENS + counter.json(body["tools"])
        for block in thinking_turn(parsed.items)[1]:
            if block["type"] == "thinking":
                thinking = block.get("thinking")
                tokens += SIGNATURE_TOKENS + counter.text(
                    thinking if isinstance(thinking, str) else ""
                )
            else:
                tokens += REDACTED_THINKING_TOKENS
        return tokens

    def summary_items(self, header: Message) -> list[Any]:
        return groups.summary_items(header)

    def edited_items(self, items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
        return groups.edited_items(items, original, edited)

    def render(self, parsed: Parsed, entries: Entries, breakpoints: bool = False) -> bytes:
        items = view.view_items(parsed, entries, breakpoints)
        return parsed.raw if items is None else self.body_with(parsed, items)

    def wants_usage(self, parsed: Parsed) -> bool:
        return True  # the API always reports it

    def usage(self, payload: bytes) -> Usage | None:
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        return _usage(body.get("usage") if isinstance(body, dict) else None)

    def stream_usage(self, tail: bytes) -> Usage | None:
        return _event_usage(tail, b"message_delta", reverse=True)

    def stream_start_usage(self, head: bytes) -> Usage | None:
        return _event_usage(head, b"message_start", reverse=False)

    def count_body(self, body: bytes) -> bytes:
        fields = orjson.loads(body)
        return orjson.dumps({k: v for k, v in fields.items() if k in COUNT_FIELDS})

    def counted(self, payload: bytes) -> int | None:
        try:
            tokens = orjson.loads(payload).get("input_tokens")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return tokens if type(tokens) is int and tokens > 0 else None

    def window(self, headers: Mapping[str, str]) -> int | None:
        betas = headers.get("anthropic-beta", "")
        if any(b.strip().startswith(LONG_CONTEXT_BETA) for b in betas.split(",")):
            return LONG_CONTEXT_WINDOW
        return None

    def may_reuse_credentials(self, credentials: Sequence[tuple[str, str]]) -> bool:
        return not any(
            name in ("authorization", "x-api-key") and bearer(value).startswith(OAUTH_PREFIX)
            for name, value in credentials
        )

    def is_overflow(self, status: int, payload: bytes) -> bool:
        message = error_field(payload, "message") if status == 400 else None
        return message is not None and message.startswith(OVERFLOW)

    def output_overflow(self, payload: bytes) -> OutputOverflow | None:
        found = _OUTPUT_OVERFLOW.match(error_field(payload, "message") or "")
        return None if found is None else OutputOverflow(*map(int, found.groups()))

    def overflow_prompt(self, payload: bytes) -> int | None:
        # The prompt alone over the window is told in words of its own.
        found = _PROMPT_OVERFLOW.match(error_field(payload, "message") or "")
        return None if found is None else int(found.group(1))

    def with_max_output(self, body: bytes, max_output: int) -> bytes | None:
        request = orjson.loads(body)
        thinking = request.get("thinking")
        # Extended thinking's budget is part of max_tokens, which must stay above it.
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        floor = budget + 1 if isinstance(budget, int) and thinking.get("type") == "enabled" else 1
        if max_output < floor:
            return None
        return orjson.dumps({**request, "max_tokens": max_output})

    def summary_body(
        self, model: str, system: str, prompt: str, max_tokens: int, temperature: float
    ) -> bytes:
        return orjson.dumps(
            {
                "model": model,
                "max_tokens": max_tokens,
                "system": system,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": temperature,
            }
        )

    def summary_text(self, payload: bytes) -> str:
        message = orjson.loads(payload)
        if message.get("stop_reason") == "max_tokens":
            raise SummaryFailed("overlong")
        return "".join(
            block["text"]
            for block in message.get("content") or ()
            if isinstance(block, dict) and block.get("type") == "text"
        )


def anthropic_error_body(error: APIError) -> bytes:
    """Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`."""
    status = error.status_code
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})


def user_id_session(user_id: str) -> str | None:
    """The session id inside Claude Code's `metadata.user_id`, in either of its forms."""
    if user_id.startswith("{"):
        try:
            data = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        session = data.get("session_id") if isinstance(data, dict) else None
        return session if isinstance(session, str) and session else None
    found = _USER_ID_SESSION.search(user_id)
    return found.group(1) if found else None


def _usage(usage: Any) -> Usage | None:
    """Anthropic's `input_tokens` is what follows the last cache breakpoint: the prompt is that
    plus what was read from and written to the cache."""
    if not isinstance(usage, dict):
        return None
    counts = [
        usage.get(k)
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    ]
    if not isinstance(counts[0], int) or isinstance(counts[0], bool):
        return None
    read, created = (c if isinstance(c, int) and not isinstance(c, bool) else 0 for c in counts[1:])
    return Usage(counts[0] + read + created, read, created)


def _event_usage(data: bytes, event: bytes, *, reverse: bool) -> Usage | None:
    """The usage of the first (or last) `event` in some bytes of a stream."""
    lines = data.split(b"\n")
    for line in reversed(lines) if reverse else lines:
        if not (line.startswith(b"data:") and event in line and b'"usage"' in line):
            continue
        try:
            payload = orjson.loads(line[5:].strip())
        except orjson.JSONDecodeError:
            continue
        if not isinstance(payload, dict):
            continue
        holder = payload.get("message") if event == b"message_start" else payload
        usage = _usage(holder.get("usage") if isinstance(holder, dict) else None)
        # A prompt of no tokens is one not counted yet: a translated stream (litellm's, from
        # chat completions) learns the usage at its end, in message_delta.
        if usage is not None and usage.prompt_tokens > 0:
            return usage
    return None
