"""A streamed answer whose first call is a client's goes on to the client as it came, but for
a later call of the proxy's tool in it: that call's events are taken out, and the items after
it renumbered, so that the client never receives a call it does not know. Every other event
goes on as its own bytes."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

import orjson

_EVENT_END = re.compile(rb"\r?\n\r?\n")
_DATA = re.compile(rb"^data:[ ]?(.*)$", re.MULTILINE)


class CallFilter(ABC):
    """One API's events, with the calls of tool `name` taken out."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ours: list[int] = []  # the indexes of the proxy's calls, in the answer's numbering

    @abstractmethod
    def event(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """The event as the client gets it (None: taken out); `data` itself when unchanged."""

    def numbered(self, data: dict[str, Any], field: str, started: Any) -> dict[str, Any] | None:
        """An event of the item numbered `data[field]` (`started`: the item it opens, if any):
        taken out when the item is a call of the proxy's tool, else renumbered."""
        index = data[field]
        if isinstance(started, dict) and started.get("name") == self.name:
            self.ours.append(index)
        if index in self.ours:
            return None
        shifted = self.shifted(index)
        return data if shifted == index else {**data, field: shifted}

    def shifted(self, index: int) -> int:
        """An index after the proxy's calls taken out before it."""
        return index - sum(1 for ours in self.ours if ours < index)

    async def filtered(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The stream's bytes with the proxy's calls taken out (each event whole)."""
        rest = b""
        async for chunk in chunks:
            text = rest + chunk
            *complete, rest = _EVENT_END.split(text)
            ends = _EVENT_END.findall(text)
            out = b"".join(self._event(raw, end) for raw, end in zip(complete, ends, strict=True))
            if out:
                yield out
        if rest:
            yield rest

    def _event(self, raw: bytes, end: bytes) -> bytes:
        found = _DATA.search(raw)
        if found is None:
            return raw + end
        try:
            data = orjson.loads(found[1])
        except orjson.JSONDecodeError:
            return raw + end
        if not isinstance(data, dict):
            return raw + end
        kept = self.event(data)
        if kept is None:
            return b""
        if kept is data:
            return raw + end
        return raw[: found.start(1)] + orjson.dumps(kept) + raw[found.end(1) :] + end


class ChatFilter(CallFilter):
    def event(self, data: dict[str, Any]) -> dict[str, Any] | None:
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return data
        delta = choices[0].get("delta") or {}
        pieces = delta.get("tool_calls")
        if not isinstance(pieces, list):
            return data
        kept = []
        for piece in pieces:
            index = piece.get("index", 0)
            if (piece.get("function") or {}).get("name") == self.name:
                self.ours.append(index)
            if index not in self.ours:
                kept.append({**piece, "index": self.shifted(index)})
        if kept == pieces:
            return data
        if not kept and set(delta) <= {"tool_calls"} and not choices[0].get("finish_reason"):
            return None
        fields = {k: v for k, v in delta.items() if k != "tool_calls"}
        if kept:
            fields["tool_calls"] = kept
        return {**data, "choices": [{**choices[0], "delta": fields}, *choices[1:]]}


class MessagesFilter(CallFilter):
    def event(self, data: dict[str, Any]) -> dict[str, Any] | None:
        if "index" not in data:
            return data
        started = data.get("content_block") if data.get("type") == "content_block_start" else None
        return self.numbered(data, "index", started)


class ResponsesFilter(CallFilter):
    def event(self, data: dict[str, Any]) -> dict[str, Any] | None:
        if isinstance(data.get("output_index"), int):
            added = data.get("type") == "response.output_item.added"
            return self.numbered(data, "output_index", data.get("item") if added else None)
        response = data.get("response")
        if not self.ours or not isinstance(response, dict):
            return data
        output = [
            i
            for i in response.get("output") or []
            if not (i.get("type") == "function_call" and i.get("name") == self.name)
        ]
        return {**data, "response": {**response, "output": output}}
