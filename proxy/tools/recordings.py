"""Recorded conversations, read back as the requests a client sent, for an offline replay.

A JSONL file holds one record a line, of either kind:

- a conversation: `{"messages": [...], "id": ...}`, the whole history with the assistant's
  answers. A client sends the history up to each assistant message, one request each.
- a request body: `{"model": ..., "messages": [...], ...}`, as a client sent it. Bodies are
  grouped into sessions as the proxy groups them: `metadata.session_id`, else an id derived
  from the first user message.

A record with a `model` is a request body; any other is a conversation.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from policies import Message, is_system
from proxy.errors import ProxyError


class RecordingError(ProxyError):
    """A recorded file that cannot be read or replayed."""


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One request a client sent: its body, and its session's name when the recording gives
    one (a conversation's id or line); None: named as the proxy names it."""

    body: dict[str, Any]
    session: str | None


@dataclasses.dataclass(frozen=True)
class _Line:
    where: str  # FILE:LINE, for errors
    record: dict[str, Any]


def client_requests(messages: Sequence[Message]) -> Iterator[list[Message]]:
    """What a client sends of a conversation: the history up to each assistant message."""
    for i, message in enumerate(messages):
        if message.get("role") == "assistant" and i:
            yield list(messages[:i])


def joined(conversations: Sequence[Sequence[Message]], size: int) -> list[list[Message]]:
    """Conversations joined `size` at a time into long sessions, as one client talking on:
    each session keeps the system messages of its first conversation only."""
    sessions = []
    for start in range(0, len(conversations), size):
        first, *rest = conversations[start : start + size]
        sessions.append([*first, *(m for c in rest for m in c if not is_system(m))])
    return sessions


def read_requests(paths: Sequence[str], *, model: str | None, join: int = 1) -> list[Recorded]:
    """The requests recorded in `paths` (`-` is standard input): request bodies in their
    order, then the requests of each conversation, `join` conversations making one session.
    `model` replaces every request's model; conversations, which name none, need it."""
    requests: list[Recorded] = []
    conversations: list[tuple[str, list[Message]]] = []
    for line in _lines(paths):
        messages = line.record.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise RecordingError(f"{line.where}: 'messages' must be a list of objects")
        if "model" in line.record:
            body = line.record if model is None else {**line.record, "model": model}
            requests.append(Recorded(body, None))
        else:
            label = line.record.get("id")
            conversations.append((line.where if label is None else str(label), messages))
    if conversations and model is None:
        raise RecordingError("conversations name no model: give one with --model")
    for start in range(0, len(conversations), join):
        group = conversations[start : start + join]
        label = group[0][0] if len(group) == 1 else f"{group[0][0]}+{len(group) - 1}"
        (session,) = joined([messages for _, messages in group], len(group))
        requests += (
            Recorded({"model": model, "messages": history}, label)
            for history in client_requests(session)
        )
    return requests


def _lines(paths: Iterable[str]) -> Iterator[_Line]:
    for path in paths:
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RecordingError(f"{path}: cannot read: {exc}") from None
        for number, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise RecordingError(f"{where}: not JSON ({exc})") from None
            if not isinstance(record, dict):
                raise RecordingError(f"{where}: expected a JSON object")
            yield _Line(where, record)
