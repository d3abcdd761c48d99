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
        return litellm.anthropic_messages(**chat_thinking(litellm, arguments))

    def whole(self, answer: Any) -> bytes:
        data = answer if isinstance(answer, dict) else answer.model_dump(exclude_none=True)
        return orjson.dumps({k: v for k, v in data.items() if k != "provider_specific_fields"})

    def encoder(self, stream: Any, arguments: dict[str, Any]) -> EventWriter:
        return EventWriter(_encode, _stream_error)


def chat_thinking(litellm: Any, arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` with thinking `enabled` for OpenAI's provider as adaptive thinking at the
    effort its budget stands for: litellm sends the first to OpenAI's Responses API whatever
    `use_chat_completions_url_for_anthropic_messages` says (a chat-only server answers 404),
    the second as chat completions' `reasoning_effort`."""
    thinking = arguments.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return arguments
    try:
        provider = litellm.get_llm_provider(arguments["model"])[1]
    except Exception:  # litellm's to say, on the call itself
        return arguments
    if provider != "openai":
        return arguments
    efforts = importlib.import_module("litellm.litellm_core_utils.reasoning_effort_utils")
    effort = efforts.reasoning_effort_from_thinking_silently(thinking, drop_params=True)
    given = arguments.get("output_config")
    output = dict(given) if isinstance(given, dict) else {}
    if effort:
        output.setdefault("effort", effort)
    return {**arguments, "thinking": {"type": "adaptive"}, "output_config": output}


def _encode(chunk: Any) -> bytes | None:
    """litellm yields the stream's SSE bytes (passed through, or written by its translation
    from chat completions), or events as mappings."""
    if isinstance(chunk, bytes | bytearray):
        return bytes(chunk)
    if isinstance(chunk, str):
        return chunk.encode()
    event = chunk if isinstance(chunk, dict) else chunk.model_dump(exclude_none=True)
    return sse_event(event)
