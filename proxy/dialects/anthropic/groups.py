"""The native messages of a view of a Messages conversation (`policies.render_entries`): one
native message for the canonical messages that share it (a user turn holds tool results and
text), as received when every one of them is shown unchanged, else rebuilt by `blocks` with
each edit; and the header message, a user message of its own.

`groups` makes them entry by entry, `segments_of` the same as segments (`segments`): a step
per entry that only compares it with the message it shows, and one per gap and edit of the
view, where the native messages next to it are grouped as `groups` groups them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from policies import Message
from policies.plan import View
from proxy.dialects.anthropic.blocks import rebuilt
from proxy.dialects.anthropic.request import Spans
from proxy.dialects.anthropic.segments import Segment, add_run
from proxy.dialects.base import Entries, Parsed

Shown = list[tuple[int, Message]]  # canonical messages of a native one, each as shown


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

    A native message with canonical messages of its own goes out once, as received when all
    of them are shown unchanged, else rebuilt by `shared_items` with every edit.
    """
    spans = cast(Sequence[slice], parsed.spans)
    messages, natives = parsed.messages, parsed.items
    last = len(spans) - 1
    out: list[tuple[int | None, list[Any]]] = []
    run: Shown = []  # the canonical messages shown of a shared one

    def flush() -> None:
        index, _ = run[-1]
        out.append((index, shown_native(parsed, run)))
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


def shown_native(parsed: Parsed, shown: Shown) -> list[Any]:
    """The native message of the canonical messages `shown` (each with its view, in order):
    as received when they are all of its own, unchanged, else rebuilt (nothing when nothing
    of it remains)."""
    spans = cast(Sequence[slice], parsed.spans)
    messages = parsed.messages
    index, _ = shown[-1]
    native = parsed.items[spans[index].start]
    members = members_of(spans, index)
    if len(shown) == len(members) and all(m is messages[i] for i, m in shown):
        return [native]
    shown_as = dict(shown)
    return shared_items([native], [(messages[i], shown_as.get(i)) for i in members])


def members_of(spans: Sequence[slice], index: int) -> range:
    """The canonical messages of the native message canonical message `index` is of: those
    next to it with the same native message (a step per member, not per message)."""
    native = spans[index].start
    first, stop = index, index + 1
    while first > 0 and spans[first - 1].start == native:
        first -= 1
    while stop < len(spans) and spans[stop].start == native:
        stop += 1
    return range(first, stop)


def segments_of(parsed: Parsed, entries: Entries) -> tuple[list[Segment], int] | None:
    """`groups` as segments (the header's source None), and the native message of the last
    edited message (-1: none); None when the entries are not in the order of their messages
    (each after the one before), or the request has system messages (`view` moves them)."""
    spans = parsed.spans
    if not isinstance(spans, Spans) or spans.systems:
        return None
    messages, count, starts = parsed.messages, len(spans), spans.starts
    build = _Segments(parsed)
    segments, shown = build.segments, build.shown
    start = stop = 0  # the canonical messages shown unchanged, not handed over yet
    floor = 0  # the least index the next entry may have
    # A `View`'s runs of messages shown as they are (ranges) go as one entry each.
    for entry in entries.runs if isinstance(entries, View) else entries:
        index: int | None
        if isinstance(entry, range):
            index, end, same = entry.start, entry.stop, True
        else:
            index, message = entry
            end = 0 if index is None else index + 1
            same = index is not None and message is messages[index]
        if index == stop and same:  # most entries: the run goes on
            stop = end
            continue
        if start < stop:
            floor = stop
            first, last = starts[start], starts[stop - 1]  # their native messages
            if (
                shown
                or (start and starts[start - 1] == first)
                or (stop < count and starts[stop] == last)
            ):
                build.run(start, stop)
            else:  # most runs: whole native messages, after a gap or an edit
                add_run(segments, first, last + 1)
        if index is None:
            build.header(message)
            start = stop = floor
        elif index < floor:
            return None
        elif same:
            start, stop = index, end
        else:
            build.edit(index, message)
            start = stop = floor = index + 1
    if start < stop:
        build.run(start, stop)
    build.flush()
    return segments, build.last_edit


class _Segments:
    """The segments of a view, handed over in order: runs of canonical messages shown
    unchanged, edits and the header. The native message a run begins or ends within waits
    with its canonical messages shown (`shown`) until the next one that is not of it."""

    def __init__(self, parsed: Parsed) -> None:
        self.parsed = parsed
        self.spans = cast(Spans, parsed.spans)
        self.segments: list[Segment] = []
        self.shown: Shown = []  # of the native message that waits
        self.last_edit = -1

    def run(self, start: int, stop: int) -> None:
        """Canonical messages `start` to `stop` (not included), shown unchanged."""
        spans, messages, shown = self.spans, self.parsed.messages, self.shown
        native = spans[start].start
        if shown and spans[shown[0][0]].start != native:
            self.flush()
        if shown or (start and spans[start - 1].start == native):
            # Its first native message has canonical messages before it, shown or not.
            end = min(stop, members_of(spans, start).stop)
            shown += [(i, messages[i]) for i in range(start, end)]
            if end == stop:
                return
            self.flush()
            start, native = end, spans[end].start
        last = spans[stop - 1].start
        if stop == len(spans) or spans[stop].start != last:
            add_run(self.segments, native, last + 1)
            return
        # Its last native message has canonical messages after it, shown or not.
        add_run(self.segments, native, last)
        shown += [(i, messages[i]) for i in range(members_of(spans, stop - 1).start, stop)]

    def edit(self, index: int, message: Message) -> None:
        spans, shown = self.spans, self.shown
        native = spans[index].start
        if shown and spans[shown[0][0]].start != native:
            self.flush()
        self.last_edit = native
        if len(members_of(spans, index)) > 1:  # it waits with the others of its native message
            shown.append((index, message))
            return
        # Most edits: of a native message of its own, made at once.
        original, item = self.parsed.messages[index], self.parsed.items[native]
        self.segments += ((made, native) for made in edited_items([item], original, message))

    def header(self, message: Message) -> None:
        self.flush()
        self.segments.extend((item, None) for item in summary_items(message))

    def flush(self) -> None:
        """The native message that waits, if any, into the segments."""
        if not self.shown:
            return
        native = self.spans[self.shown[-1][0]].start
        for item in shown_native(self.parsed, self.shown):
            if item is self.parsed.items[native]:
                add_run(self.segments, native, native + 1)
            else:
                self.segments.append((item, native))
        self.shown.clear()
