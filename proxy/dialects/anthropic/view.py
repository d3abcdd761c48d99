"""A view of a Messages conversation (`policies.render_entries`) as the request's messages: one
native message for the canonical messages that share it, rebuilt by `blocks` only when one of
them was edited, the system messages of an evicted part after the header, the proxy's own
prompt-cache breakpoints (`breakpoints`) where its next request reads them back, and each run
of unchanged messages written as the client's bytes of it.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterator, Sequence
from typing import Any, cast

from policies import Message
from proxy.dialects.anthropic.blocks import rebuilt, thinking_turn
from proxy.dialects.anthropic.breakpoints import BREAKPOINT, with_breakpoints
from proxy.dialects.base import Entries, Parsed

MARK_LOOKBACK = 8  # messages before a breakpoint's place where one with blocks takes it


def summary_items(header: Message) -> list[Any]:
    """The header message: its own user message, first in `messages`. The API merges it with
    a user turn that follows, so no kept message is edited to make room for it."""
    return [{"role": "user", "content": [{"type": "text", "text": header["content"]}]}]


def edited_items(items: Sequence[Any], original: Message, edited: Message) -> list[Any]:
    """The native message of a canonical message a layer edited, alone in it."""
    return shared_items(items, [(original, edited)])


def shared_items(
    items: Sequence[Any], shown: Sequence[tuple[Message, Message | None]]
) -> list[Any]:
    """The native message `items[0]` with each of its canonical messages as shown (None:
    not shown); nothing when none is."""
    message = rebuilt(items[0], shown)
    return [] if message is None else [message]


def groups(parsed: Parsed, entries: Entries) -> list[tuple[int | None, list[Any]]]:
    """The view as native messages, one group per native message: (the index of one of
    its canonical messages shown, None for the header message; the group's items).

    Several canonical messages may stand for the same native message (a user turn holds
    tool results and text): it goes out once, as received when all its canonical messages
    are shown unchanged, else rebuilt by `shared_items` with every edit.
    """
    spans = cast(Sequence[slice], parsed.spans)
    messages, natives = parsed.messages, parsed.items
    last = len(spans) - 1
    out: list[tuple[int | None, list[Any]]] = []
    run: list[tuple[int, Message]] = []  # the canonical messages shown of a shared one

    def flush() -> None:
        index, _ = run[-1]
        native = spans[index].start
        members = _members(spans, index)
        if len(run) == len(members) and all(m is messages[i] for i, m in run):
            items = [natives[native]]
        else:
            shown_as = dict(run)
            shown = [(messages[i], shown_as.get(i)) for i in members]
            items = shared_items([natives[native]], shown)
        out.append((index, items))
        run.clear()

    for index, message in entries:
        if index is None:
            if run:
                flush()
            out.append((None, summary_items(message)))
            continue
        native = spans[index].start
        if run and spans[run[0][0]].start != native:
            flush()
        before = spans[index - 1].start if index else -1
        after = spans[index + 1].start if index < last else -1
        if native != before and native != after:  # most messages: one of their own
            original = messages[index]
            if message is original:
                out.append((index, [natives[native]]))
            else:
                out.append((index, edited_items([natives[native]], original, message)))
        else:
            run.append((index, message))
    if run:
        flush()
    return out


def _members(spans: Sequence[slice], index: int) -> range:
    """The canonical messages of the native message canonical message `index` is of: those
    next to it with the same native message (a step per member, not per message)."""
    native = spans[index].start
    first, stop = index, index + 1
    while first > 0 and spans[first - 1].start == native:
        first -= 1
    while stop < len(spans) and spans[stop].start == native:
        stop += 1
    return range(first, stop)


def view_items(parsed: Parsed, entries: Entries, breakpoints: bool) -> list[Any] | None:
    """The messages of the view `entries`, with the proxy's prompt-cache breakpoints when
    `breakpoints`, as `Dialect.body_with` takes them; None when they are the request's own,
    unchanged (its body goes as the client sent it)."""
    # Each item with the native message it comes from (None: the header).
    sources: Sequence[int | None]
    last_edit = -1  # the native message of the view's last edited message
    whole = len(entries) == len(parsed.messages) and all(
        map(operator.is_, map(operator.itemgetter(1), entries), parsed.messages)
    )
    if whole:
        items, sources = list(parsed.items), range(len(parsed.items))  # the whole request
    else:
        spans = cast(Sequence[slice], parsed.spans)
        pairs = [
            (item, None if index is None else spans[index].start)
            for index, group in groups(parsed, entries)
            for item in group
        ]
        pairs = _systems_after_users(_systems_after_header(pairs))
        items, sources = [item for item, _ in pairs], [source for _, source in pairs]
        edited = [i for i, m in entries if i is not None and m is not parsed.messages[i]]
        last_edit = spans[edited[-1]].start if edited else -1
    if breakpoints and any(m.get("role") == "assistant" for m in parsed.items):
        # Only a conversation being continued is worth a cache write: its next request
        # reads it back.
        rewritten = not whole and (last_edit >= 0 or None in sources)
        items = _marked(parsed, items, sources, last_edit if rewritten else None)
    if len(items) == len(parsed.items) and all(map(operator.is_, items, parsed.items)):
        return None  # nothing changed, nothing added
    return _as_sent(parsed, items, sources)


def _marked(
    parsed: Parsed,
    items: list[Any],
    sources: Sequence[int | None],
    last_edit: int | None,
) -> list[Any]:
    """`items` with the proxy's breakpoints, in order of priority:

    1. the end of what the session's plan rewrote (`last_edit`, the native message of its
       last edited message, else the summary; None: it rewrote nothing): the next
       compaction only changes what comes after it, so the prefix up to it is read from
       the cache again when the next compaction forwards a new view;
    2. the last message the next request repeats byte for byte: everything but the
       current tool loop's assistant turn, whose thinking the next request no longer
       carries (the client's own breakpoint on the last message misses because of it).

    Both are found from the end: they are near it.
    """
    repeated = thinking_turn(parsed.items)[0]
    backwards = range(len(sources) - 1, -1, -1)
    rewritten = stable = None
    if last_edit is not None:
        rewritten = _markable(
            items, (p for p in backwards if (at := sources[p]) is None or at <= last_edit)
        )
    stable = _markable(
        items, (p for p in backwards if (at := sources[p]) is not None and at < repeated)
    )
    marks = [position for position in (rewritten, stable) if position is not None]
    # Counted by the split of the body, which counts only what a known body's turn adds.
    taken = parsed.raw.count(BREAKPOINT) if parsed.marks is None else parsed.marks
    return with_breakpoints(parsed.body, taken, items, marks)


def _markable(items: list[Any], positions: Iterator[int]) -> int | None:
    """The first of `positions` whose message has blocks, among the next few (a cache entry
    is found that far back), else the first: a breakpoint makes a message's string content a
    text block, which it would stop being the turn after, when the breakpoint has moved on
    (the bytes of a replayed prefix would change, as Claude Code's string system messages
    did)."""
    first = next(positions, None)
    if first is None or isinstance(items[first].get("content"), list):
        return first
    near = itertools.islice(positions, MARK_LOOKBACK)
    return next((p for p in near if isinstance(items[p].get("content"), list)), first)


def _as_sent(parsed: Parsed, items: list[Any], sources: Sequence[int | None]) -> list[Any]:
    """`items`, each run of native messages that goes out unchanged as the client's bytes of
    it (`ItemBytes.run`) when the body kept them: a view with a breakpoint or two added is
    written in a few pieces, not message by message."""
    sent, natives = parsed.raw_items, parsed.items
    if sent is None:
        return items
    out: list[Any] = []
    start = stop = 0  # the run of unchanged native messages not written yet
    for item, source in zip(items, sources, strict=True):
        if source is not None and item is natives[source]:
            if source != stop:
                out += sent.run(start, stop)
                start = source
            stop = source + 1
        else:
            out += sent.run(start, stop)
            start = stop = 0
            out.append(item)
    out += sent.run(start, stop)
    return out


def _systems_after_header(pairs: list[tuple[Any, int | None]]) -> list[tuple[Any, int | None]]:
    """The items, with the system messages of the evicted part right after the header: the
    engine puts them before it, but the API takes a system message only after a user turn."""
    header = next((i for i, (_, source) in enumerate(pairs) if source is None), None)
    if header is None:
        return pairs
    before = pairs[:header]
    moved = [pair for pair in before if pair[0].get("role") == "system"]
    kept = [pair for pair in before if pair[0].get("role") != "system"]
    return [*kept, pairs[header], *moved, *pairs[header + 1 :]]


Pair = tuple[Any, int | None]


def _systems_after_users(pairs: list[Pair]) -> list[Pair]:
    """The items with every system message right after a user turn, as the API requires (a
    view can leave two side by side, or one after an assistant turn, when the messages between
    were removed): one that follows a system message is joined to it, one that follows no
    user turn waits for the next."""
    out: list[Pair] = []
    waiting: list[Pair] = []
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


def _joined(first: Pair, second: Pair) -> Pair:
    """Two system messages as one: the first's place and fields, both contents in order."""
    (a, source), b = first, second[0]

    def blocks(content: Any) -> list[Any]:
        return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)

    if isinstance(a.get("content"), str) and isinstance(b.get("content"), str):
        content: Any = f"{a['content']}\n\n{b['content']}"
    else:
        content = blocks(a.get("content", "")) + blocks(b.get("content", ""))
    return {**a, "content": content}, source
