"""The structure of a conversation: rounds, tool blocks, the current turn, tool pairing.

Every function takes a message list and answers with indices into it; system and developer
messages, and the clients' own context (`policies.client_context`), may stand anywhere and
belong to no round or block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.client_context import is_compaction_prompt, outside_chain
from policies.message import SYSTEM_ROLES, tool_calls


def is_system(message: Mapping[str, Any]) -> bool:
    """System and developer messages: they always come from the request, never compacted."""
    return message.get("role") in SYSTEM_ROLES


def rounds(messages: Sequence[Mapping[str, Any]]) -> list[range]:
    """One range per user message: from it up to the next user message."""
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return [range(s, e) for s, e in zip(starts, [*starts[1:], len(messages)], strict=True)]


def tool_blocks(messages: Sequence[Mapping[str, Any]]) -> list[range]:
    """Assistant messages with tool calls, each with the tool messages that answer it."""
    blocks = []
    i = 0
    while i < len(messages):
        calls = tool_calls(messages[i]) if messages[i].get("role") == "assistant" else []
        end = i + 1
        if calls:
            ids = {call.get("id") for call in calls}
            while (
                end < len(messages)
                and messages[end].get("role") == "tool"
                and messages[end].get("tool_call_id") in ids
            ):
                end += 1
            blocks.append(range(i, end))
        i = end
    return blocks


def current_turn_start(messages: Sequence[Mapping[str, Any]]) -> int:
    """Where the current turn's tail starts.

    The tail is the newest tool block when the conversation ends with tool results (an agent
    loop), else the last user message, and in both cases everything after it. With no user
    message at all the whole conversation is the current turn. A client's own compaction
    prompt at the end is not the turn: the turn is the one it asks to summarise, with it.
    """
    last = _last_in_chain(messages, len(messages))
    if last is not None and is_compaction_prompt(messages[last]):
        earlier = _last_in_chain(messages, last)
        last = last if earlier is None else earlier
    if last is None:
        return len(messages)
    if messages[last].get("role") == "tool":
        start = last
        while start > 0 and messages[start - 1].get("role") == "tool":
            start -= 1
        calling = start > 0 and messages[start - 1].get("role") == "assistant"
        return start - 1 if calling and tool_calls(messages[start - 1]) else start
    return _last_user(messages, last + 1) or 0


def current_turn(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The non-system messages the model must answer now; they are never changed.

    The tail from `current_turn_start`, and, in an agent loop, the last user message (the
    task) before it; the loop's older tool blocks are not part of the turn.
    """
    start = current_turn_start(messages)
    tail = [i for i in range(start, len(messages)) if not outside_chain(messages[i])]
    if not tail or _is_task(messages[start]):
        return tail
    task = _last_user(messages, start)
    return tail if task is None else [task, *tail]


def tool_pair_problems(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why OpenAI would reject the tool pairing of these messages (no text, only ids)."""
    problems = []
    open_at, unanswered = -1, set[str]()
    in_group = False
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if not in_group:
                problems.append(f"message {i}: tool message without a preceding tool call")
            elif call_id not in unanswered:
                problems.append(f"message {i}: tool message answers no open call ({call_id!r})")
            else:
                unanswered.discard(call_id)
            continue
        if unanswered:
            problems.append(f"message {open_at}: tool calls without answers {sorted(unanswered)}")
        calls = tool_calls(message) if message.get("role") == "assistant" else []
        in_group = bool(calls)
        open_at, unanswered = i, {str(call.get("id")) for call in calls}
    if unanswered:
        problems.append(f"message {open_at}: tool calls without answers {sorted(unanswered)}")
    return problems


def _last_user(messages: Sequence[Mapping[str, Any]], before: int) -> int | None:
    """The last user message before `before` that says what to do: not a client's context
    nor its compaction prompt."""
    return next((i for i in reversed(range(before)) if _is_task(messages[i])), None)


def _is_task(message: Mapping[str, Any]) -> bool:
    return (
        message.get("role") == "user"
        and not outside_chain(message)
        and not is_compaction_prompt(message)
    )


def _last_in_chain(messages: Sequence[Mapping[str, Any]], before: int) -> int | None:
    return next((i for i in reversed(range(before)) if not outside_chain(messages[i])), None)
