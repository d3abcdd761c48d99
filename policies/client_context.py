"""What agent clients send beside the conversation: their own context, re-sent as it changes,
and their own compaction prompts. Recognised by the markers the clients' sources and recorded
traffic document (tests/data/clients/), never by guessing at what text means.

The client's context is not history: a message that is nothing but context stands outside the
chain, as a system message does (never summarised, never trimmed, shown verbatim in every
view), and a copy that a later one supersedes is dropped where a compaction displaced it.

- Codex CLI (openai/codex, `codex-rs/core/src/context/`: its `ContextualUserFragment`s) sends
  user-role text that is context, not the user's words: a text is such a fragment when,
  trimmed, it starts with the fragment's start marker and ends with its end marker (ASCII case
  ignored), as Codex itself tells them apart (`is_contextual_user_fragment`).
  `<environment_context>` (cwd, shell, date, sandbox) is re-sent when it changes and
  `# AGENTS.md instructions for <dir>` ... `</INSTRUCTIONS>` replaces the previous: one kind
  each. Its other tagged blocks (permissions, collaboration mode, skills' list) come as
  developer messages, system messages to the engine already.
- Claude Code sends `<system-reminder>` ... `</system-reminder>` text blocks in user turns.
  Its CLAUDE.md reminder ("Codebase and user instructions are shown below") and its
  attribution reminder (which says it "replaces ... a previous copy of this reminder") are one
  kind each; any other reminder is superseded only by an identical copy.
- Compaction prompts the clients append as the last user message, asking for a summary of
  the whole conversation: Codex's local compaction (`codex-rs/core/templates/compact/
  prompt.md`, "You are performing a CONTEXT CHECKPOINT COMPACTION") and Claude Code's
  ("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools." then its summary instructions,
  a text block after the last tool result). They are not the task: the task is the last user
  message before them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.message import SYSTEM_ROLES, content_text

# (start marker, end marker, kind); kind None: each distinct text is a kind of its own.
FRAGMENTS: tuple[tuple[str, str, str | None], ...] = (
    ("<environment_context>", "</environment_context>", "environment_context"),
    ("# AGENTS.md instructions for ", "</INSTRUCTIONS>", "agents_md"),
    ("<user_instructions>", "</user_instructions>", "agents_md"),  # Codex before AGENTS.md
    ("<skill>", "</skill>", None),
    ("<system-reminder>", "</system-reminder>", None),
)
# Claude Code's reminders that replace their previous copy, by how their first line begins.
REPLACING_REMINDERS = {
    "Codebase and user instructions are shown below": "claude_md",
    "Attribution for git commits": "attribution",
}
REMINDER = "<system-reminder>"
_MARKS = ("<", "#")  # the first characters of the start markers
CONTEXT_FIRST = frozenset("<# \t\r\n")  # and of a text that may begin with one
COMPACTION_PROMPTS = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION",  # Codex
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.",  # Claude Code
)


def fragment_kind(text: str) -> str | None:
    """The kind of client context `text` is, None when it is none."""
    if not text[:32].lstrip().startswith(_MARKS):  # the cheap test: most text is not
        return None
    trimmed = text.strip()
    for start, end, kind in FRAGMENTS:
        if (
            trimmed[: len(start)].lower() != start.lower()
            or trimmed[len(trimmed) - len(end) :].lower() != end.lower()
        ):
            continue
        if kind is not None:
            return kind
        if start == REMINDER:
            first = trimmed[len(REMINDER) :].lstrip().partition("\n")[0]
            for opening, named in REPLACING_REMINDERS.items():
                if first.startswith(opening):
                    return named
        return trimmed
    return None


def context_kinds(message: Mapping[str, Any]) -> frozenset[str] | None:
    """The kinds of client context a user message holds, None unless all of it is context
    (one text that is not, or a part that is not text, makes it conversation)."""
    if message.get("role") != "user":
        return None
    content = message.get("content")
    if isinstance(content, str):
        kind = fragment_kind(content)
        return None if kind is None else frozenset((kind,))
    if not isinstance(content, list) or not content:
        return None
    kinds = set()
    for part in content:
        if not (isinstance(part, dict) and part.get("type") == "text"):
            return None
        text = part.get("text")
        kind = fragment_kind(text) if isinstance(text, str) else None
        if kind is None:
            return None
        kinds.add(kind)
    return frozenset(kinds)


def is_client_context(message: Mapping[str, Any]) -> bool:
    """Whether a message is wholly a client's context."""
    return message.get("role") == "user" and _context(message)


def outside_chain(message: Mapping[str, Any]) -> bool:
    """Whether a message stands outside the chain: a system or developer message, or a
    client's context. Such messages are never compacted and are shown in every view. (The
    cheap tests first: this runs over every message of every request.)"""
    role = message.get("role")
    if role in SYSTEM_ROLES:
        return True
    if role != "user":
        return False
    text = message.get("content")
    # A string that begins with no marker's first character is no context.
    return (text.__class__ is not str or text[:1] in CONTEXT_FIRST) and _context(message)


def outside_positions(messages: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """The messages outside the chain, each index with the number of chain messages before
    it, in order."""
    found = {}
    count = 0
    for index, message in enumerate(messages):
        if outside_chain(message):
            found[index] = count
        else:
            count += 1
    return found


def _context(message: Mapping[str, Any]) -> bool:
    """Whether a user message is all context; the cheap test first (its first text begins
    with a marker's first character)."""
    content = message.get("content")
    text = content[0].get("text") if content.__class__ is list and content else content
    if text.__class__ is not str:
        return False
    first = text[:1]
    if first.isspace():
        first = text.lstrip()[:1]
    return first in _MARKS and context_kinds(message) is not None


def is_compaction_prompt(message: Mapping[str, Any]) -> bool:
    """Whether a user message is a client's own compaction prompt."""
    if message.get("role") != "user":
        return False
    text = content_text(message.get("content")).lstrip()
    return text.startswith(COMPACTION_PROMPTS)


def is_compaction_request(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the conversation ends with a client's compaction prompt: the client is about
    to replace its history with the summary it asks for."""
    last = next((m for m in reversed(messages) if not outside_chain(m)), None)
    return last is not None and is_compaction_prompt(last)


def superseded(
    messages: Sequence[Mapping[str, Any]], outside: Mapping[int, int], until: int
) -> dict[int, int]:
    """The messages outside the chain (`outside`, from `outside_positions`) that a later one
    supersedes, each index with the number of chain messages before it: a client context
    message each of whose kinds a later one holds, and a system message that a later one
    repeats word for word. Only what stands among the first `until` chain messages may
    supersede (what a plan covered when it was made), so that a view keeps its bytes until
    the next compaction."""
    later_kinds: set[str] = set()
    later_systems: set[str] = set()
    found: dict[int, int] = {}
    for index in reversed(outside):
        message, before = messages[index], outside[index]
        if message.get("role") in SYSTEM_ROLES:
            text = _system_text(message)
            if text in later_systems:
                found[index] = before
            elif before <= until:
                later_systems.add(text)
            continue
        kinds = context_kinds(message) or frozenset()
        if kinds <= later_kinds:
            found[index] = before
        elif before <= until:
            later_kinds |= kinds
    return found


def left_out(
    copies: Mapping[int, int], cut: int, edits: Mapping[int, Mapping[str, Any] | None]
) -> list[int]:
    """The superseded `copies` (from `superseded`) that a view with this cut and these edits
    leaves out: those it displaced, in the evicted prefix or right after a chain message it
    dropped. One still in its place stays: the view keeps the client's bytes there."""
    return [
        index
        for index, before in copies.items()
        if (cut > 0 and before <= cut)
        or (before > cut and before - 1 in edits and edits[before - 1] is None)
    ]


def _system_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text")) if isinstance(part, dict) else repr(part) for part in content
        )
    return str(content)
