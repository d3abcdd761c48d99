"""A view of a Messages conversation as segments, in order: each run of the request's native
messages that goes out as received, a `range` of their indices (adjacent runs joined), and each
message made for the view (an edited one, the header), with the native message it comes from
(None: the header).

A replayed turn's view is a few dozen segments whatever the length of its history (a run
between two of its gaps or edits is one), so what is done to it segment by segment (finding
the proxy's breakpoints near its end, writing it as the client's bytes of each run) costs a
step per gap and edit of the view, not per message.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

Made = tuple[Any, int | None]  # a message made for the view, and its native message
Segment = range | Made


def add_run(segments: list[Segment], start: int, stop: int) -> None:
    """The native messages from `start` to `stop` (not included) after `segments`, joined to
    a run they continue."""
    last = segments[-1] if segments else None
    if isinstance(last, range) and last.stop == start:
        segments[-1] = range(last.start, stop)
    elif start < stop:
        segments.append(range(start, stop))


def of_pairs(natives: Sequence[Any], pairs: Sequence[Made]) -> list[Segment]:
    """The segments of a view written message by message: a native message as received is
    one of a run."""
    segments: list[Segment] = []
    for item, source in pairs:
        if source is not None and item is natives[source]:
            add_run(segments, source, source + 1)
        else:
            segments.append((item, source))
    return segments


def length(segments: Sequence[Segment]) -> int:
    """The number of messages of the view."""
    return sum(len(s) if isinstance(s, range) else 1 for s in segments)


def backwards(
    natives: Sequence[Any], segments: Sequence[Segment], count: int
) -> Iterator[tuple[int, Any, int | None]]:
    """Each message of the view of `count` messages, from the last: its place, itself and
    its native message."""
    place = count
    for segment in reversed(segments):
        if isinstance(segment, range):
            for native in reversed(segment):
                place -= 1
                yield place, natives[native], native
        else:
            place -= 1
            item, source = segment
            yield place, item, source


def tail(natives: Sequence[Any], segments: Sequence[Segment], count: int, start: int) -> list[Any]:
    """The messages of the view of `count` messages from place `start` on."""
    pieces: list[Sequence[Any]] = []
    end = count
    for segment in reversed(segments):
        if end <= start:
            break
        if isinstance(segment, range):
            begin = end - len(segment)
            skip = max(start - begin, 0)
            pieces.append(natives[segment.start + skip : segment.stop])
            end = begin
        else:
            pieces.append([segment[0]])
            end -= 1
    return [item for piece in reversed(pieces) for item in piece]


def replaced(segments: Sequence[Segment], count: int, changed: Mapping[int, Any]) -> list[Segment]:
    """`segments` (of `count` messages) with the message at each place of `changed` replaced
    by its value (a run is cut around it)."""
    if not changed:
        return list(segments)
    first = min(changed)
    after: list[Segment] = []  # what the changed places' segments become, from the last
    end = count
    at = len(segments)
    while end > first:
        at -= 1
        segment = segments[at]
        if isinstance(segment, range):
            begin = end - len(segment)
            pieces: list[Segment] = []
            native = segment.start
            for place in sorted(p for p in changed if begin <= p < end):
                cut = native + place - begin
                add_run(pieces, native, cut)
                pieces.append((changed[place], cut))
                begin, native = place + 1, cut + 1
            add_run(pieces, native, segment.stop)
            after += reversed(pieces)
            end -= len(segment)
        else:
            end -= 1
            _, source = segment
            after.append((changed[end], source) if end in changed else segment)
    return [*segments[:at], *reversed(after)]
