"""A bounded memo keyed by content, for work repeated on every turn of a conversation.

Clients resend the whole history each turn, so per-message work (token counts, hashes) is
memoised by the message's content: a fast 64-bit hash of its JSON, cheap to build and keep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import orjson

from policies.chain import message_digest

V = TypeVar("V")


class Memo(Generic[V]):
    """Least recently used out, in two generations: a hit is one dict lookup with no
    bookkeeping; what was not used for a whole generation goes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.hits = 0
        self.misses = 0
        self._recent: dict[int, V] = {}
        self._older: dict[int, V] = {}

    def __len__(self) -> int:
        return len(self._recent) + len(self._older)

    def get(self, value: Any, make: Callable[[Any], V]) -> V:
        """`make(value)`, memoised by the content of `value`."""
        key = hash(orjson.dumps(value))
        found = self._recent.get(key)
        if found is not None:
            self.hits += 1
            return found
        found = self._older.get(key)
        if found is None:
            found = make(value)
            self.misses += 1
        else:
            self.hits += 1
        if len(self._recent) >= max(1, self.size // 2):
            self._older, self._recent = self._recent, {}
        self._recent[key] = found
        return found


class MessageDigests:
    """`policies.chain.message_digest`, memoised: the chain of a long history is rehashed
    every turn, and canonicalising each message costs far more than looking it up."""

    def __init__(self, size: int = 65_536) -> None:
        self.memo: Memo[bytes] = Memo(size)

    def __call__(self, message: Any) -> bytes:
        return self.memo.get(message, message_digest)
