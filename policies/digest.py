"""The mechanical digest: what a summary keeps, extracted by rules, when no LLM summary is made.

It is rolling like a summary: a previous digest is parsed back and extended (an LLM summary
is never rewritten into it: the digest follows it, see `Summary.tail`). When the items do
not fit in the cap, the newest are kept; messages are read newest first and only until the
cap is spent, so a long evicted part costs no more than a short one.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from policies.counting import Counter
from policies.message import Message, call_arguments, call_name, content_text, tool_calls

REQUESTS, DECISIONS, TOOLS, ERRORS, OPEN = (
    "User requests",
    "Decisions",
    "Tool calls",
    "Errors",
    "Open items",
)
SECTIONS = (REQUESTS, DECISIONS, TOOLS, ERRORS, OPEN)
MAX_TOKENS = 2048
ITEM_TOKENS = 60  # one item is a line; a long request keeps its beginning
VALUE_CHARS = 40
MAX_MISSES = 16  # items in a row that did not fit, after which older ones are not tried

# Matched against lowercased text: a case-sensitive pattern is twice as fast.
DECISION = re.compile(
    r"\b(i will|i'll|we will|we'll|let's|decided|going to|has been|have been|confirmed|"
    r"i have (?:updated|booked|cancelled|changed|created|fixed|added|removed|made))\b"
)
ERROR = re.compile(
    r"\b(error|exception|traceback|failed|failure|not found|invalid|denied|unable|cannot)\b"
)
OPEN_ITEM = re.compile(r"\b(todo|next step|remaining|pending|still need|follow[- ]up|not yet)\b")
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")

Item = tuple[str, str | dict[str, Any]]  # a section and its text, or a tool call to describe


def digest(
    previous: str | None, evicted: Sequence[Message], *, max_tokens: int, counter: Counter
) -> str:
    """A structured digest of `evicted` rolled into `previous` (an earlier digest's text) in
    about `max_tokens` tokens (at most MAX_TOKENS: more rule-picked lines are mostly noise,
    and cost time to pick)."""
    older = _parse(previous) if previous else []
    items = itertools.chain(_newest_first(evicted), reversed(older))
    return _layout(items, min(max_tokens, MAX_TOKENS), counter)


def _newest_first(evicted: Sequence[Message]) -> Iterator[Item]:
    """The items of `evicted`, newest first."""
    names = {call.get("id"): call_name(call) for m in evicted for call in tool_calls(m)}
    asked = next((m for m in reversed(evicted) if m.get("role") == "assistant"), None)
    if asked is not None:
        last = content_text(asked.get("content")).rstrip().rsplit("\n", 1)[-1]
        if last.endswith("?"):
            yield OPEN, f"asked: {last}"
    for message in reversed(evicted):
        yield from reversed(_items(message, names))


def _items(message: Message, names: dict[object, str]) -> list[Item]:
    role, text = message.get("role"), content_text(message.get("content"))
    low = text.lower()
    items: list[Item] = []
    if role == "user" and text.strip():
        items.append((REQUESTS, text))
    if role in ("user", "assistant") and (DECISION.search(low) or OPEN_ITEM.search(low)):
        for sentence in _SENTENCES.split(text):
            if role == "assistant" and DECISION.search(sentence.lower()):
                items.append((DECISIONS, sentence))
            if OPEN_ITEM.search(sentence.lower()):
                items.append((OPEN, sentence))
    if role == "assistant":
        items += ((TOOLS, call) for call in tool_calls(message))
    if role == "tool" and (error := ERROR.search(low)):
        start, end = text.rfind("\n", 0, error.start()) + 1, text.find("\n", error.end())
        name = names.get(message.get("tool_call_id")) or message.get("name") or "tool"
        items.append((ERRORS, f"{name}: {text[start : end if end >= 0 else len(text)]}"))
    return items


def _call_line(call: dict[str, Any]) -> str:
    """`name(key=value, ...)` with the arguments' values, shortened."""
    raw = call_arguments(call)
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        return f"{call_name(call)}({raw[:VALUE_CHARS]})"
    values = ", ".join(f"{key}={_value(value)}" for key, value in arguments.items())
    return f"{call_name(call)}({values})"


def _value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS] + "…"


def _short(text: str, counter: Counter) -> str:
    # From a generous prefix: tokenizing a whole long message to keep 60 tokens is slow.
    text = " ".join(text[: ITEM_TOKENS * 64].split())
    head = counter.head(text, ITEM_TOKENS)
    return head if head == text else head.rstrip() + "…"


def _parse(text: str) -> list[Item]:
    """The items (oldest first) of a digest made by this module."""
    # Lines before the first section heading are not items (digests stored by earlier
    # versions may open with an "Earlier summary:" block).
    headings = {f"{name}:": name for name in SECTIONS}
    section = ""
    items: list[Item] = []
    for line in text.splitlines():
        if line in headings:
            section = headings[line]
        elif section and line.startswith("- "):
            items.append((section, line[2:]))
    return items


def _layout(items: Iterable[Item], max_tokens: int, counter: Counter) -> str:
    """The newest items that fit, by section, oldest first."""
    budget = max_tokens
    chosen: dict[tuple[str, str], int] = {}
    opened: set[str] = set()
    misses = 0
    for age, (section, payload) in enumerate(items):
        if misses > MAX_MISSES:
            break
        line = _short(payload if isinstance(payload, str) else _call_line(payload), counter)
        cost = counter.text(line) + 2 + (0 if section in opened else counter.text(section) + 2)
        if (section, line) in chosen:
            continue
        if cost > budget:
            misses += 1
            continue
        chosen[(section, line)] = age
        opened.add(section)
        budget -= cost
        misses = 0
    blocks = []
    for name in SECTIONS:
        lines = sorted((-age, line) for (kind, line), age in chosen.items() if kind == name)
        if lines:
            blocks.append(f"{name}:\n" + "\n".join(f"- {line}" for _, line in lines))
    return "\n".join(blocks)
