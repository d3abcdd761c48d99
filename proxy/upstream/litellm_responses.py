"""The Responses API through litellm: `litellm.aresponses`, which calls OpenAI's Responses API
and reaches the other providers through its translation to chat completions; its answer as
OpenAI's `response`, its stream as the API's events (`response.created` ...
`response.completed`), errors in OpenAI's shape.

What litellm's translation writes is made what the API's clients parse: a reasoning item
carries its text as `summary` (litellm writes it as an assistant message's `content` in the
final response), and carries the provider's signed thinking in `encrypted_content` in
`response.output_item.done` too (litellm only puts it in `response.completed`, which Codex
does not read items from). Sent back, `encrypted_content` is how litellm restores Anthropic's
thinking blocks with their signatures, which Anthropic requires in a tool loop with thinking.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.openai.shared import openai_error_body
from proxy.errors import APIError
from proxy.upstream.litellm_answers import Grammar
from proxy.upstream.litellm_messages import sse_event

# litellm's own additions to the API's objects.
_EXTRAS = ("provider_specific_fields", "hidden_params", "_hidden_params")
_EPHEMERAL = {"type": "ephemeral"}


class ResponsesRoute:
    """`POST /responses` to `litellm.aresponses`."""

    grammar = Grammar(openai_error_body)
    # The fields of a Responses request litellm passes on or translates; any other gets a 400
    # (`previous_response_id` too: a provider behind the translation keeps no responses).
    fields = frozenset(
        {
            *("input", "instructions", "tools", "tool_choice", "parallel_tool_calls"),
            *("reasoning", "include", "max_output_tokens", "temperature", "top_p", "text"),
            *("stream", "truncation", "user"),
        }
    )
    # Accepted and not passed on: OpenAI's storage and routing bookkeeping, Codex's metadata.
    # Nothing is stored: the client sends its whole input each time.
    ignored = frozenset(
        {"store", "metadata", "prompt_cache_key", "service_tier", "client_metadata"}
        | {"safety_identifier", "stream_options"}
    )

    def shaped(
        self,
        arguments: dict[str, Any],
        reserved_output: int | None,
        marks: bool,
        headings: tuple[str, ...],
    ) -> dict[str, Any]:
        arguments["store"] = False
        if arguments.get("max_output_tokens") is None and reserved_output:
            # As for chat completions: providers that require a cap count it in the window.
            arguments["max_output_tokens"] = reserved_output
        given = arguments.get("input")
        if marks and isinstance(given, list):
            # litellm carries an item's `cache_control` to the provider's block.
            arguments["input"] = cache_marked_input(given, headings)
            arguments["cache_control_injection_points"] = [
                {"location": "message", "role": "system"}
            ]
        return arguments

    def call(self, litellm: Any, arguments: dict[str, Any]) -> Any:
        return litellm.aresponses(**arguments)

    def whole(self, answer: Any) -> bytes:
        return orjson.dumps(_response(answer.model_dump(mode="json", exclude_none=True)))

    def encoder(self, stream: Any, arguments: dict[str, Any]) -> ResponsesEvents:
        return ResponsesEvents(stream)


class ResponsesEvents:
    """The events of one of litellm's Responses streams, as the API writes them."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._response: dict[str, Any] = {}  # as response.created gave it
        self._sequence = -1

    def encode(self, chunk: Any) -> bytes | None:
        event = (
            chunk if isinstance(chunk, dict) else chunk.model_dump(mode="json", exclude_none=True)
        )
        sequence = event.get("sequence_number")
        self._sequence = sequence if isinstance(sequence, int) else self._sequence + 1
        item = event.get("item")
        if isinstance(item, dict):
            item = event["item"] = _item(item)
            if (
                event.get("type") == "response.output_item.done"
                and item.get("type") == "reasoning"
                and not item.get("encrypted_content")
            ):
                signed = signed_thinking(
                    getattr(self._stream, "collected_chat_completion_chunks", ())
                )
                if signed:
                    item["encrypted_content"] = signed
        response = event.get("response")
        if isinstance(response, dict):
            response = event["response"] = _response(response)
            if not self._response:
                self._response = response
        return sse_event(event)

    def failed(self, error: APIError) -> bytes:
        """`response.failed`, as the API ends a stream it could not finish: the response the
        stream began, with the error's code (the request path reads an overflow by it)."""
        failed = {"message": error.message, "code": error.code or error.error_type}
        kept = ("id", "object", "created_at", "model")
        response = {k: self._response[k] for k in kept if k in self._response}
        response |= {"status": "failed", "error": failed, "output": []}
        self._sequence += 1
        event = {"type": "response.failed", "response": response}
        return sse_event(event | {"sequence_number": self._sequence})


def signed_thinking(chunks: Any) -> str | None:
    """The thinking blocks of the chat completion chunks streamed so far, each whole with its
    signature, as litellm writes them in a reasoning item's `encrypted_content` (and reads them
    back from it); None when no block is signed."""
    blocks: dict[int, dict[str, Any]] = {}
    for chunk in chunks or ():
        data = chunk if isinstance(chunk, dict) else chunk.model_dump()
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            for part in delta.get("thinking_blocks") or ():
                index = part.get("index", len(blocks))
                block = blocks.setdefault(index, {"type": part.get("type")})
                if part.get("thinking"):
                    block["thinking"] = block.get("thinking", "") + part["thinking"]
                for key in ("signature", "data"):
                    if part.get(key):
                        block[key] = part[key]
    signed = [
        {"type": "thinking", "thinking": b.get("thinking", ""), "signature": b["signature"]}
        if b["type"] == "thinking"
        else {"type": "redacted_thinking", "data": b["data"]}
        for _, b in sorted(blocks.items())
        if b.get("signature") or b.get("data")
    ]
    return orjson.dumps(signed).decode() if signed else None


def cache_marked_input(items: list[Any], headings: tuple[str, ...]) -> list[Any]:
    """`items` marked for the provider's prompt cache (the instructions are marked apart): the
    compaction header (summary, digest, anchors), which stays as later turns come; the item
    before the model's last output, whose prefix the next request replays even where the
    provider leaves out earlier thinking (Anthropic keeps only the last turn's); and the last
    item, whose prompt the next request finds in the cache (the provider looks back from its
    breakpoint), as Claude Code marks its requests."""
    headers = [i for i, item in enumerate(items) if _text(item).startswith(headings)]
    outputs = [i for i, item in enumerate(items) if _is_output(item)]
    start = outputs[-1] if outputs else 0
    while start > 0 and _is_output(items[start - 1]):
        start -= 1
    marks = {*headers[:1], len(items) - 1, *([start - 1] if start > 0 else [])}
    return [_marked(item) if i in marks else item for i, item in enumerate(items)]


def _is_output(item: Any) -> bool:
    """An item the model wrote: a message of its own, its reasoning, a call."""
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    calls = isinstance(kind, str) and kind.endswith("_call")
    return item.get("role") == "assistant" or kind == "reasoning" or calls


def _text(item: Any) -> str:
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(content, list) and content and isinstance(content[0], dict):
        content = content[0].get("text")
    return content if isinstance(content, str) else ""


def _marked(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    content = item.get("content")
    if "role" not in item or not content:  # a call, its output...: marked whole
        return {**item, "cache_control": _EPHEMERAL}
    if isinstance(content, str):
        kind = "output_text" if item["role"] == "assistant" else "input_text"
        content = [{"type": kind, "text": content}]
    if not isinstance(content, list) or not isinstance(content[-1], dict):
        return item
    return {**item, "content": [*content[:-1], {**content[-1], "cache_control": _EPHEMERAL}]}


def _response(response: dict[str, Any]) -> dict[str, Any]:
    """A `response` object without litellm's additions, its output items as the API's."""
    response = {k: v for k, v in response.items() if k not in _EXTRAS}
    usage = response.get("usage")
    if isinstance(usage, dict):
        response["usage"] = {k: v for k, v in usage.items() if k != "cost"}
    output = response.get("output")
    if isinstance(output, list):
        response["output"] = [_item(i) if isinstance(i, dict) else i for i in output]
    return response


def _item(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as the API writes it: a reasoning item's text as its `summary`."""
    item = {k: v for k, v in item.items() if k not in _EXTRAS}
    if item.get("type") != "reasoning":
        return item
    item.pop("role", None)
    content = item.get("content") or []
    written = [p for p in content if isinstance(p, dict) and p.get("type") == "output_text"]
    if written:  # litellm's, not the API's reasoning_text parts
        del item["content"]
    if not item.get("summary"):
        texts = [p["text"] for p in written if p.get("text")]
        item["summary"] = [{"type": "summary_text", "text": t} for t in texts]
    return item
