"""A Messages request read into `Parsed`: its fields checked just enough for compaction, and the
canonical messages of its messages (`blocks`) assembled in order, with where each comes from.

A message sent before is looked up by its bytes, with its canonical messages, and a body's
canonical messages are kept with it (`raw_items`): a replayed turn reads and assembles only
what is new. A body the split does not read is read whole, which says what is wrong with it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import orjson

from policies import Message
from proxy.dialects.anthropic.blocks import BadBlock, canonical
from proxy.dialects.anthropic.breakpoints import BREAKPOINT
from proxy.dialects.base import Parsed
from proxy.dialects.item_bytes import ItemBytes
from proxy.dialects.json_checks import refuse_too_deep
from proxy.dialects.raw_items import KnownItems, Split
from proxy.errors import InvalidRequest


def known_messages(split_from: int) -> KnownItems:
    """The messages of the requests read, by their bytes, with their canonical messages, and
    the bodies read last with the canonical messages of all of theirs (bodies shorter than
    `split_from` are read whole)."""
    return KnownItems(
        _is_object, min_bytes=split_from, derive=_canonical, fold=_assembled, marks=BREAKPOINT
    )


def read_request(known: KnownItems, raw: bytes) -> Parsed:
    """The request, split by `known` when it can be, else read whole."""
    try:
        split = known.split(raw, "messages")
    except BadBlock:
        split = None  # the whole-body path names the message and block
    if split is None:
        return read_whole(raw)
    return _parsed(raw, split.body, split.folded, split.raw, split.marks)


def read_whole(raw: bytes) -> Parsed:
    """The request read whole, every message mapped: the path of a body the split does not
    read, which says what is wrong with it."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"Invalid JSON body: {exc.msg} at position {exc.pos}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("Invalid request body: expected a JSON object.")
    refuse_too_deep(body)  # what the proxy accepts it must be able to write back out
    try:
        return _parsed(raw, body, None, None)
    except BadBlock as bad:
        raise InvalidRequest(f"{bad.path}: Input should be {bad.expected}") from None


def _parsed(
    raw: bytes,
    body: dict[str, Any],
    assembled: _Assembled | None,
    sent: ItemBytes | None,
    marks: int | None = None,
) -> Parsed:
    """`body` read, with its canonical messages and the client's bytes of each message
    (`sent`) and its count of breakpoints' keys (`marks`) when the split assembled them."""
    model = body.get("model")
    messages = body.get("messages")
    max_tokens = body.get("max_tokens")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: Input should be a valid list")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise InvalidRequest("max_tokens: Input should be a valid integer")
    if assembled is None:
        each = [canonical(message, index) for index, message in enumerate(messages)]
        assembled = _assemble(each, None, None)
    return Parsed(
        raw=raw,
        body=body,
        model=model,
        messages=assembled.messages,
        items=messages,
        spans=assembled.spans,
        stream=body.get("stream") is True,
        max_output=max_tokens,
        keys=assembled.keys,
        raw_items=sent,
        marks=marks,
    )


def _is_object(message: Any) -> bool:
    return message.__class__ is dict


def _canonical(message: Any) -> list[Message]:
    """A message's canonical messages, whatever its place (only an error names the place)."""
    return canonical(message, 0)


class Spans(list[slice]):
    """Where each canonical message comes from (`Parsed.spans`): the canonical messages of a
    native message share one slice, so a view tells them apart by identity (`groups`); the
    index of that native message (`starts`, an array: a view places a run of canonical
    messages by two numbers, not by reading slices all over memory); and how many of the
    request's native messages are system messages (a view moves them)."""

    __slots__ = ("starts", "systems")

    def __init__(self, after: Spans | None = None) -> None:
        super().__init__(() if after is None else after)
        self.starts: array[int] = array("q") if after is None else after.starts[:]
        self.systems: int = 0 if after is None else after.systems

    def add(self, native: int, count: int) -> None:
        """The `count` canonical messages of native message `native`."""
        self.extend([slice(native, native + 1)] * count)
        self.starts.extend([native] * count)


class _Assembled(NamedTuple):
    """The canonical messages of a request's first `read` messages, where each comes from,
    and (from the split) a content key of each: of its native message's bytes and its place
    among that message's canonical ones."""

    messages: list[Message]
    spans: Spans
    keys: list[int] | None
    read: int


def _assemble(
    each: Sequence[list[Message]], keys: Sequence[int] | None, after: _Assembled | None
) -> _Assembled:
    """`after`'s canonical messages, then those of the messages after them (`each` of every
    message; `keys`, the keys of their bytes, when the body was split)."""
    if after is not None and after.read == len(each):
        return after  # a body sent again: no message after those assembled, never changed
    start = 0 if after is None else after.read
    messages = [] if after is None else list(after.messages)
    spans = Spans(None if after is None else after.spans)
    made = [] if after is None or after.keys is None else list(after.keys)
    for index in range(start, len(each)):
        found = each[index]
        messages += found
        spans.add(index, len(found))
        if found[0]["role"] == "system":  # the canonical message of a system message
            spans.systems += 1
        if keys is not None:
            made += [hash((keys[index], n)) for n in range(len(found))]
    return _Assembled(messages, spans, None if keys is None else made, len(each))


def _assembled(split: Split, after: _Assembled | None) -> _Assembled:
    """The canonical messages of a split body (its messages' were derived one by one)."""
    return _assemble(cast(list[list[Message]], split.derived), split.keys, after)
