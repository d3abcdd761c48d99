"""Chat completions through litellm: `litellm.acompletion`, its answer as OpenAI's
`chat.completion`, its stream as `chat.completion.chunk` events ending in one `data: [DONE]`
(the usage chunk only when the client asked for it)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.openai.shared import openai_error_body
from proxy.errors import APIError
from proxy.upstream.litellm_answers import EventWriter, Grammar

_ANSWER_FIELDS = ("id", "object", "created", "model", "system_fingerprint", "choices", "usage")
_EPHEMERAL = {"type": "ephemeral"}


def _stream_error(error: APIError) -> bytes:
    return b"data: " + openai_error_body(error) + b"\n\n"


class ChatRoute:
    """`POST /chat/completions` to `litellm.acompletion`."""

    grammar = Grammar(openai_error_body, b"data: [DONE]\n\n")
    # Chat completions fields litellm translates for the provider; any other gets a 400.
    fields = frozenset(
        {
            "messages",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "functions",
            "function_call",
            "response_format",
            "stream",
            "stream_options",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "n",
            "stop",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "user",
            "reasoning_effort",
            "thinking",
            "modalities",
            "audio",
            "prediction",
            "web_search_options",
        }
    )
    # OpenAI's stored-completion bookkeeping means nothing to other providers.
    ignored = frozenset({"metadata", "store", "service_tier", "prompt_cache_key"})

    def shaped(
        self,
        arguments: dict[str, Any],
        reserved_output: int | None,
        marks: bool,
        headings: tuple[str, ...],
    ) -> dict[str, Any]:
        if not arguments.get("stream"):
            arguments.pop("stream_options", None)
        capped = arguments.get("max_tokens") is not None
        if not capped and arguments.get("max_completion_tokens") is None and reserved_output:
            # litellm would otherwise ask providers that require a cap (Anthropic) for the
            # model's whole max output, which they count against the window.
            arguments["max_tokens"] = reserved_output
        messages = arguments.get("messages")
        if marks and isinstance(messages, list):
            arguments["messages"] = cache_marked(messages, headings)
        return arguments

    def call(self, litellm: Any, arguments: dict[str, Any]) -> Any:
        return litellm.acompletion(**arguments)

    def whole(self, answer: Any) -> bytes:
        """A litellm ModelResponse as OpenAI's `chat.completion` (litellm's extras left out)."""
        data = answer.model_dump(exclude_none=True)
        body = {key: data[key] for key in _ANSWER_FIELDS if key in data}
        for choice in body.get("choices", []):
            message = choice.get("message")
            if isinstance(message, dict):
                message.setdefault("content", None)
        return orjson.dumps(body)

    def encoder(self, stream: Any, arguments: dict[str, Any]) -> EventWriter:
        options = arguments.get("stream_options")
        # The usage chunk only when the client asked for it.
        usage = isinstance(options, dict) and options.get("include_usage") is True

        def encode(chunk: Any) -> bytes | None:
            data = chunk.model_dump(exclude_none=True)
            event = {key: data[key] for key in _ANSWER_FIELDS if key in data}
            event.setdefault("choices", [])
            if not usage:
                event.pop("usage", None)
                if not event["choices"]:
                    return None
            return b"data: " + orjson.dumps(event) + b"\n\n"

        return EventWriter(encode, _stream_error)


def cache_marked(messages: list[Any], headings: tuple[str, ...]) -> list[Any]:
    """`messages` with the stable prefix marked for the provider's prompt cache: the
    compaction header (summary, digest, anchors) and the last message of the turns before the
    current one (the last assistant message), which every later request replays unchanged."""
    marks = {
        i
        for i, m in enumerate(messages)
        if isinstance(m, dict)
        and isinstance(m.get("content"), str)
        and m["content"].startswith(headings)
    }
    marks = set(sorted(marks)[:1])
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], dict) and messages[i].get("role") == "assistant":
            marks.add(i)
            break
    return [{**m, "cache_control": _EPHEMERAL} if i in marks else m for i, m in enumerate(messages)]
