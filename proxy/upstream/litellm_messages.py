"""Anthropic Messages through litellm: `litellm.anthropic_messages`, which passes the request
to providers that speak Messages (Anthropic, Bedrock, Vertex AI) and translates it to chat
completions for the others; its answer as Anthropic's `message`, its stream as Anthropic's
events (`message_start` ... `message_stop`), errors in Anthropic's shape.

A prompt over the window comes back as Anthropic words it ("prompt is too long: ..."), so that
the request path sees an overflow and retries compacted harder, as for an upstream of kind
anthropic.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import orjson

from proxy.dialects.anthropic.messages import OVERFLOW, anthropic_error_body
from proxy.errors import APIError, ContextLengthExceeded
from proxy.upstream.litellm_answers import EventWriter, Grammar


def _error_body(error: APIError) -> bytes:
    if isinstance(error, ContextLengthExceeded) and not error.message.startswith(OVERFLOW):
        error = ContextLengthExceeded(f"{OVERFLOW[0]}: {error.message}")
    return anthropic_error_body(error)


def _stream_error(error: APIError) -> bytes:
    return b"event: error\ndata: " + _error_body(error) + b"\n\n"


def sse_event(event: dict[str, Any]) -> bytes:
    """One event of a stream whose events are named by their `type` (Messages, Responses)."""
    return (
        b"event: " + str(event.get("type")).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
    )


class MessagesRoute:
    """`POST /messages` to `litellm.anthropic_messages`."""

    grammar = Grammar(_error_body)
    # The fields of a Messages request litellm passes on or translates; any other gets a 400.
    fields = frozenset(
        {
            *("messages", "system", "max_tokens", "tools", "tool_choice", "stream"),
            *("temperature", "top_p", "top_k", "stop_sequences", "thinking", "output_config"),
        }
    )
    # Accepted and not passed on: Claude Code's `metadata` (its session), and its beta
    # `context_management` edits, which the proxy's own compaction stands for.
    ignored = frozenset({"metadata", "context_management", "service_tier", "speed"})

    def shaped(
        self,
        arguments: dict[str, Any],
        reserved_output: int | None,
        marks: bool,
        headings: tuple[str, ...],
    ) -> dict[str, Any]:
        # The API requires max_tokens; a body without one is sent with the output reserved.
        if arguments.get("max_tokens") is None:
            arguments["max_tokens"] = reserved_output or 4096
        # Cache breakpoints are the client's, or the policy's (`cache_breakpoints`), in the
        # request as the dialect rendered it: litellm passes them on.
        return arguments

    def call(self, litellm: Any, arguments: dict[str, Any]) -> Any:
        provider = _provider(litellm, arguments["model"])
        if provider == "openai":
            arguments = chat_thinking(arguments)
        if arguments.get("stream") and _passes_through(litellm, arguments["model"], provider):
            # litellm's pass-through stream needs its proxy's extra (fastapi): the answer is
            # asked for whole and sent as the API's events.
            return _streamed(litellm.anthropic_messages(**{**arguments, "stream": False}))
        return litellm.anthropic_messages(**arguments)

    def whole(self, answer: Any) -> bytes:
        data = answer if isinstance(answer, dict) else answer.model_dump(exclude_none=True)
        return orjson.dumps({k: v for k, v in data.items() if k != "provider_specific_fields"})

    def encoder(self, stream: Any, arguments: dict[str, Any]) -> EventWriter:
        return EventWriter(_encode, _stream_error)


def chat_thinking(arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` for OpenAI's provider with thinking `enabled` as adaptive thinking at the
    effort its budget stands for: litellm sends the first to OpenAI's Responses API whatever
    `use_chat_completions_url_for_anthropic_messages` says (a chat-only server answers 404),
    the second as chat completions' `reasoning_effort`."""
    thinking = arguments.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return arguments
    efforts = importlib.import_module("litellm.litellm_core_utils.reasoning_effort_utils")
    effort = efforts.reasoning_effort_from_thinking_silently(thinking, drop_params=True)
    given = arguments.get("output_config")
    output = dict(given) if isinstance(given, dict) else {}
    if effort:
        output.setdefault("effort", effort)
    return {**arguments, "thinking": {"type": "adaptive"}, "output_config": output}


def _provider(litellm: Any, model: str) -> str | None:
    try:
        return str(litellm.get_llm_provider(model)[1])
    except Exception:  # litellm's to say, on the call itself
        return None


def _passes_through(litellm: Any, model: str, provider: str | None) -> bool:
    """Whether litellm sends Messages for `model` to the provider as they are (Anthropic,
    Bedrock's and Vertex AI's Claude) rather than translated to chat completions."""
    if provider is None:
        return False
    utils = importlib.import_module("litellm.utils")
    name = model.split("/", 1)[-1]
    found = utils.ProviderConfigManager.get_provider_anthropic_messages_config(
        model=name, provider=litellm.LlmProviders(provider)
    )
    return found is not None


async def _streamed(pending: Awaitable[Any]) -> AsyncIterator[dict[str, Any]]:
    """The events of the message `pending` answers with."""
    message = await pending
    return message_events(message if isinstance(message, dict) else message.model_dump())


async def message_events(message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """A whole Messages answer as the events the API streams it in."""
    usage = message.get("usage") or {}
    opening: dict[str, Any] = {"content": [], "stop_reason": None, "stop_sequence": None}
    yield {"type": "message_start", "message": {**message, **opening}}
    for index, block in enumerate(message.get("content") or []):
        start, deltas = _block_events(block)
        yield {"type": "content_block_start", "index": index, "content_block": start}
        for delta in deltas:
            yield {"type": "content_block_delta", "index": index, "delta": delta}
        yield {"type": "content_block_stop", "index": index}
    ending = {k: message.get(k) for k in ("stop_reason", "stop_sequence")}
    yield {"type": "message_delta", "delta": ending, "usage": usage}
    yield {"type": "message_stop"}


def _block_events(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A content block as its opening and its deltas."""
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
    if kind == "tool_use":
        given = orjson.dumps(block.get("input") or {}).decode()
        deltas = [{"type": "input_json_delta", "partial_json": given}]
        return {**block, "input": {}}, deltas
    if kind == "thinking":
        deltas = [
            {"type": "thinking_delta", "thinking": block.get("thinking", "")},
            {"type": "signature_delta", "signature": block.get("signature", "")},
        ]
        return {"type": "thinking", "thinking": "", "signature": ""}, deltas
    return block, []  # redacted thinking, server tools' blocks: whole at their start


def _encode(chunk: Any) -> bytes | None:
    """litellm yields the stream's SSE bytes (passed through, or written by its translation
    from chat completions), or events as mappings."""
    if isinstance(chunk, bytes | bytearray):
        return bytes(chunk)
    if isinstance(chunk, str):
        return chunk.encode()
    event = chunk if isinstance(chunk, dict) else chunk.model_dump(mode="json", exclude_none=True)
    return sse_event(event)
