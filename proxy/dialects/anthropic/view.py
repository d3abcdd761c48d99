"""A view of a Messages conversation (`policies.render_entries`) as the request's messages: one
native message for the canonical messages that share it, rebuilt by `blocks` only when one of
them was edited (`groups`), the system messages of an evicted part after the header, the
proxy's own prompt-cache breakpoints (`breakpoints`) where its next request reads them back,
and each run of unchanged messages written as the client's bytes of it.

The view is made as segments (`segments`): runs of native messages as received, and the
messages made for it; a step per gap and edit of the view, not per message, but for system
messages, which are moved message by message.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterator, Sequence
from typing import Any, cast

from policies.plan import View
from proxy.dialects.anthropic import segments as seg
from proxy.dialects.anthropic.blocks import thinking_turn
from proxy.dialects.anthropic.breakpoints import BREAKPOINT, with_breakpoints
from proxy.dialects.anthropic.groups import groups, segments_of
from proxy.dialects.anthropic.segments import Made, Segment
from proxy.dialects.base import Entries, Parsed

MARK_LOOKBACK = 8  # messages before a breakpoint's place where one with blocks takes it


def view_items(parsed: Parsed, entries: Entries, breakpoints: bool) -> list[Any] | None:
    """The messages of the view `entries`, with the proxy's prompt-cache breakpoints when
    `breakpoints`, as `Dialect.body_with` takes them; None when they are the request's own,
    unchanged (its body goes as the client sent it)."""
    natives = parsed.items
    last_edit = -1  # the native message of the view's last edited message
    whole = _whole(parsed.messages, entries)
    segments: list[Segment]
    if whole:
        segments = [range(len(natives))] if natives else []
    else:
        found = segments_of(parsed, entries)
        segments, last_edit = _moved(parsed, entries) if found is None else found
    if breakpoints and any(m.get("role") == "assistant" for m in natives):
        # Only a conversation being continued is worth a cache write: its next request
        # reads it back.
        rewritten = not whole and (
            last_edit >= 0 or any(not isinstance(s, range) and s[1] is None for s in segments)
        )
        segments = _marked(parsed, segments, last_edit if rewritten else None)
    if segments == ([range(len(natives))] if natives else []):
        return None  # nothing changed, nothing added
    return _as_sent(parsed, segments)


def _whole(messages: Sequence[Any], entries: Entries) -> bool:
    """Whether the view shows every message as it is, in order."""
    if isinstance(entries, View):
        return entries.shows_all()
    return len(entries) == len(messages) and all(
        map(operator.is_, map(operator.itemgetter(1), entries), messages)
    )


def _moved(parsed: Parsed, entries: Entries) -> tuple[list[Segment], int]:
    """The view message by message, its system messages moved where the API takes them, and
    the native message of its last edited message (-1: none)."""
    spans = cast(Sequence[slice], parsed.spans)
    pairs = [
        (item, None if index is None else spans[index].start)
        for index, group in groups(parsed, entries)
        for item in group
    ]
    pairs = _systems_after_users(_systems_after_header(pairs))
    edited = [i for i, m in entries if i is not None and m is not parsed.messages[i]]
    return seg.of_pairs(parsed.items, pairs), spans[edited[-1]].start if edited else -1


def _marked(parsed: Parsed, segments: list[Segment], last_edit: int | None) -> list[Segment]:
    """`segments` with the proxy's breakpoints, in order of priority:

    1. the end of what the session's plan rewrote (`last_edit`, the native message of its
       last edited message, else the summary; None: it rewrote nothing): the next
       compaction only changes what comes after it, so the prefix up to it is read from
       the cache again when the next compaction forwards a new view;
    2. the last message the next request repeats byte for byte: everything but the
       current tool loop's assistant turn, whose thinking the next request no longer
       carries (the client's own breakpoint on the last message misses because of it).

    Both are found from the end: they are near it.
    """
    natives = parsed.items
    repeated = thinking_turn(natives)[0]
    count = seg.length(segments)
    rewritten = stable = None
    if last_edit is not None:
        rewritten = _markable(
            (p, item)
            for p, item, at in seg.backwards(natives, segments, count)
            if at is None or at <= last_edit
        )
    stable = _markable(
        (p, item)
        for p, item, at in seg.backwards(natives, segments, count)
        if at is not None and at < repeated
    )
    marks = [position for position in (rewritten, stable) if position is not None]
    if not marks:
        return segments
    # Counted by the split of the body, which counts only what a known body's turn adds.
    taken = parsed.raw.count(BREAKPOINT) if parsed.marks is None else parsed.marks
    # Marked on the messages from the first place on: all that a breakpoint's TTL depends on.
    first = min(marks)
    after = seg.tail(natives, segments, count, first)
    out = with_breakpoints(parsed.body, taken, after, [m - first for m in marks])
    changed = {m: out[m - first] for m in marks if out[m - first] is not after[m - first]}
    return seg.replaced(segments, count, changed)


def _markable(found: Iterator[tuple[int, Any]]) -> int | None:
    """The place of the first of the messages `found` (each with its place) that has blocks,
    among the next few (a cache entry is found that far back), else of the first: a
    breakpoint makes a message's string content a text block, which it would stop being the
    turn after, when the breakpoint has moved on (the bytes of a replayed prefix would change,
    as Claude Code's string system messages did)."""
    first = next(found, None)
    if first is None or isinstance(first[1].get("content"), list):
        return None if first is None else first[0]
    near = itertools.islice(found, MARK_LOOKBACK)
    return next((p for p, item in near if isinstance(item.get("content"), list)), first[0])


def _as_sent(parsed: Parsed, segments: Sequence[Segment]) -> list[Any]:
    """The messages of `segments`, each run as the client's bytes of it (`ItemBytes.run`)
    when the body kept them: a view with a breakpoint or two added is written in a few
    pieces, not message by message."""
    sent, natives = parsed.raw_items, parsed.items
    out: list[Any] = []
    for segment in segments:
        if not isinstance(segment, range):
            out.append(segment[0])
        elif sent is None:
            out += natives[segment.start : segment.stop]
        else:
            out += sent.run(segment.start, segment.stop)
    return out


def _systems_after_header(pairs: list[Made]) -> list[Made]:
    """The items, with the system messages of the evicted part right after the header: the
    engine puts them before it, but the API takes a system message only after a user turn."""
    header = next((i for i, (_, source) in enumerate(pairs) if source is None), None)
    if header is None:
        return pairs
    before = pairs[:header]
    moved = [pair for pair in before if pair[0].get("role") == "system"]
    kept = [pair for pair in before if pair[0].get("role") != "system"]
    return [*kept, pairs[header], *moved, *pairs[header + 1 :]]


def _systems_after_users(pairs: list[Made]) -> list[Made]:
    """The items with every system message right after a user turn, as the API requires (a
    view can leave two side by side, or one after an assistant turn, when the messages between
    were removed): one that follows a system message is joined to it, one that follows no
    user turn waits for the next."""
    out: list[Made] = []
    waiting: list[Made] = []
    for pair in pairs:
        role = pair[0].get("role")
        if role == "system" and out and out[-1][0].get("role") == "system":
            out[-1] = _joined(out[-1], pair)
        elif role == "system" and (not out or out[-1][0].get("role") != "user"):
            waiting.append(pair)
        else:
            out.append(pair)
            if role == "user" and waiting:
                out.append(functools.reduce(_joined, waiting))
                waiting = []
    return out + waiting


def _joined(first: Made, second: Made) -> Made:
    """Two system messages as one: the first's place and fields, both contents in order."""
    (a, source), b = first, second[0]

    def blocks(content: Any) -> list[Any]:
        return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)

    if isinstance(a.get("content"), str) and isinstance(b.get("content"), str):
        content: Any = f"{a['content']}\n\n{b['content']}"
    else:
        content = blocks(a.get("content", "")) + blocks(b.get("content", ""))
    return {**a, "content": content}, source
