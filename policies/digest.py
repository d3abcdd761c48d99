"""The mechanical digest: what a summary keeps, extracted by rules, when no LLM summary is made.

What the user said comes first: every requirement and every fact-like part of the evicted
user messages (numbers, ids, names, dates, quoted text, addresses), each cut down to the
clauses that carry it; then what the tools found (the lines that stand out of a templated
output, see `policies.compress.findings`) and the errors they reported (their salient lines,
as compression keeps them); then what the user said otherwise, the assistant's decisions and
open items, and the tool calls with their arguments (the files and commands). Each part is
kept newest first while the cap lasts, and what the view still shows verbatim is left out.

It is rolling like a summary: a previous digest is parsed back and extended (an LLM summary
is never rewritten into it: the digest follows it, see `Summary.tail`). Messages are read
newest first and only until the cap is spent, so a long evicted part costs no more than a
short one.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from policies.compress import finding_lines, salient_lines
from policies.compress.salience import is_salient_text
from policies.counting import Counter
from policies.message import (
    Message,
    call_arguments,
    call_name,
    content_text,
    is_error_result,
    tool_calls,
)

REQUESTS, FINDINGS, DECISIONS, TOOLS, ERRORS, OPEN = (
    "User requests",
    "Findings",
    "Decisions",
    "Tool calls",
    "Errors",
    "Open items",
)
SECTIONS = (REQUESTS, FINDINGS, DECISIONS, TOOLS, ERRORS, OPEN)
TOOL_KNOWLEDGE = (FINDINGS, ERRORS)
TOOL_LINES = 3  # of each kind, an output's first: more of one output crowds the others out
MAX_TOKENS = 2048
ITEM_TOKENS = 60  # one item is a line; a long one keeps its beginning
GIST_TOKENS = 20  # what is kept of a user message that tells nothing in particular
CLAUSE_CHARS = 120  # a longer sentence keeps only its telling clauses
VALUE_CHARS = 40
MAX_MISSES = 16  # items in a row that did not fit, after which older ones are not tried

# Matched against lowercased text: a case-sensitive pattern is twice as fast.
DECISION = re.compile(
    r"\b(i will|i'll|we will|we'll|let's|decided|going to|has been|have been|confirmed|"
    r"i have (?:updated|booked|cancelled|changed|created|fixed|added|removed|made))\b"
)
OPEN_ITEM = re.compile(r"\b(todo|next step|remaining|pending|still need|follow[- ]up|not yet)\b")
REQUIREMENT = re.compile(
    r"\b(must|should|please|don't|do not|never|always|make sure|require[sd]?|prefer|"
    r"remember|avoid|instead|can you|could you|(?:i|we)(?: really| still| also)? "
    r"(?:need|want|would like|'d like))\b"
)
# Numbers, dates, ids, amounts; e-mail and web addresses; quoted text.
FACT = re.compile(
    r"\d|@|://|[\"\u201c\u2018][^\"\u201c\u201d\u2018\u2019]{2,}[\"\u201d\u2019]"
    r"|(?<!\w)'[^']{2,}'(?!\w)"
)
CAPITALISED = re.compile(r"\s([A-Z][\w'-]*)")  # a word inside a sentence: a name, a place
NOT_NAMES = frozenset({"I", "I'm", "I'll", "I've", "I'd", "OK"})
# A sentence ends before a capital (or a quote, a bracket): "no. 4" and "e.g. this" go on.
_SENTENCES = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"\u201c\u2018'(\[])|\n+")
_CLAUSES = re.compile(
    r"[,;]?\s+(?:and|but|so|because|which|while)\s+|[,;:]\s+|\s+[-\u2013\u2014]\s+"
)

Item = tuple[str, str | dict[str, Any]]  # a section and its text, or a tool call to describe


def digest(
    previous: str | None,
    evicted: Sequence[Message],
    *,
    max_tokens: int,
    counter: Counter,
    shown: str = "",
) -> str:
    """A structured digest of `evicted` rolled into `previous` (an earlier digest's text) in
    about `max_tokens` tokens (at most MAX_TOKENS: more rule-picked lines are mostly noise,
    and cost time to pick). Items that `shown` (the text the view still shows, whitespace
    normalised) holds verbatim are left out."""
    # Newest first, each with its age: what the user said that tells, then the rest.
    items = list(enumerate(itertools.chain(_newest_first(evicted), reversed(_parse(previous)))))
    first = [(age, item) for age, item in items if _tells(item)]
    found = [(age, item) for age, item in items if item[0] in TOOL_KNOWLEDGE]
    rest = [
        (age, item) for age, item in items if not _tells(item) and item[0] not in TOOL_KNOWLEDGE
    ]
    return _layout((first, found, rest), min(max_tokens, MAX_TOKENS), counter, shown)


def telling(text: str) -> bool:
    """Whether a user's sentence states a requirement or a fact (see FACT)."""
    if REQUIREMENT.search(text.lower()) or FACT.search(text):
        return True
    return any(word not in NOT_NAMES for word in CAPITALISED.findall(text))


def _tells(item: Item) -> bool:
    section, payload = item
    return section == REQUESTS and isinstance(payload, str) and telling(payload)


def _newest_first(evicted: Sequence[Message]) -> Iterator[Item]:
    """The items of `evicted`, newest first."""
    names = {call.get("id"): call_name(call) for m in evicted for call in tool_calls(m)}
    asked = next((m for m in reversed(evicted) if m.get("role") == "assistant"), None)
    if asked is not None:
        last = _SENTENCES.split(content_text(asked.get("content")).rstrip())[-1]
        if last.endswith("?"):
            yield OPEN, f"asked: {last}"
    for message in reversed(evicted):
        yield from reversed(_items(message, names))


def _items(message: Message, names: dict[object, str]) -> list[Item]:
    role, text = message.get("role"), content_text(message.get("content"))
    low = text.lower()
    items: list[Item] = []
    if role == "user" and text.strip():
        items += ((REQUESTS, said) for said in _said(text))
    if role in ("user", "assistant") and (DECISION.search(low) or OPEN_ITEM.search(low)):
        for sentence in _SENTENCES.split(text):
            if role == "assistant" and DECISION.search(sentence.lower()):
                items.append((DECISIONS, sentence))
            if OPEN_ITEM.search(sentence.lower()):
                items.append((OPEN, sentence))
    if role == "assistant":
        items += ((TOOLS, call) for call in tool_calls(message))
    if role == "tool":
        name = names.get(message.get("tool_call_id")) or message.get("name") or "tool"
        found = finding_lines(text)
        salient = salient_lines(text, is_error=is_error_result(message))
        errors = [line for line in salient if line not in found or is_salient_text(line)]
        items += ((ERRORS, f"{name}: {line}") for line in errors[:TOOL_LINES])
        findings = [line for line in found if line not in errors]
        items += ((FINDINGS, line) for line in findings[:TOOL_LINES])
    return items


def _said(text: str) -> list[str]:
    """What to keep of a user message: its telling sentences, a long one cut down to its
    telling clauses; else its gist (the beginning)."""
    sentences = [" ".join(s.split()) for s in _SENTENCES.split(text)]
    kept = [_clauses(s) for s in sentences if s and telling(s)]
    if kept:
        return kept
    gist = " ".join(text[: GIST_TOKENS * 16].split())
    return [gist if len(gist) <= GIST_TOKENS * 4 else gist[: GIST_TOKENS * 4].rstrip() + "…"]


def _clauses(sentence: str) -> str:
    """A long sentence's telling clauses (the whole sentence when it is short, or when no
    single clause tells), "…" where others were left out."""
    if len(sentence) <= CLAUSE_CHARS:
        return sentence
    clauses = _CLAUSES.split(sentence)
    telling_clauses = [c for c in clauses if telling(c)]
    if not telling_clauses:
        return sentence
    shortened = " … ".join(telling_clauses)
    return shortened if clauses[0] in telling_clauses[:1] else f"… {shortened}"


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


def _parse(text: str | None) -> list[Item]:
    """The items (oldest first) of a digest made by this module."""
    # Lines before the first section heading are not items (digests stored by earlier
    # versions may open with an "Earlier summary:" block).
    headings = {f"{name}:": name for name in SECTIONS}
    section = ""
    items: list[Item] = []
    for line in (text or "").splitlines():
        if line in headings:
            section = headings[line]
        elif section and line.startswith("- "):
            items.append((section, line[2:]))
    return items


def _layout(
    streams: Iterable[Iterable[tuple[int, Item]]], max_tokens: int, counter: Counter, shown: str
) -> str:
    """The items that fit, taken stream by stream (each newest first), laid out by section,
    oldest first."""
    budget = max_tokens
    chosen: dict[tuple[str, str], int] = {}
    opened: set[str] = set()
    for stream in streams:
        misses = 0
        for age, (section, payload) in stream:
            if misses > MAX_MISSES:
                break
            line = _short(payload if isinstance(payload, str) else _call_line(payload), counter)
            if (section, line) in chosen or (shown and line in shown):
                continue
            cost = counter.text(line) + 2 + (0 if section in opened else counter.text(section) + 2)
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
