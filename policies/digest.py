"""The mechanical digest: what a summary keeps, extracted by rules, when no LLM summary is made.

It is rolling like a summary: a previous digest is parsed back and extended, a previous LLM
summary is kept (shortened) under "Earlier summary". When the items do not fit in the cap,
the newest are kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from policies.counting import Counter
from policies.message import Message, call_arguments, call_name, content_text, tool_calls
from policies.summary import Summary

REQUESTS, DECISIONS, TOOLS, ERRORS, OPEN = (
    "User requests",
    "Decisions",
    "Tool calls",
    "Errors",
    "Open items",
)
SECTIONS = (REQUESTS, DECISIONS, TOOLS, ERRORS, OPEN)
EARLIER = "Earlier summary"
ITEM_TOKENS = 60  # one item is a line; long requests keep their beginning
VALUE_CHARS = 40
MAX_MISSES = 16  # items in a row that did not fit, after which the older ones are not tried

DECISION = re.compile(
    r"\b(i will|i'll|we will|we'll|let's|decided|going to|has been|have been|confirmed|"
    r"i have (?:updated|booked|cancelled|changed|created|fixed|added|removed|made))\b",
    re.IGNORECASE,
)
ERROR = re.compile(
    r"\b(error|exception|traceback|failed|failure|not found|invalid|denied|unable|cannot)\b",
    re.IGNORECASE,
)
OPEN_ITEM = re.compile(
    r"\b(todo|next step|remaining|pending|still need|follow[- ]up|not yet)\b", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def digest(
    previous: Summary | None, evicted: Sequence[Message], *, max_tokens: int, counter: Counter
) -> str:
    """A structured digest of `previous` and `evicted` in about `max_tokens` tokens."""
    earlier = ""
    items: list[tuple[str, str | dict[str, Any]]] = []
    if previous is not None and previous.kind == "digest":
        earlier, items = _parse(previous.text)
    elif previous is not None:
        earlier = previous.text
    items += _extract(evicted)
    return _layout(earlier, items, max_tokens, counter)


def _extract(evicted: Sequence[Message]) -> list[tuple[str, str | dict[str, Any]]]:
    """(section, text or tool call) items, oldest first; lines are made only for kept ones."""
    items: list[tuple[str, str | dict[str, Any]]] = []
    names: dict[object, str] = {}
    question = ""
    for message in evicted:
        role, text = message.get("role"), content_text(message.get("content"))
        if role == "user" and text.strip():
            items.append((REQUESTS, text))
        if role in ("user", "assistant") and (DECISION.search(text) or OPEN_ITEM.search(text)):
            for sentence in _SENTENCE_END.split(text):
                if role == "assistant" and DECISION.search(sentence):
                    items.append((DECISIONS, sentence))
                if OPEN_ITEM.search(sentence):
                    items.append((OPEN, sentence))
        if role == "assistant":
            last = text.rstrip().rsplit("\n", 1)[-1]
            question = last if last.endswith("?") else ""
            for call in tool_calls(message):
                names[call.get("id")] = call_name(call)
                items.append((TOOLS, call))
        if role == "tool" and (error := ERROR.search(text)):
            start, end = text.rfind("\n", 0, error.start()) + 1, text.find("\n", error.end())
            name = names.get(message.get("tool_call_id")) or message.get("name") or "tool"
            items.append((ERRORS, f"{name}: {text[start : end if end >= 0 else len(text)]}"))
    if question:
        items.append((OPEN, f"asked: {question}"))
    return items


def _call_line(call: dict[str, Any]) -> str:
    """`name(key=value, ...)` with the arguments' scalar values, shortened."""
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
    text = " ".join(text.split())
    head = counter.head(text, ITEM_TOKENS)
    return head if head == text else head.rstrip() + "…"


def _parse(text: str) -> tuple[str, list[tuple[str, str | dict[str, Any]]]]:
    """The earlier summary and the items of a digest made by this module."""
    headings = {f"{name}:": name for name in (*SECTIONS, EARLIER)}
    section, earlier = "", []
    items: list[tuple[str, str | dict[str, Any]]] = []
    for line in text.splitlines():
        if line in headings:
            section = headings[line]
        elif section == EARLIER:
            earlier.append(line)
        elif section and line.startswith("- "):
            items.append((section, line[2:]))
    return "\n".join(earlier), items


def _layout(
    earlier: str, items: list[tuple[str, str | dict[str, Any]]], max_tokens: int, counter: Counter
) -> str:
    """The earlier summary (a third of the budget at most) and the newest items that fit."""
    budget = max_tokens
    if earlier:
        earlier = counter.head(earlier, max(0, budget // 3 - counter.text(EARLIER) - 2))
    if earlier:
        budget -= counter.text(earlier) + counter.text(EARLIER) + 2
    chosen: dict[tuple[str, str], int] = {}
    opened: set[str] = set()
    misses = 0
    for order in reversed(range(len(items))):
        if misses > MAX_MISSES:  # the budget is as good as spent: stop making lines
            break
        section, payload = items[order]
        line = _short(payload if isinstance(payload, str) else _call_line(payload), counter)
        cost = counter.text(line) + 2 + (0 if section in opened else counter.text(section) + 2)
        if (section, line) in chosen or cost > budget:
            misses += 1
            continue
        chosen[(section, line)] = order
        opened.add(section)
        budget -= cost
        misses = 0
    blocks = [f"{EARLIER}:\n{earlier}"] if earlier else []
    for name in SECTIONS:
        lines = sorted((order, line) for (kind, line), order in chosen.items() if kind == name)
        if lines:
            blocks.append(f"{name}:\n" + "\n".join(f"- {line}" for _, line in lines))
    return "\n".join(blocks)
