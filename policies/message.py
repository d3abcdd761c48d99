"""Plain OpenAI chat messages: the dict type and read-only views of their parts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Message = dict[str, Any]
"""An OpenAI chat message as the client sent it; unknown fields are kept as they are."""

SYSTEM_ROLES = frozenset({"system", "developer"})

MEDIA_LABELS = {"image_url": "[image]", "input_audio": "[audio]", "file": "[file]"}


def content_text(content: object) -> str:
    """The text of a content value: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    return ""


def tool_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The message's tool calls (an empty list when it has none)."""
    calls = message.get("tool_calls")
    return [call for call in calls if isinstance(call, dict)] if isinstance(calls, list) else []


def call_function(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    return function if isinstance(function, dict) else {}


def call_name(call: Mapping[str, Any]) -> str:
    name = call_function(call).get("name")
    return name if isinstance(name, str) else ""


def call_arguments(call: Mapping[str, Any]) -> str:
    arguments = call_function(call).get("arguments")
    return arguments if isinstance(arguments, str) else ""


def is_error_result(message: Mapping[str, Any]) -> bool:
    """Whether a tool message says its call failed (Anthropic's `is_error: true`): an error
    as a whole, never cut."""
    return message.get("is_error") is True


def visible_text(message: Mapping[str, Any]) -> str:
    """All text the model reads in a message: its content and its tool calls."""
    text = content_text(message.get("content"))
    calls = tool_calls(message)
    if not calls:
        return text
    return "\n".join([text, *(f"{call_name(c)} {call_arguments(c)}" for c in calls)])


def media_as_labels(message: Message) -> Message:
    """The message with its image, audio and file parts replaced by `[image]`-like labels."""
    content = message.get("content")
    if not isinstance(content, list) or not any(_is_media(part) for part in content):
        return message
    parts = [
        {"type": "text", "text": MEDIA_LABELS.get(part["type"], "[media]")}
        if _is_media(part)
        else part
        for part in content
    ]
    return {**message, "content": parts}


def _is_media(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") in MEDIA_LABELS
