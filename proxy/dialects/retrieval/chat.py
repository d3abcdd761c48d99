"""The retrieval tool in chat completions: a `function` tool, `tool_calls`, `tool` messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.message import content_text
from proxy.dialects.retrieval.base import PARAMETERS, Call, ToolCalls, key_of
from proxy.dialects.retrieval.filters import CallFilter, ChatFilter
from proxy.dialects.retrieval.streams import ChatStream, StreamAnswer, chat_events


class ChatCalls(ToolCalls):
    def answer_items(self, answer: dict[str, Any]) -> list[Any]:
        message = _message(answer)
        return [] if message is None else [message]

    def item_key(self, item: Any) -> str | None:
        if not isinstance(item, dict) or item.get("role") != "assistant":
            return None
        calls = item.get("tool_calls") or []
        ids = [str(c.get("id")) for c in calls if isinstance(c, dict)]
        return key_of(content_text(item.get("content")), ids)

    def tool(self, name: str, description: str) -> dict[str, Any]:
        function = {"name": name, "description": description, "parameters": PARAMETERS}
        return {"type": "function", "function": function}

    def call_filter(self, name: str) -> CallFilter:
        return ChatFilter(name)

    def stream(self) -> StreamAnswer:
        return ChatStream()

    def events(self, answer: dict[str, Any], with_usage: bool) -> bytes:
        return chat_events(answer, with_usage)

    def calls(self, answer: dict[str, Any]) -> list[Call]:
        message = _message(answer)
        found = message.get("tool_calls") if message else None
        if not isinstance(found, list):
            return []
        calls = []
        for call in found:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                calls.append(
                    Call(
                        str(call.get("id")),
                        str(function.get("name")),
                        str(function.get("arguments") or ""),
                    )
                )
        return calls

    def continued(
        self, body: dict[str, Any], answer: dict[str, Any], results: Sequence[tuple[Call, str]]
    ) -> dict[str, Any]:
        message = {k: v for k, v in (_message(answer) or {}).items() if v is not None}
        replies = [
            {"role": "tool", "tool_call_id": call.id, "content": text} for call, text in results
        ]
        return {**body, "messages": [*body["messages"], message, *replies]}

    def without_calls(self, answer: dict[str, Any], name: str, note: str) -> dict[str, Any]:
        choice = answer["choices"][0]
        message = dict(choice["message"])
        kept = [
            c
            for c in message.get("tool_calls") or []
            if (c.get("function") or {}).get("name") != name
        ]
        if kept:
            message["tool_calls"] = kept
            return {**answer, "choices": [{**choice, "message": message}, *answer["choices"][1:]]}
        message.pop("tool_calls", None)
        message["content"] = message.get("content") or note
        stopped = {**choice, "message": message, "finish_reason": "stop"}
        return {**answer, "choices": [stopped, *answer["choices"][1:]]}


def _message(answer: dict[str, Any]) -> dict[str, Any] | None:
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None  # n > 1: the proxy answers none of its calls
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None
