"""What every wire format does with the retrieval tool (`ToolCalls`), and what they share."""

from __future__ import annotations

import dataclasses
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.dialects.retrieval.filters import CallFilter
from proxy.dialects.retrieval.streams import StreamAnswer
from proxy.errors import InvalidRequest

# The tool's arguments, the same in every API.
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "handle": {"type": "string", "description": "the handle=... of the output's marker"},
        "start_line": {"type": "integer", "description": "first line to read (from 1)"},
        "end_line": {"type": "integer", "description": "last line to read"},
    },
    "required": ["handle"],
}


@dataclasses.dataclass(frozen=True)
class Call:
    """One tool call of an answer: its id, the tool's name, its arguments as JSON text."""

    id: str
    name: str
    arguments: str


class ToolCalls(ABC):
    """One API's side of the retrieval tool. Answers and bodies are its JSON, decoded."""

    tools_key: str = "tools"
    conversation_key: str = "messages"

    @abstractmethod
    def answer_items(self, answer: dict[str, Any]) -> list[Any]:
        """The answer as the conversation items a client sends back with its next request."""

    @abstractmethod
    def item_key(self, item: Any) -> str | None:
        """What tells an answer's item in a later request: its first call's id, else a hash
        of its text (None: not an item of an answer)."""

    def answer_key(self, answer: dict[str, Any]) -> str | None:
        """The key of the answer's first item that has one."""
        return next(filter(None, map(self.item_key, self.answer_items(answer))), None)

    def hidden_items(self, first: dict[str, Any], last: dict[str, Any]) -> list[Any]:
        """The items the hidden rounds added: those of `last` (the last continued request)
        after `first`'s (the request as forwarded)."""
        given = first.get(self.conversation_key)
        return list(
            last[self.conversation_key][1 if isinstance(given, str) else len(given or []) :]
        )

    def restored(
        self, body: dict[str, Any], found: Sequence[tuple[int, list[Any]]]
    ) -> dict[str, Any]:
        """The body with each hidden round put back before the answer it led to (at its item's
        index), unless it is there already."""
        conversation = list(body[self.conversation_key])
        for index, items in sorted(found, key=lambda pair: pair[0], reverse=True):
            at = self.answer_start(conversation, index)
            if conversation[max(0, at - len(items)) : at] != items:
                conversation[at:at] = items
        return {**body, self.conversation_key: conversation}

    def answer_start(self, conversation: list[Any], index: int) -> int:
        """Where the answer whose keyed item is at `index` begins."""
        return index

    @abstractmethod
    def tool(self, name: str, description: str) -> dict[str, Any]:
        """The tool's definition as the API declares a function."""

    @staticmethod
    def tool_names(tools: Sequence[Any]) -> set[str]:
        """The names of the client's own tools (those the proxy's must not clash with)."""
        return {
            str(t.get("name") or (t.get("function") or {}).get("name"))
            for t in tools
            if isinstance(t, dict)
        }

    def with_tool(self, body: bytes, tool: dict[str, Any]) -> bytes:
        """The body with the tool after the client's own, when it has none of that name.
        Always the same bytes for the same body: prompt caches see one tool list."""
        data = orjson.loads(body)
        tools = data.get(self.tools_key)
        tools = tools if isinstance(tools, list) else []
        if tool_name(tool) in self.tool_names(tools):
            raise InvalidRequest(
                f"a tool is named {tool_name(tool)!r}, the proxy's retrieval tool: rename it, "
                "or set the policy's retrieval.tool_name",
                param=self.tools_key,
            )
        return orjson.dumps({**data, self.tools_key: [*tools, tool]})

    @abstractmethod
    def call_filter(self, name: str) -> CallFilter:
        """What takes the calls of tool `name` out of a stream relayed as it comes."""

    @abstractmethod
    def stream(self) -> StreamAnswer:
        """A streamed answer's reader."""

    @abstractmethod
    def events(self, answer: dict[str, Any], with_usage: bool) -> bytes:
        """The answer as the API streams one (its usage only `with_usage` where optional)."""

    @abstractmethod
    def calls(self, answer: dict[str, Any]) -> list[Call]:
        """The answer's tool calls, in order."""

    @abstractmethod
    def continued(
        self, body: dict[str, Any], answer: dict[str, Any], results: Sequence[tuple[Call, str]]
    ) -> dict[str, Any]:
        """The request again, its conversation followed by the answer and the proxy's results."""

    @abstractmethod
    def without_calls(self, answer: dict[str, Any], name: str, note: str) -> dict[str, Any]:
        """The answer without its calls of tool `name`; `note` as its text when nothing is left."""

    def with_usage(self, answer: dict[str, Any], usages: Sequence[Any]) -> dict[str, Any]:
        """The answer with the usage of every upstream call made for it added up."""
        if not isinstance(answer.get("usage"), dict):
            return answer
        return {**answer, "usage": summed_usage(usages)}


def key_of(text: str, ids: Sequence[str]) -> str | None:
    """An answer item's key: its first call's id, else its text, hashed; None for neither."""
    if ids:
        said = "call:" + ids[0]
    elif text:
        said = "text:" + text
    else:
        return None
    return hashlib.sha256(said.encode()).hexdigest()[:32]


def tool_name(tool: dict[str, Any]) -> str:
    function = tool.get("function")
    return str(function["name"] if isinstance(function, dict) else tool.get("name"))


def summed_usage(usages: Sequence[Any]) -> Any:
    """Usage objects added up: every integer summed (nested ones too), other values the last's."""
    dicts = [u for u in usages if isinstance(u, dict)]
    if not dicts:
        return usages[-1] if usages else None
    total: dict[str, Any] = {}
    for usage in dicts:
        for key, value in usage.items():
            old = total.get(key)
            if value is None and old is not None:
                continue
            if isinstance(value, int) and not isinstance(value, bool) and isinstance(old, int):
                total[key] = old + value
            elif isinstance(value, dict) and isinstance(old, dict):
                total[key] = summed_usage([old, value])
            else:
                total[key] = value
    return total
