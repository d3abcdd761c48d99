"""Chat completions (`POST /v1/chat/completions`): the engine's own canonical form.

Each message is one native item, so a view maps back one to one; only the fields compaction
reads are checked (everything else is the upstream's to judge, in its own words). The native
items are the client's bytes of each message (`raw_items`): a message sent before is looked up
by them, not parsed and checked again, and goes upstream as them when the view leaves it alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from policies import Message
from proxy.dialects.base import Parsed, Usage
from proxy.dialects.capabilities import OutputLimits, OutputOverflow
from proxy.dialects.item_bytes import ItemBytes
from proxy.dialects.json_checks import (
    BadField,
    all_typed_objects,
    check_string,
    error_field,
    invalid_type,
    load_object,
    optional_bool,
    optional_int,
)
from proxy.dialects.openai.shared import (
    REASONING_HEADROOM_TOKENS,
    OpenAIDialect,
    is_reasoning_model,
    with_output_limit,
)
from proxy.dialects.raw_items import SPLIT_FROM, KnownItems
from proxy.errors import InvalidRequest, SummaryFailed
from proxy.models.tokens import TokenCounter

# OpenAI's words: "This model's maximum context length is W tokens. However, you requested T
# tokens (M in the messages, [F in the functions,] C in the completion). ..."
_REQUESTED = re.compile(r"maximum context length is (\d+) tokens\. However, you requested (\d+) ")
_COMPLETION = re.compile(r"\((?:[^)]*, )?(\d+) in the completion\)")


class Chat(OpenAIDialect, OutputLimits):
    name = "chat"
    path = "/v1/chat/completions"
    upstream_path = "/chat/completions"
    conversation_param = "messages"
    usage_fields = ("prompt_tokens", "prompt_tokens_details")

    def __init__(self, *, split_from: int = SPLIT_FROM) -> None:
        self.known = KnownItems(_accepts, min_bytes=split_from)

    def parse(self, raw: bytes) -> Parsed:
        split = self.known.split(raw, "messages")
        if split is not None:
            return _parsed(raw, split.body, split.raw, split.keys)
        return self.parse_whole(raw)

    def parse_whole(self, raw: bytes) -> Parsed:
        """The request read whole, every message parsed and checked: the path of a body the
        split does not read, which says what is wrong with it."""
        body = load_object(raw)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise InvalidRequest("'messages' must be a list of message objects", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise InvalidRequest(
                    f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]"
                )
            try:
                _check_message(message)
            except BadField as bad:
                # The location is only spelled out when something is wrong.
                raise invalid_type(f"messages[{i}]{bad.path}", bad.expected, bad.value) from None
        return _parsed(raw, body, None, None)

    def session_hint(self, headers: Mapping[str, str], parsed: Parsed) -> str | None:
        metadata = parsed.body.get("metadata")
        value = metadata.get("session_id") if isinstance(metadata, dict) else None
        return value if isinstance(value, str) and value else None

    def fixed_tokens(self, parsed: Parsed, counter: TokenCounter) -> int:
        return counter.fixed(parsed.body)

    def summary_items(self, header: Message) -> list[Any]:
        return [header]

    def edited_items(self, items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
        return [edited]

    def wants_usage(self, parsed: Parsed) -> bool:
        if not parsed.stream:
            return True
        options = parsed.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def stream_usage(self, tail: bytes) -> Usage | None:
        for line in reversed(tail.split(b"\n")):
            if line.startswith(b"data:") and b'"usage"' in line:
                try:
                    event = orjson.loads(line[5:].strip())
                except orjson.JSONDecodeError:
                    continue
                usage = self.usage_of(event.get("usage") if isinstance(event, dict) else None)
                if usage is not None:
                    return usage
        return None

    def output_overflow(self, payload: bytes) -> OutputOverflow | None:
        message = error_field(payload, "message") or ""
        requested, completion = _REQUESTED.search(message), _COMPLETION.search(message)
        if requested is None or completion is None:
            return None
        window, total = map(int, requested.groups())
        output = int(completion.group(1))
        return OutputOverflow(total - output, output, window)

    def with_max_output(self, body: bytes, max_output: int) -> bytes | None:
        return with_output_limit(body, ("max_completion_tokens", "max_tokens"), max_output, 1)

    def summary_body(
        self, model: str, system: str, prompt: str, max_tokens: int, temperature: float
    ) -> bytes:
        body: dict[str, Any] = {
            "model": model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": prompt},
            ],
        }
        if is_reasoning_model(model):
            # Reasoning models reject temperature, and spend output tokens on reasoning first.
            body["max_completion_tokens"] = max_tokens + REASONING_HEADROOM_TOKENS
            body["reasoning_effort"] = "low"
        else:
            body["temperature"] = temperature
            body["max_tokens"] = max_tokens
        return orjson.dumps(body)

    def summary_text(self, payload: bytes) -> str:
        choice = orjson.loads(payload)["choices"][0]
        if choice.get("finish_reason") == "length":
            raise SummaryFailed("overlong")
        content = choice["message"].get("content")
        return content if isinstance(content, str) else ""


def _parsed(
    raw: bytes, body: dict[str, Any], sent: ItemBytes | None, keys: list[int] | None
) -> Parsed:
    """The request, its messages (`body["messages"]`) checked; `sent` the client's bytes of
    each, when the body was split, and `keys` their hashes."""
    max_tokens = optional_int(body, "max_tokens")
    max_output = optional_int(body, "max_completion_tokens")
    if max_output is None:
        max_output = max_tokens
    return Parsed(
        raw=raw,
        body=body,
        model=body["model"],
        messages=body["messages"],
        items=body["messages"],
        spans=None,
        stream=optional_bool(body, "stream"),
        max_output=max_output,
        keys=keys,
        raw_items=sent,
    )


def _accepts(message: Any) -> bool:
    """Whether the parse's checks pass a message."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return False
    try:
        _check_message(message)
    except BadField:
        return False
    return True


def _check_message(message: dict[str, Any]) -> None:
    """The fields compaction reads have the types OpenAI requires of them.

    OpenAI refuses these requests too; checking here keeps a malformed message that would
    need compacting from reaching the compaction layers, which assume OpenAI's shapes.
    """
    content = message.get("content")
    if not (content is None or isinstance(content, str) or all_typed_objects(content)):
        raise BadField(".content", "a string or an array of typed objects", content)
    for name in ("tool_call_id", "name"):
        check_string(message.get(name), f".{name}")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise BadField(".tool_calls", "an array of objects", calls)
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            raise BadField(f".tool_calls[{j}]", "an object", call)
        check_string(call.get("id"), f".tool_calls[{j}].id")
        function = call.get("function")
        if function is None:
            continue
        if not isinstance(function, dict):
            raise BadField(f".tool_calls[{j}].function", "an object", function)
        for name in ("name", "arguments"):
            check_string(function.get(name), f".tool_calls[{j}].function.{name}")
