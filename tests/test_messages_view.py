"""The Messages view written segment by segment (`proxy.dialects.anthropic.view`) is the view
written message by message, its plain definition (`plain_view_items` below): the same messages,
the same breakpoints, the same pieces of the client's bytes, for any view of any history, its
messages kept, dropped, edited (or copied: a copy is an edit) and out of order, with a header
anywhere, with system messages or without."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import View
from proxy.dialects.anthropic.blocks import thinking_turn
from proxy.dialects.anthropic.breakpoints import BREAKPOINT, with_breakpoints
from proxy.dialects.anthropic.groups import groups
from proxy.dialects.anthropic.messages import Messages
from proxy.dialects.anthropic.view import (
    MARK_LOOKBACK,
    _systems_after_header,
    _systems_after_users,
    view_items,
)
from proxy.dialects.base import Entries, Parsed
from tests.conftest import examples
from tests.test_messages_mapping import MARK, histories
from tests.test_raw_items import written

HOUR = {"type": "ephemeral", "ttl": "1h"}


def plain_view_items(parsed: Parsed, entries: Entries, breakpoints: bool) -> list[Any] | None:
    """`view_items` message by message: each message of the view with the native message it
    comes from, breakpoints placed on that list, runs of native messages found in it."""
    whole = len(entries) == len(parsed.messages) and all(
        m is o for (_, m), o in zip(entries, parsed.messages, strict=True)
    )
    last_edit = -1
    sources: Sequence[int | None]
    if whole:
        items, sources = list(parsed.items), range(len(parsed.items))
    else:
        spans = parsed.spans or ()
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
        rewritten = not whole and (last_edit >= 0 or None in sources)
        items = _marked(parsed, items, sources, last_edit if rewritten else None)
    if len(items) == len(parsed.items) and all(map(lambda a, b: a is b, items, parsed.items)):
        return None
    return _as_sent(parsed, items, sources)


def _marked(
    parsed: Parsed, items: list[Any], sources: Sequence[int | None], last_edit: int | None
) -> list[Any]:
    repeated = thinking_turn(parsed.items)[0]
    backwards = range(len(sources) - 1, -1, -1)
    rewritten = None
    if last_edit is not None:
        rewritten = _markable(
            items, (p for p in backwards if (at := sources[p]) is None or at <= last_edit)
        )
    stable = _markable(
        items, (p for p in backwards if (at := sources[p]) is not None and at < repeated)
    )
    marks = [position for position in (rewritten, stable) if position is not None]
    taken = parsed.raw.count(BREAKPOINT) if parsed.marks is None else parsed.marks
    return with_breakpoints(parsed.body, taken, items, marks)


def _markable(items: list[Any], positions: Iterator[int]) -> int | None:
    first = next(positions, None)
    if first is None or isinstance(items[first].get("content"), list):
        return first
    near = itertools.islice(positions, MARK_LOOKBACK)
    return next((p for p in near if isinstance(items[p].get("content"), list)), first)


def _as_sent(parsed: Parsed, items: list[Any], sources: Sequence[int | None]) -> list[Any]:
    sent, natives = parsed.raw_items, parsed.items
    if sent is None:
        return items
    out: list[Any] = []
    start = stop = 0
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


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A Messages request of a random history (now and then with system messages, an hour's
    breakpoint, automatic caching), written with any spacing."""
    messages, _ = draw(histories())
    for at in draw(st.lists(st.integers(1, len(messages)), max_size=2)):
        content = draw(st.sampled_from(["Be brief.", [{"type": "text", "text": "Be kind."}]]))
        messages.insert(at, {"role": "system", "content": content})
    if draw(st.booleans()):
        marked = [m for m in messages if isinstance(m["content"], list) and m["content"]]
        if marked:
            draw(st.sampled_from(marked))["content"][-1]["cache_control"] = HOUR
    fields: dict[str, Any] = {"model": "claude-x", "max_tokens": 64}
    if draw(st.integers(0, 4)) == 0:
        fields["cache_control"] = draw(st.sampled_from([MARK, HOUR]))
    return draw(written({**fields, "messages": messages})).encode()


def edited(message: dict[str, Any], how: str) -> dict[str, Any]:
    """A copy (an edit that changes nothing), or the content replaced (an assistant's text)."""
    if how == "copy" or (message["role"] == "assistant" and not message["content"]):
        return {**message}
    if message["role"] == "assistant":
        return {**message, "content": "[said]"}
    return {**message, "content": "[cleared]" if how == "clear" else ""}


@st.composite
def views(draw: st.DrawFn, parsed: Parsed) -> list[tuple[int | None, Any]]:
    """A view of `parsed`: most messages kept, some dropped or edited, runs of them dropped
    (a compaction's cut), a header where the engine puts one or anywhere, now and then the
    entries out of order or twice."""
    ways = st.sampled_from(["keep"] * 6 + ["drop", "copy", "clear", "empty"])
    systems = st.sampled_from(["keep", "keep", "drop"])
    entries: list[tuple[int | None, Any]] = []
    cut = draw(st.integers(0, len(parsed.messages)))
    for index, message in enumerate(parsed.messages):
        system = message["role"] == "system"  # kept or dropped, never edited
        how = "drop" if index < cut and not system else draw(systems if system else ways)
        if how == "keep":
            entries.append((index, message))
        elif how != "drop":
            entries.append((index, edited(message, how)))
    if draw(st.booleans()):
        before = sum(1 for index, _ in entries if index is not None and index < cut)
        at = draw(st.sampled_from([before, draw(st.integers(0, len(entries)))]))
        entries.insert(at, (None, {"role": "user", "content": "The gist."}))
    if entries and draw(st.integers(0, 9)) == 0:
        moved = entries.pop(draw(st.integers(0, len(entries) - 1)))
        entries.insert(draw(st.integers(0, len(entries))), moved)
    if entries and draw(st.integers(0, 9)) == 0:
        entries.append(draw(st.sampled_from(entries)))
    return entries


def as_view(messages: list[Any], entries: list[tuple[int | None, Any]]) -> View:
    """The same entries as a `View`: each run of messages shown as they are, one range."""
    view = View(messages)
    for index, message in entries:
        last = view.runs[-1] if view.runs else None
        if index is None or message is not messages[index]:
            view.runs.append((index, message))
        elif isinstance(last, range) and last.stop == index:
            view.runs[-1] = range(last.start, index + 1)
        else:
            view.add(index, index + 1)
    assert list(view) == entries
    return view


def written_out(items: list[Any]) -> bytes:
    """The messages as `Dialect.body_with` writes them: the client's bytes as they are."""
    return orjson.dumps([orjson.Fragment(i) if isinstance(i, bytes) else i for i in items])


@settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(requests(), st.data())
def test_the_view_by_segments_is_the_view_message_by_message(
    raw: bytes, data: st.DataObject
) -> None:
    """Split (the client's bytes of each message kept) and read whole (none kept), turn after
    turn: the same messages and the same pieces of bytes as the plain definition writes."""
    dialect = Messages(split_from=0)
    for parsed in (dialect.parse(raw), dialect.parse(raw), dialect.parse_whole(raw)):
        kept = copy.deepcopy(parsed.items)
        entries = data.draw(views(parsed))
        whole = list(enumerate(parsed.messages))
        shown_as = [entries, whole, whole[:-1]]
        for shown in [*shown_as, *(as_view(parsed.messages, view) for view in shown_as)]:
            for breakpoints in (False, True):
                items = view_items(parsed, shown, breakpoints)
                plain = plain_view_items(parsed, shown, breakpoints)
                assert items == plain
                assert items is None or (
                    plain is not None and written_out(items) == written_out(plain)
                )
        assert parsed.items == kept  # nothing changed in place
