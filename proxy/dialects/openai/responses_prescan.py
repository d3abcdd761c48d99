"""The prescan of a Responses body: whether it may hold a compaction_trigger or one of the
proxy's compaction items, and so is to be read (and those expanded) before the request path.

One scan of a body tells that it holds no compaction or compaction_trigger item (both types
start so); only then the two longer, slower ones. A JSON string may spell any of its
characters as a \\u escape, so a body that spells a printable ASCII character so (all the
markers' are) is always read. Escaped non-ASCII text (Python's json.dumps writes all of it
so) is not: that would parse every such body twice. (A regex: ~0.1 ms on 400 KB of plain
text, ~0.35 ms on 700 KB of escaped CJK text.)

A later turn of a conversation resends every earlier item. The part of its body that the
dialect kept of an earlier one (`KnownBodies`) that held neither marker is not scanned again:
both scans cost ~0.4 ms a turn on a 460 KB history.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from proxy.dialects.openai.responses import COMPACTION_TRIGGER
from proxy.dialects.openai.responses_compaction import MARKER
from proxy.dialects.raw_items import KnownBodies

_ITEMS = b'"compaction'
_TRIGGER = b'"' + COMPACTION_TRIGGER.encode() + b'"'  # begins with _ITEMS: found only after it
_ESCAPE = re.compile(rb"\\u00[2-7][0-9A-Fa-f]")  # 6 bytes
# A marker (_ITEMS or an escape) that ends after a clean prefix begins at most this many bytes
# before the prefix's end. (A prefix ends with an item's `}`, which no marker holds: a margin
# that keeps the scan right should it end elsewhere.)
_OVERLAP = len(_ITEMS) - 1


class Found(NamedTuple):
    """What the prescan found in a body."""

    holds: bool  # it may hold a trigger or one of the proxy's items: to be read first
    clean: bool  # it holds neither _ITEMS nor an escape
    after: bytes | None = None  # the clean prefix it was scanned after, if any


def may_hold_items(raw: bytes) -> bool:
    """Whether a Responses body may hold a compaction_trigger or a proxy's compaction item:
    it holds their markers as such, or a \\u escape of a printable ASCII character (which may
    spell them otherwise)."""
    return _scan(raw, 0).holds


def _scan(raw: bytes, start: int) -> Found:
    """`raw` scanned from `start`, where no marker begins before."""
    if _ESCAPE.search(raw, start) is not None:
        return Found(holds=True, clean=False)
    if raw.find(_ITEMS, start) < 0:
        return Found(holds=False, clean=True)
    # The proxy's own item may be anywhere in the body.
    return Found(holds=MARKER in raw or _TRIGGER in raw, clean=False)


class Prescan:
    """`may_hold_items` of the bodies of one dialect's `KnownBodies`, after the prefix a body
    shares with a clean one read before. The clean prefixes are held here by their identity
    (about as many bytes as `bodies` holds at most; the one a body replaces goes)."""

    def __init__(self, bodies: KnownBodies) -> None:
        self.bodies = bodies
        self.held = 0
        self._clean: dict[int, bytes] = {}  # by id(): held, so that no other bytes take it

    def scan(self, raw: bytes) -> Found:
        known = self.bodies.find(raw)
        if known is None or self._clean.get(id(known.prefix)) is not known.prefix:
            return _scan(raw, 0)
        found = _scan(raw, max(0, len(known.prefix) - _OVERLAP))
        return found._replace(after=known.prefix)

    def read(self, raw: bytes, found: Found) -> None:
        """The dialect has read `raw` (`found` by `scan`): if clean, so is what it keeps of it."""
        if not found.clean:
            return
        known = self.bodies.find(raw)
        if known is None or id(known.prefix) in self._clean:
            return
        if found.after is not None:  # replaced by the prefix of `raw` (a later turn)
            self.held -= len(self._clean.pop(id(found.after), b""))
        self._clean[id(known.prefix)] = known.prefix
        self.held += len(known.prefix)
        while self.held > self.bodies.max_bytes and self._clean:
            self.held -= len(self._clean.pop(next(iter(self._clean))))
