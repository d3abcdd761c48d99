"""The retrieval tool in Anthropic Messages: a tool with an `input_schema`, `tool_use` blocks
answered by `tool_result` blocks; thinking blocks go back as they came, and the client's cache
breakpoints stay where they are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from proxy.dialects.retrieval.base import PARAMETERS, Call, ToolCalls, key_of
from proxy.dialects.retrieval.filters import CallFilter, MessagesFilter
from proxy.dialects.retrieval.streams import MessagesStream, StreamAnswer, messages_events


class MessagesCalls(ToolCalls):
    def answer_items(self, answer: dict[str, Any]) -> list[Any]:
        return [{"role": "assistant", "content": _content(answer)}]

    def item_key(self, item: Any) -> str | None:
        if not isinstance(item, dict) or item.get("role") != "assistant":
            return None
        content = item.get("content")
        if isinstance(content, str):
            return key_of(content, [])
        blocks = [b for b in content or [] if isinstance(b, dict)]
        ids = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        text = "\n".join(str(b.get("text")) for b in blocks if b.get("type") == "text")
        return key_of(text, ids)

    def tool(self, name: str, description: str) -> dict[str, Any]:
        return {"name": name, "description": description, "input_schema": PARAMETERS}

    def call_filter(self, name: str) -> CallFilter:
        return MessagesFilter(name)

    def stream(self) -> StreamAnswer:
        return MessagesStream()

    def events(self, answer: dict[str, Any], with_usage: bool) -> bytes:
        return messages_events(answer)

    def calls(self, answer: dict[str, Any]) -> list[Call]:
        return [
            Call(
                str(block.get("id")),
                str(block.get("name")),
                orjson.dumps(block.get("input")).decode(),
            )
            for block in _content(answer)
            if block.get("type") == "tool_use"
        ]

    def continued(
        self, body: dict[str, Any], answer: dict[str, Any], results: Sequence[tuple[Call, str]]
    ) -> dict[str, Any]:
        turn = {"role": "assistant", "content": _content(answer)}
        replies = [
            {"type": "tool_result", "tool_use_id": call.id, "content": text}
            for call, text in results
        ]
        return {**body, "messages": [*body["messages"], turn, {"role": "user", "content": replies}]}

    def without_calls(self, answer: dict[str, Any], name: str, note: str) -> dict[str, Any]:
        content = [
            block
            for block in _content(answer)
            if not (block.get("type") == "tool_use" and block.get("name") == name)
        ]
        if any(block.get("type") == "tool_use" for block in content):
            return {**answer, "content": content}
        if not any(block.get("type") == "text" for block in content):
            content.append({"type": "text", "text": note})
        return {**answer, "content": content, "stop_reason": "end_turn"}


def _content(answer: dict[str, Any]) -> list[dict[str, Any]]:
    content = answer.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
