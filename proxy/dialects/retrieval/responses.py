"""The retrieval tool in the Responses API: a `function` tool, `function_call` items answered
by `function_call_output` items; reasoning items go back with their call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.dialects.retrieval.base import PARAMETERS, Call, ToolCalls, key_of
from proxy.dialects.retrieval.filters import CallFilter, ResponsesFilter
from proxy.dialects.retrieval.streams import ResponsesStream, StreamAnswer, responses_events


class ResponsesCalls(ToolCalls):
    conversation_key = "input"

    def answer_items(self, answer: dict[str, Any]) -> list[Any]:
        return list(_output(answer))

    def item_key(self, item: Any) -> str | None:
        if not isinstance(item, dict):
            return None
        if item.get("type") == "function_call":
            return key_of("", [str(item.get("call_id"))])
        if item.get("type", "message") != "message" or item.get("role") != "assistant":
            return None
        content = item.get("content")
        if isinstance(content, list):
            content = "\n".join(
                str(p.get("text")) for p in content if isinstance(p, dict) and "text" in p
            )
        return key_of(str(content or ""), [])

    def answer_start(self, conversation: list[Any], index: int) -> int:
        while index > 0 and _is_reasoning(conversation[index - 1]):
            index -= 1  # a reasoning item goes with what follows it
        return index

    def hidden_items(self, first: dict[str, Any], last: dict[str, Any]) -> list[Any]:
        if first.get("previous_response_id") is not None:
            return []  # held upstream: nothing to put back
        return super().hidden_items(first, last)

    def tool(self, name: str, description: str) -> dict[str, Any]:
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": PARAMETERS,
            "strict": False,
        }

    def call_filter(self, name: str) -> CallFilter:
        return ResponsesFilter(name)

    def stream(self) -> StreamAnswer:
        return ResponsesStream()

    def events(self, answer: dict[str, Any], with_usage: bool) -> bytes:
        return responses_events(answer)

    def calls(self, answer: dict[str, Any]) -> list[Call]:
        return [
            Call(str(item.get("call_id")), str(item.get("name")), str(item.get("arguments") or ""))
            for item in _output(answer)
            if item.get("type") == "function_call"
        ]

    def continued(
        self, body: dict[str, Any], answer: dict[str, Any], results: Sequence[tuple[Call, str]]
    ) -> dict[str, Any]:
        outputs = [
            {"type": "function_call_output", "call_id": call.id, "output": text}
            for call, text in results
        ]
        if body.get("previous_response_id") is not None and body.get("store") is not False:
            # The conversation is held upstream: the answer is in it already.
            return {**body, "previous_response_id": answer.get("id"), "input": outputs}
        given = body.get("input")
        earlier = (
            [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        )
        stored = body.get("store") is not False
        items = [_sent_back(item, stored) for item in _output(answer)]
        return {**body, "input": [*earlier, *(i for i in items if i is not None), *outputs]}

    def without_calls(self, answer: dict[str, Any], name: str, note: str) -> dict[str, Any]:
        output = [
            item
            for item in _output(answer)
            if not (item.get("type") == "function_call" and item.get("name") == name)
        ]
        if not any(item.get("type") in ("function_call", "message") for item in output):
            text = {"type": "output_text", "text": note, "annotations": []}
            output.append(
                {"type": "message", "role": "assistant", "status": "completed", "content": [text]}
            )
        return {**answer, "output": output}


def _is_reasoning(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "reasoning"


def _output(answer: dict[str, Any]) -> list[dict[str, Any]]:
    output = answer.get("output")
    return [i for i in output if isinstance(i, dict)] if isinstance(output, list) else []


def _sent_back(item: dict[str, Any], stored: bool) -> dict[str, Any] | None:
    """An output item as the next request's input: as it came when the upstream stores
    responses; without its id when it does not (a reasoning item only with its encrypted
    content, which is all the upstream can read back of it)."""
    if stored:
        return item
    if item.get("type") == "reasoning" and not item.get("encrypted_content"):
        return None
    return {k: v for k, v in item.items() if k != "id"}
