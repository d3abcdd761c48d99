"""OpenAI's Responses API (`POST /v1/responses`): Codex CLI, the OpenAI Agents SDK and every
stateless Responses client.

The conversation is `input` (items, see `responses_items`); `instructions` and `tools` are
outside it and never changed. A request whose history is held upstream
(`previous_response_id`, `conversation`) is forwarded unchanged: the proxy cannot see it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from policies import Message
from proxy.dialects.base import Parsed, Usage
from proxy.dialects.capabilities import OutputLimits, OutputOverflow, StreamOverflow
from proxy.dialects.item_bytes import ItemBytes
from proxy.dialects.json_checks import invalid_type, load_object, optional_bool, optional_int
from proxy.dialects.openai.responses_edits import edited_items
from proxy.dialects.openai.responses_items import Mapped, map_items
from proxy.dialects.openai.shared import (
    REASONING_HEADROOM_TOKENS,
    OpenAIDialect,
    is_reasoning_model,
    with_output_limit,
)
from proxy.dialects.raw_items import SPLIT_FROM, KnownItems, Split
from proxy.dialects.sse import EventStream
from proxy.errors import InvalidRequest, SummaryFailed
from proxy.models.tokens import TokenCounter

# Where Codex CLI names its conversation: the thread (a sub-agent's thread is its own, under
# its parent's `session-id`); before it sent `thread-id`, the session as `session_id`.
SESSION_HEADERS = ("thread-id", "session-id", "session_id")
HELD_UPSTREAM = ("previous_response_id", "conversation")  # fields naming a history held upstream
MIN_OUTPUT_TOKENS = 16  # the API refuses a lower max_output_tokens
# The events that open every stream, before the one that may report an overflow.
_OPENING = frozenset({"response.created", "response.in_progress"})
_HEAD_LIMIT = 1 << 20  # a stream head this long without a verdict is no overflow report
_USAGE = b'"usage":{'
COMPACTION_TRIGGER = "compaction_trigger"  # an item: "compacts the current context"


class Responses(OpenAIDialect, StreamOverflow, OutputLimits):
    name = "responses"
    path = "/v1/responses"
    upstream_path = "/responses"
    conversation_param = "input"
    usage_fields = ("input_tokens", "input_tokens_details")

    def __init__(self, *, split_from: int = SPLIT_FROM) -> None:
        # Items sent before are looked up by their bytes, and the canonical messages of a
        # body's items kept with it (`raw_items`): a replayed turn maps only its new items.
        self.known = KnownItems(_is_object, min_bytes=split_from, fold=_mapped)

    def parse(self, raw: bytes) -> Parsed:
        try:
            split = self.known.split(raw, "input")
        except InvalidRequest:
            split = None  # the whole-body path names the item, after any other fault
        if split is None:
            return self.parse_whole(raw)
        _check_instructions(split.body)
        return _parsed(raw, split.body, split.items, split.raw, split.folded)

    def parse_whole(self, raw: bytes) -> Parsed:
        """The request read whole, every item mapped: the path of a body the split does not
        read, which says what is wrong with it."""
        body = load_object(raw)
        _check_instructions(body)
        return _parsed(raw, body, input_items(body.get("input")), None, None)

    def session_hint(self, headers: Mapping[str, str], parsed: Parsed) -> str | None:
        metadata = parsed.body.get("metadata")
        thread, *sessions = (headers.get(name) for name in SESSION_HEADERS)
        for value in (
            thread,
            parsed.body.get("prompt_cache_key"),  # Codex's: its conversation (the thread)
            *sessions,
            metadata.get("session_id") if isinstance(metadata, dict) else None,
        ):
            if isinstance(value, str) and value:
                return value
        return None

    def client_compaction(self, parsed: Parsed) -> bool:
        """A summarisation turn (Codex's on a custom provider), or a `compaction_trigger` as the
        last item (Codex's built-in provider, `remote_compaction_v2`), relayed to the upstream."""
        items = parsed.items
        last = items[-1] if items else None
        trigger = isinstance(last, dict) and last.get("type") == COMPACTION_TRIGGER
        return trigger or super().client_compaction(parsed)

    def fixed_tokens(self, parsed: Parsed, counter: TokenCounter) -> int:
        """Reply priming, `instructions` counted as the system message it is, function tools
        as chat's, and the other tools (custom tools with their grammar, hosted tools) by
        their JSON."""
        body = parsed.body
        tools = body.get("tools")
        tools = tools if isinstance(tools, list) else []
        functions = [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        others = [t for t in tools if not (isinstance(t, dict) and t.get("type") == "function")]
        fixed = counter.fixed({"tools": functions})
        for system in (body.get("instructions"), orjson.dumps(others).decode() if others else ""):
            if isinstance(system, str) and system:  # each counted once, then remembered
                fixed += counter.message({"role": "system", "content": system})
        return fixed

    def summary_items(self, header: Message) -> list[Any]:
        role = header["role"]
        part = "output_text" if role == "assistant" else "input_text"
        return [
            {
                "type": "message",
                "role": role,
                "content": [{"type": part, "text": header["content"]}],
            }
        ]

    def edited_items(self, items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
        return edited_items(items, original, edited)

    def wants_usage(self, parsed: Parsed) -> bool:
        return True  # a Responses stream always ends with the response and its usage

    def stream_usage(self, tail: bytes) -> Usage | None:
        """The usage of the last event (response.completed or .incomplete): the event itself
        may be longer than the tail (it repeats instructions and tools), its usage is last."""
        start = tail.rfind(_USAGE)
        if start < 0:
            return None
        start += len(_USAGE) - 1
        depth = 0
        for end in range(start, len(tail)):
            depth += {123: 1, 125: -1}.get(tail[end], 0)  # { and }: usage holds no strings
            if depth == 0:
                try:
                    return self.usage_of(orjson.loads(tail[start : end + 1]))
                except orjson.JSONDecodeError:
                    return None
        return None

    def stream_overflow(self, head: bytes) -> bool | None:
        """The API reports an overflow met once streaming has begun as `response.failed` (or
        an `error` event) with code context_length_exceeded, right after the opening events."""
        for event in _events(head):
            kind = event.get("type")
            if kind in _OPENING:
                continue
            if kind == "response.failed":
                response = event.get("response")
                error = response.get("error") if isinstance(response, dict) else None
            else:
                error = event.get("error", event) if kind == "error" else None
            return isinstance(error, dict) and error.get("code") == "context_length_exceeded"
        return False if len(head) > _HEAD_LIMIT else None

    def output_overflow(self, payload: bytes) -> OutputOverflow | None:
        """None: the API's overflow error gives no figures ("Your input exceeds the context
        window of this model"); a max_output_tokens the window cannot hold is lowered before
        the first try only."""
        return None

    def with_max_output(self, body: bytes, max_output: int) -> bytes | None:
        return with_output_limit(body, ("max_output_tokens",), max_output, MIN_OUTPUT_TOKENS)

    def summary_body(
        self, model: str, system: str, prompt: str, max_tokens: int, temperature: float
    ) -> bytes:
        body: dict[str, Any] = {
            "model": model,
            "instructions": system,
            "input": [{"role": "user", "content": prompt}],
            "store": False,
        }
        if is_reasoning_model(model):
            # Reasoning models reject temperature, and spend output tokens on reasoning first.
            body["max_output_tokens"] = max_tokens + REASONING_HEADROOM_TOKENS
            body["reasoning"] = {"effort": "low"}
        else:
            body["temperature"] = temperature
            body["max_output_tokens"] = max(MIN_OUTPUT_TOKENS, max_tokens)
        return orjson.dumps(body)

    def summary_text(self, payload: bytes) -> str:
        response = orjson.loads(payload)
        if response.get("status") == "incomplete":
            raise SummaryFailed("overlong")
        texts = [
            part["text"]
            for item in response.get("output") or []
            if item.get("type") == "message"
            for part in item.get("content") or []
            if part.get("type") == "output_text" and isinstance(part.get("text"), str)
        ]
        return "".join(texts)


def input_items(given: Any) -> list[Any]:
    """A body's `input` as a list of items (a string is one user message, none is none), or a
    400 saying what it must be."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if given is None or isinstance(given, list):
        return given or []
    raise invalid_type("input", "a string or an array of input items", given)


def _parsed(
    raw: bytes,
    body: dict[str, Any],
    items: list[Any],
    sent: ItemBytes | None,
    mapped: Mapped | None,
) -> Parsed:
    """The request: `items` its input items, `sent` the client's bytes of each when the body
    was split, `mapped` their canonical messages when the split mapped them."""
    if mapped is None:
        mapped = map_items(items)
    held = next((k for k in HELD_UPSTREAM if body.get(k)), None)
    return Parsed(
        raw=raw,
        body=body,
        model=body["model"],
        messages=mapped.messages,
        items=items,
        spans=mapped.spans,
        stream=optional_bool(body, "stream"),
        max_output=optional_int(body, "max_output_tokens"),
        opaque_reason=held,
        keys=mapped.keys,
        raw_items=sent,
    )


def _check_instructions(body: dict[str, Any]) -> None:
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid_type("instructions", "a string", instructions)


def _is_object(item: Any) -> bool:
    return item.__class__ is dict


def _mapped(split: Split, after: Mapped | None) -> Mapped:
    return map_items(split.items, after)


def _events(data: bytes) -> Iterator[dict[str, Any]]:
    """The JSON events of the complete SSE frames in `data`."""
    for payload in EventStream().feed(data):
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict):
            yield event
