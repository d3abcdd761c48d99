"""Handles of elided tool outputs: which outputs of a view a layer cut, the handle each is kept
under, the marker that names it, and what reading one returns.

A handle is derived from the original output alone (its content's hash), so the same output has
the same handle on every turn and every replica, and a view replays byte for byte. Outputs the
retrieval tool itself returned are never elided (`is_retrieval_result`) and so never kept.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from policies.compress.marker import Marker
from policies.message import MEDIA_LABELS, Message, call_name, tool_calls

HANDLE_PREFIX = "o"
HANDLE_HEX = 16  # 64 bits: no collision among one session's outputs


@dataclass(frozen=True)
class Elided:
    """An output a view shows cut: where it stands in the view, its handle, its text."""

    entry: int  # its position among the view's entries
    handle: str
    text: str


def handle_of(original: Message) -> str:
    """The handle of a tool output: a hash of its content, the same wherever it is computed."""
    content = json.dumps(original.get("content"), sort_keys=True, ensure_ascii=False)
    return HANDLE_PREFIX + hashlib.sha256(content.encode()).hexdigest()[:HANDLE_HEX]


def original_text(message: Message) -> str:
    """What reading a kept output returns: its text, a media part as a label."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict):
            texts.append(MEDIA_LABELS.get(str(part.get("type")), "[media]"))
    return "\n".join(texts)


def elided(
    messages: Sequence[Message],
    entries: Sequence[tuple[int | None, Message]],
    tool_name: str,
) -> list[Elided]:
    """The tool outputs a view shows changed from the client's (cleared, truncated or
    compressed), each with its handle; never an output of the retrieval tool."""
    calls = _retrieval_calls(messages, tool_name)
    found = []
    for position, (index, shown) in enumerate(entries):
        if index is None or shown.get("role") != "tool":
            continue
        original = messages[index]
        if shown is original or shown.get("content") == original.get("content"):
            continue
        if original.get("tool_call_id") in calls:
            continue
        found.append(Elided(position, handle_of(original), original_text(original)))
    return found


def is_retrieval_result(message: Message, messages: Sequence[Message], tool_name: str) -> bool:
    """Whether a tool message answers a call of the retrieval tool."""
    return message.get("tool_call_id") in _retrieval_calls(messages, tool_name)


def marked(shown: Message, handle: str, *, kept: bool, tool_name: str) -> Message:
    """The elided output as the view shows it, with where its original can be read: a
    compression marker's `handle=` field, else a line after the placeholder. An original no
    longer kept is said to be gone, so that the model does not ask for it."""
    content = shown.get("content")
    text = content if isinstance(content, str) else None
    if text is None and isinstance(content, list) and content:
        first = content[0]
        text = first.get("text") if isinstance(first, dict) else None
    if not isinstance(text, str):
        return shown
    marker = Marker.parse(text)
    if marker is not None and kept:
        old = marker.render()
        new = Marker(marker.kind, marker.chars, marker.elided, handle).render()
        text = text.replace(old, new, 1) if old in text else f"{text}\n{_line(handle, tool_name)}"
    else:
        text = f"{text}\n{_line(handle, tool_name) if kept else GONE_LINE}"
    if not isinstance(content, list):
        return {**shown, "content": text}
    return {**shown, "content": [{**content[0], "text": text}, *content[1:]]}


GONE_LINE = "[original output no longer kept]"


def _line(handle: str, tool_name: str) -> str:
    return f"[original output kept: handle={handle}; {tool_name} reads it]"


def excerpt(text: str, start_line: int | None, end_line: int | None, max_chars: int) -> str:
    """The lines `start_line`..`end_line` of an original (1-based, inclusive; the whole when
    neither is given), cut at `max_chars` with a line that says where to go on."""
    lines = text.split("\n")
    first = max(1, start_line or 1)
    last = min(len(lines), end_line or len(lines))
    if first > last:
        return f"[no such lines: the original has {len(lines)} lines]"
    part = "\n".join(lines[first - 1 : last])
    if len(part) <= max_chars:
        return part
    cut = part[:max_chars]
    if "\n" not in cut:  # one line longer than the budget: its start
        return f"{cut}\n[line {first} cut at {max_chars} characters]"
    cut = cut[: cut.rindex("\n")]
    shown = first + cut.count("\n")
    return (
        f"{cut}\n[cut after line {shown} of {len(lines)}: ask for start_line {shown + 1} to go on]"
    )


def _retrieval_calls(messages: Sequence[Message], tool_name: str) -> frozenset[str]:
    return frozenset(
        str(call.get("id"))
        for message in messages
        if message.get("role") == "assistant"
        for call in tool_calls(message)
        if call_name(call) == tool_name
    )
