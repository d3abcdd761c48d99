"""Streamed answers and the retrieval tool: each API's events read until they show whether the
answer calls the proxy's tool (`StreamAnswer.first_call`), the whole answer rebuilt from them
when it does, and an answer written as the API's events (`events`) for the client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import orjson


class StreamAnswer(ABC):
    """One streamed answer, event by event (each event's data, decoded)."""

    def __init__(self) -> None:
        self.first_call: str | None = None  # the name of the answer's first tool call, once seen

    @abstractmethod
    def feed(self, event: dict[str, Any]) -> None: ...

    @abstractmethod
    def answer(self) -> dict[str, Any]:
        """The answer as the API's non-streamed JSON."""


def sse(data: Any, event: str | None = None) -> bytes:
    head = b"" if event is None else b"event: " + event.encode() + b"\n"
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


class ChatStream(StreamAnswer):
    def __init__(self) -> None:
        super().__init__()
        self.head: dict[str, Any] = {}
        self.message: dict[str, Any] = {"role": "assistant", "content": None}
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: Any = None

    def feed(self, event: dict[str, Any]) -> None:
        self.head = self.head or {k: event.get(k) for k in ("id", "created", "model")}
        if event.get("usage") is not None:
            self.usage = event["usage"]
        for choice in event.get("choices") or []:
            self.finish = choice.get("finish_reason") or self.finish
            delta = choice.get("delta") or {}
            for key, value in delta.items():
                if isinstance(value, str) and key != "role":
                    self.message[key] = (self.message.get(key) or "") + value
            for piece in delta.get("tool_calls") or []:
                call = self.calls.setdefault(
                    piece.get("index", 0),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = piece.get("id") or call["id"]
                function = piece.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
                if self.first_call is None and call["function"]["name"]:
                    self.first_call = call["function"]["name"]

    def answer(self) -> dict[str, Any]:
        message = dict(self.message)
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        choice = {"index": 0, "message": message, "finish_reason": self.finish}
        answer = {**self.head, "object": "chat.completion", "choices": [choice]}
        return answer if self.usage is None else {**answer, "usage": self.usage}


def chat_events(answer: dict[str, Any], with_usage: bool) -> bytes:
    head = {k: answer.get(k) for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    choice = answer["choices"][0]
    message = choice["message"]
    delta = {k: v for k, v in message.items() if k != "tool_calls"}
    calls = message.get("tool_calls") or []
    if calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    out = sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    done = {"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}
    out += sse({**head, "choices": [done]})
    if with_usage and answer.get("usage") is not None:
        out += sse({**head, "choices": [], "usage": answer["usage"]})
    return out + b"data: [DONE]\n\n"


class ResponsesStream(StreamAnswer):
    def __init__(self) -> None:
        super().__init__()
        self.response: dict[str, Any] = {}

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        item = event.get("item") or {}
        if kind == "response.output_item.added" and item.get("type") == "function_call":
            self.first_call = self.first_call or str(item.get("name"))
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self.response = event.get("response") or {}

    def answer(self) -> dict[str, Any]:
        return self.response


def responses_events(answer: dict[str, Any]) -> bytes:
    started = {**answer, "status": "in_progress", "output": []}
    out = sse({"type": "response.created", "sequence_number": 0, "response": started})
    number = 1
    for index, item in enumerate(answer.get("output") or []):
        for kind in ("response.output_item.added", "response.output_item.done"):
            event = {"type": kind, "sequence_number": number, "output_index": index, "item": item}
            out += sse(event)
            number += 1
    completed = {"type": "response.completed", "sequence_number": number, "response": answer}
    return out + sse(completed)


class MessagesStream(StreamAnswer):
    def __init__(self) -> None:
        super().__init__()
        self.message: dict[str, Any] = {}
        self.inputs: dict[int, str] = {}

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = {**event.get("message", {}), "content": []}
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            if block.get("type") == "tool_use":
                self.first_call = self.first_call or str(block.get("name"))
            self.message["content"].append(block)
        elif kind == "content_block_delta":
            self._delta(event.get("index", 0), event.get("delta") or {})
        elif kind == "content_block_stop":
            index = event.get("index", 0)
            if index in self.inputs:
                given = self.inputs.pop(index)
                self.message["content"][index]["input"] = orjson.loads(given) if given else {}
        elif kind == "message_delta":
            self.message.update(event.get("delta") or {})
            usage = {k: v for k, v in (event.get("usage") or {}).items() if v is not None}
            self.message["usage"] = {**self.message.get("usage", {}), **usage}

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self.message["content"][index]
        kind = delta.get("type")
        if kind == "input_json_delta":
            self.inputs[index] = self.inputs.get(index, "") + str(delta.get("partial_json", ""))
        for field in ("text", "thinking"):
            if kind == f"{field}_delta":
                block[field] = block.get(field, "") + str(delta.get(field, ""))
        if kind == "signature_delta":
            block["signature"] = delta.get("signature")

    def answer(self) -> dict[str, Any]:
        return self.message


def messages_events(answer: dict[str, Any]) -> bytes:
    start = {**answer, "content": [], "stop_reason": None, "stop_sequence": None}
    out = sse({"type": "message_start", "message": start}, "message_start")
    for index, block in enumerate(answer.get("content") or []):
        kind = block.get("type")
        opened, deltas = dict(block), []
        if kind == "text":
            opened["text"], deltas = "", [{"type": "text_delta", "text": block["text"]}]
        elif kind == "thinking":
            opened["thinking"], opened["signature"] = "", ""
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}]
            deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
        elif kind == "tool_use":
            opened["input"] = {}
            given = orjson.dumps(block.get("input") or {}).decode()
            deltas = [{"type": "input_json_delta", "partial_json": given}]
        event = {"type": "content_block_start", "index": index, "content_block": opened}
        out += sse(event, "content_block_start")
        for delta in deltas:
            event = {"type": "content_block_delta", "index": index, "delta": delta}
            out += sse(event, "content_block_delta")
        out += sse({"type": "content_block_stop", "index": index}, "content_block_stop")
    stopped = {k: answer.get(k) for k in ("stop_reason", "stop_sequence")}
    delta = {"type": "message_delta", "delta": stopped, "usage": answer.get("usage")}
    out += sse(delta, "message_delta")
    return out + sse({"type": "message_stop"}, "message_stop")
