"""A body read as its fields and the client's own bytes of each item of its conversation.

Clients resend the whole conversation on every turn. Parsing, checking and hashing each item
again would cost in proportion to the history. Instead: a body that begins with the bytes of
a body read before, up to the end of that one's last item (the client's last turn), has only
what follows read (`KnownBodies`); any other is split by msgspec (it skips over each item,
keeping its bytes), and each item looked up by those exact bytes among the items already read
and checked. Only new items are parsed (orjson) and checked. An untouched item then goes
upstream as those same bytes (`orjson.Fragment`).

What this path cannot read it leaves to the dialect's whole-body path (`load_object` and the
checks of every item), which gives the same 400 as ever: a split is only ever a faster way to
the result of that path, never a different one.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import orjson

from proxy.dialects.item_bytes import ItemBytes
from proxy.dialects.json_checks import MAX_DEPTH, nests_within
from proxy.memo import Memo

_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
# What splitting a body that is not plain valid JSON may raise (a key that is not UTF-8 is a
# UnicodeDecodeError, a deep one a RecursionError).
_UNSPLIT = (msgspec.MsgspecError, ValueError, RecursionError)
_WHITESPACE = b" \t\n\r"  # JSON's (bytes.strip's default strips more)
# A field named "" (only a name is followed by a colon; a string ending in an escaped quote
# may match too, and is then read whole).
_EMPTY_NAME = re.compile(rb'""[ \t\n\r]*:')
_BETWEEN = re.compile(rb"[ \t\n\r]*,?[ \t\n\r]*")  # what comes between items of an array
_NO_OFFSETS: array[int] = array("Q")  # of no known item (never changed)


# Bodies shorter than this are read whole: no shorter body is kept to be known again
# (`KnownBodies.head`), and one parse of it costs less than splitting it (a one-message body:
# 7 us against 17 us).
SPLIT_FROM = 256


class Split(NamedTuple):
    """A body as `orjson.loads` reads it, and the bytes of its conversation's items (a tuple:
    made on every request, and cheaper to make than a dataclass)."""

    body: dict[str, Any]  # every field; the conversation's items decoded (the list `items`)
    items: list[Any]
    raw: ItemBytes  # the client's bytes of each item
    keys: list[int]  # a content key of each item (`proxy.memo`): the hash of its bytes
    derived: list[Any] | None = None  # `KnownItems.derive` of each item, if it has one
    folded: Any = None  # `KnownItems.fold` of the items, if it has one
    marks: int | None = None  # how often `KnownItems.marks` is in the body, if it has one


class KnownItems:
    """The items of conversations already read, each by its exact bytes (so an entry is never
    returned for other bytes), decoded and checked; and the bodies read last, by their bytes
    up to the end of their conversation's last item.

    A client's next turn is its last body with new items at the end of the conversation: when
    a body begins with the bytes of a body read before, up to the end of that one's last item,
    only what follows is split and read (`KnownBodies`), and the history costs one comparison
    of bytes.

    Bounded: at most `size` items and about `max_bytes` of their JSON (`proxy.memo.Memo`);
    their decoded form takes 1.5 to 12 B a byte of JSON (long text to tiny blocks); what
    `derive` makes of them (if given), in a memo of the same bounds, 0.13 to 0.7 of that
    (Anthropic's canonical messages); and `KnownBodies`' bound.

    `derive` makes something of each item alone; `fold`, of the split's items in turn (the
    canonical messages of a whole conversation, with their keys), given what it made of the
    known body's items, which the conversation begins with (None: it starts over): it must
    not change that, which the known body keeps. An error either raises (but a ValueError)
    reaches the caller of `split`.

    `marks`, if given, is counted in each body (`Split.marks`): a body known before adds the
    count in the bytes after it to the known one's, so a long history is not searched again.
    """

    def __init__(
        self,
        accepts: Callable[[Any], bool],
        *,
        size: int = 32_768,
        max_bytes: int = 8 << 20,
        min_bytes: int = SPLIT_FROM,
        derive: Callable[[Any], Any] | None = None,
        fold: Callable[[Split, Any], Any] | None = None,
        marks: bytes = b"",
    ) -> None:
        self.accepts = accepts  # whether the dialect's checks pass an item
        self.min_bytes = min_bytes  # a shorter body is left to the whole-body path
        self.memo: Memo[Any] = Memo(size, max_bytes=max_bytes)
        self.derive = derive
        self.derived: Memo[Any] = Memo(size, max_bytes=max_bytes)
        self.fold = fold
        self.marks = marks
        self.bodies = KnownBodies()

    def split(self, raw: bytes, field: str) -> Split | None:
        """The body, its conversation in `field` split into items; None when the dialect's
        whole-body path must read it (it is not a JSON object with a model and a list in
        `field`, or it holds anything that path would refuse, or it is short)."""
        if len(raw) < self.min_bytes:
            return None
        try:
            known = self.bodies.find(raw)
            if known is not None:
                split = self._after(raw, field, known)
                if split is not None:
                    return split
            return self._whole(raw, field)
        except (*_UNSPLIT, orjson.JSONDecodeError, _Refused):
            return None

    def _whole(self, raw: bytes, field: str) -> Split | None:
        fields = _FIELDS.decode(raw)
        if field not in fields:
            return None
        names = list(fields)
        at = names.index(field)
        conversation = fields.pop(field)
        values = _values(fields)
        listed = bytes(conversation)
        spans = list(map(bytes, _ITEMS.decode(listed)))
        split = self._split(
            {name: values[name] for name in names[:at]},
            field,
            {name: values[name] for name in names[at + 1 :]},
            None,
            spans,
        )
        start = _only(listed, raw) if split is not None and spans else None
        if split is not None and start is not None:  # where the conversation is
            before = _FIELDS.decode(raw[:start] + b"null}")
            before.pop(field)
            end = start + len(listed[:-1].rstrip(_WHITESPACE))
            prefix, offsets = raw[:end], _offsets(listed, spans, start)
            split = split._replace(raw=ItemBytes(prefix, offsets, []))  # runs cut in one piece
            marks = prefix.count(self.marks) if self.marks else 0
            known = _known(prefix, _values(before), offsets, split, _strings(prefix), marks)
            self.bodies.add(known)
        if split is not None and self.marks:
            split = split._replace(marks=raw.count(self.marks))
        return split

    def _after(self, raw: bytes, field: str, known: _Known) -> Split | None:
        """`raw` read as `known`'s body with the items after its last one, or None when it is
        not that (the conversation named again after it, an item that is not one)."""
        rest = raw[len(known.prefix) :].lstrip(_WHITESPACE)
        if rest[:1] == b",":
            rest = rest[1:]
            if rest.lstrip(_WHITESPACE)[:1] in (b"]", b","):
                return None  # not JSON: the whole-body path says why
        elif rest[:1] != b"]":
            return None
        if _EMPTY_NAME.search(rest):
            return None  # "" is the stand-in name below: a body that has it is read whole
        # The items after the known ones, and the fields after the conversation: the rest of
        # the body as an object whose first field holds them.
        fields = _FIELDS.decode(b'{"":[' + rest)
        listed = bytes(fields.pop(""))
        if field in fields:
            return None
        spans = list(map(bytes, _ITEMS.decode(listed)))
        split = self._split(known.before, field, _values(fields), known, spans)
        if split is not None and self.marks:
            split = split._replace(marks=known.marks + raw.count(self.marks, len(known.prefix)))
        if split is not None and spans:
            start = len(raw) - len(rest)  # of listed[1:]
            end = start + len(listed[:-1].rstrip(_WHITESPACE)) - 1
            offsets = known.offsets + _offsets(listed, spans, start - 1)
            quotes = known.quotes + sum(map(_strings, spans))
            marks = known.marks + raw.count(self.marks, len(known.prefix), end) if self.marks else 0
            later = _known(raw[:end], known.before, offsets, split, quotes, marks)
            self.bodies.replace(known, later)
        return split

    def _split(
        self,
        before: dict[str, Any],
        field: str,
        after: dict[str, Any],
        known: _Known | None,
        spans: list[bytes],
    ) -> Split | None:
        """The body: the fields `before`, the conversation in `field` (the items of `known`, if
        any, followed by those of `spans`), the fields `after` (a field named twice stays where
        it was named first, as for orjson)."""
        model = after["model"] if "model" in after else before.get("model")
        if not isinstance(model, str) or not model:
            return None
        items = self.memo.each(spans, self._read, spans)
        # The dict look-ups above hashed every span; bytes keep their hash.
        keys = list(map(hash, spans))
        derived = None if self.derive is None else self.derived.each(items, self.derive, spans)
        raw = ItemBytes(b"", _NO_OFFSETS, spans)
        if known is not None:
            items, keys = _then(known.items, items), _then(known.keys, keys)
            if derived is not None:
                derived = _then(known.derived, derived)
            raw = ItemBytes(known.prefix, known.offsets, spans)
        split = Split({**before, field: items, **after}, items, raw, keys, derived)
        if self.fold is None:
            return split
        return split._replace(folded=self.fold(split, None if known is None else known.folded))

    def _read(self, span: bytes) -> Any:
        """A new item, read as the whole-body path reads it: parsed, no deeper than the body
        may nest at its place (the body, its list, the item), and checked."""
        item = _value(span, MAX_DEPTH - 2)
        if not self.accepts(item):
            raise _Refused
        return item


def _then(known: list[Any], new: list[Any]) -> list[Any]:
    """The list `known` followed by `new`: `known` itself when nothing follows (a body sent
    again shares its known body's lists, which nothing changes in place: `Parsed`)."""
    return known + new if new else known


class _Known(NamedTuple):
    """A body read: its bytes up to the end of its conversation's last item, the fields
    before the conversation, where each item is in those bytes (its first byte and the one
    after its last, in turn), the key of each (`Split.keys`), each decoded (the memo's own
    objects while it holds them), and the bytes all that takes (about: `_size`)."""

    prefix: bytes
    before: dict[str, Any]
    offsets: array[int]
    keys: list[int]  # the same objects turn after turn: a compare of them is one of pointers
    items: list[Any]
    derived: list[Any]  # empty without `KnownItems.derive`
    folded: Any  # None without `KnownItems.fold`
    quotes: int  # in `prefix`: what its items take decoded grows with them (`_known`)
    marks: int  # `KnownItems.marks` in `prefix`
    size: int


# What a body kept takes beside its bytes (tracemalloc measures 0.7 to 1.15 of it for items
# of short and long text, text that is JSON, tool calls and many small parts;
# tests/test_raw_items.py holds it to that): its own objects; for each item its offsets, key
# and place in the list; the items decoded (the memo may hold them too), about a byte for
# each byte of their JSON and 56 for each string or object (two quotes, not escaped); and
# what the dialect made of them, about 44 B more for each and 150 B an item. JSON of numbers
# or of lists nested deep has no quotes to count, and takes up to 3 times as much.
_PER_BODY = 1_000
_PER_ITEM = 150
_PER_QUOTE = 28
_MADE_PER_QUOTE = 22
_MADE_PER_ITEM = 150


def _known(
    prefix: bytes,
    before: dict[str, Any],
    offsets: array[int],
    split: Split,
    quotes: int,
    marks: int,
) -> _Known:
    """The body read as `split`, its bytes `prefix` holding `quotes` quotes and `marks`
    marks."""
    derived = [] if split.derived is None else split.derived
    made = split.derived is not None or split.folded is not None
    per_item = _PER_ITEM + (_MADE_PER_ITEM if made else 0)
    per_quote = _PER_QUOTE + (_MADE_PER_QUOTE if made else 0)
    size = _PER_BODY + 2 * len(prefix) + per_quote * quotes + per_item * len(split.items)
    items, keys, folded = split.items, split.keys, split.folded
    return _Known(prefix, before, offsets, keys, items, derived, folded, quotes, marks, size)


def _strings(data: bytes) -> int:
    """The quotes that open or close a string or an object's key in some JSON (an escaped one
    is a byte of a string; a string ending in a backslash is one string short)."""
    return data.count(b'"') - data.count(b'\\"')


def _offsets(listed: bytes, spans: list[bytes], at: int) -> array[int]:
    """Where each of `spans`, the items of the JSON array `listed`, begins and ends, in the
    bytes `listed` is at `at` in."""
    offsets, end = array("Q"), 1
    for span in spans:
        start = _BETWEEN.match(listed, end).end()  # type: ignore[union-attr]
        end = start + len(span)
        offsets.append(at + start)
        offsets.append(at + end)
    return offsets


class KnownBodies:
    """The bodies read last, found by their first `head` bytes (several sessions may begin
    alike: a shared system prompt), at most `per_head` a head and about `max_bytes` of memory
    in all, their bytes and what is kept of their items (or the one body read last, if
    larger), the least recently used dropped first."""

    def __init__(self, *, head: int = 256, per_head: int = 32, max_bytes: int = 8 << 20) -> None:
        self.head = head
        self.per_head = per_head
        self.max_bytes = max_bytes
        self.held = 0
        self._by_head: dict[bytes, list[_Known]] = {}

    def find(self, raw: bytes) -> _Known | None:
        """A body `raw` begins with, up to the end of its last item (and goes on after)."""
        for known in self._by_head.get(raw[: self.head]) or ():
            if len(known.prefix) < len(raw) and raw.startswith(known.prefix):
                return known
        return None

    def add(self, known: _Known) -> None:
        if len(known.prefix) < self.head:
            return
        head = known.prefix[: self.head]
        bodies = self._by_head.pop(head, [])  # back in, as the most recently used
        bodies.insert(0, known)
        self.held += known.size
        for dropped in bodies[self.per_head :]:
            self.held -= dropped.size
        self._by_head[head] = bodies[: self.per_head]
        while self.held > self.max_bytes:  # the least recently used out, but for this body
            oldest = next(iter(self._by_head))
            others = self._by_head[oldest]
            if len(others) == 1 and others[0] is known:
                break
            self.held -= others.pop().size
            if not others:
                del self._by_head[oldest]

    def replace(self, old: _Known, new: _Known) -> None:
        """`new`, a later turn of `old`'s body, in its place."""
        head = old.prefix[: self.head]
        bodies = self._by_head.get(head, [])
        if any(known is old for known in bodies):
            self._by_head[head] = [known for known in bodies if known is not old]
            self.held -= old.size
        self.add(new)


class _Refused(Exception):
    """An item the dialect's checks refuse: its whole-body path says why."""


def _only(part: bytes, whole: bytes) -> int | None:
    """Where `part` is in `whole`, when it is there once."""
    # Found by its first bytes, then compared in place: finding a long needle costs more.
    head, found = part[:64], list[int]()
    at = whole.find(head)
    while at >= 0 and len(found) < 2:
        if whole.startswith(part, at):
            found.append(at)
        at = whole.find(head, at + 1)
    return found[0] if len(found) == 1 else None


def _values(fields: dict[str, msgspec.Raw]) -> dict[str, Any]:
    """Top-level fields, each nesting no deeper than the body may (itself the second level)."""
    return {name: _value(value, MAX_DEPTH - 1) for name, value in fields.items()}


def _value(raw: msgspec.Raw | bytes, limit: int) -> Any:
    """A JSON value nesting no deeper than `limit` levels (itself the first)."""
    value = orjson.loads(raw if raw.__class__ is bytes else bytes(raw))
    if isinstance(value, dict | list) and not nests_within(value, limit):
        raise _Refused
    return value
