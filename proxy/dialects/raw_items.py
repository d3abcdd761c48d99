"""A body read as its fields and the client's own bytes of each item of its conversation.

Clients resend the whole conversation on every turn. Parsing, checking and hashing each item
again would cost in proportion to the history; instead msgspec splits the body (it skips over
each item, keeping its bytes), each item is looked up by those exact bytes among the items
already read and checked, and only the new ones are parsed (orjson) and checked. An untouched
item then goes upstream as those same bytes (`orjson.Fragment`).

What this path cannot read it leaves to the dialect's whole-body path (`load_object` and the
checks of every item), which gives the same 400 as ever: a split is only ever a faster way to
the result of that path, never a different one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import orjson

from ..memo import Memo
from .openai import MAX_DEPTH, nests_within

_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
# What splitting a body that is not plain valid JSON may raise (a key that is not UTF-8 is a
# UnicodeDecodeError, a deep one a RecursionError).
_UNSPLIT = (msgspec.MsgspecError, ValueError, RecursionError)


class Split(NamedTuple):
    """A body as `orjson.loads` reads it, and the bytes of its conversation's items (a tuple:
    made on every request, and cheaper to make than a dataclass)."""

    body: dict[str, Any]  # every field; the conversation's items decoded (the list `items`)
    items: list[Any]
    raw: list[bytes]  # the client's bytes of each item
    keys: list[int]  # a content key of each item (`proxy.memo`): the hash of its bytes


class KnownItems:
    """The items of conversations already read, each by its exact bytes (so an entry is never
    returned for other bytes), decoded and checked.

    Bounded: at most `size` items and about `max_bytes` of their JSON (`proxy.memo.Memo`);
    their decoded form takes about twice as much memory again.
    """

    def __init__(
        self, accepts: Callable[[Any], bool], *, size: int = 32_768, max_bytes: int = 8 << 20
    ) -> None:
        self.accepts = accepts  # whether the dialect's checks pass an item
        self.memo: Memo[Any] = Memo(size, max_bytes=max_bytes)

    def split(self, raw: bytes, field: str) -> Split | None:
        """The body, its conversation in `field` split into items; None when the dialect's
        whole-body path must read it (it is not a JSON object with a model and a list in
        `field`, or it holds anything that path would refuse)."""
        try:
            fields = _FIELDS.decode(raw)
            conversation = fields.pop(field, None)
            if conversation is None:
                return None
            body = {name: _value(value, MAX_DEPTH - 1) for name, value in fields.items()}
            model = body.get("model")
            if not isinstance(model, str) or not model:
                return None
            spans = list(map(bytes, _ITEMS.decode(conversation)))
            items = self.memo.each(spans, self._read, spans)
        except (*_UNSPLIT, orjson.JSONDecodeError, _Refused):
            return None
        # The dict look-ups above hashed every span; bytes keep their hash.
        body[field] = items
        return Split(body, items, spans, list(map(hash, spans)))

    def _read(self, span: bytes) -> Any:
        """A new item, read as the whole-body path reads it: parsed, no deeper than the body
        may nest at its place (the body, its list, the item), and checked."""
        item = _value(span, MAX_DEPTH - 2)
        if not self.accepts(item):
            raise _Refused
        return item


class _Refused(Exception):
    """An item the dialect's checks refuse: its whole-body path says why."""


def _value(raw: msgspec.Raw | bytes, limit: int) -> Any:
    """A JSON value nesting no deeper than `limit` levels (itself the first)."""
    value = orjson.loads(raw if raw.__class__ is bytes else bytes(raw))
    if isinstance(value, dict | list) and not nests_within(value, limit):
        raise _Refused
    return value
