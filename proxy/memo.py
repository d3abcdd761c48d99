"""Bounded memory a process keeps for itself: memos keyed by content, and per-session figures.

A memo serves work repeated on every turn of a conversation.
Clients resend the whole history each turn, so per-message work (token counts, hashes) is
memoised by the message's content: a fast 64-bit hash of its JSON (of the client's own bytes
of it, when the dialect kept them), cheap to build and keep.

Per-session figures (calibration, exact counts, prompt-cache figures not yet written) are
each bounded in number by `store.max_sessions`, oldest out (`make_room`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import orjson

from policies.chain import chain_digest
from proxy.config import Store

V = TypeVar("V")
K = TypeVar("K", bound=Hashable)
DEFAULT_MAX_SESSIONS = Store.max_sessions


def content_keys(values: Sequence[Any]) -> list[int]:
    """The memo key of each value: serialising is the costly part, so it is done once a
    request and the keys shared by every memo that looks the values up."""
    return [hash(orjson.dumps(value)) for value in values]


class Memo(Generic[V]):
    """At most `size` entries, least recently used out, in two generations: a hit is one dict
    lookup with no bookkeeping; what was not used for a whole generation goes.

    Clients resend whole histories in order, so when the sessions talking at once hold more
    messages than the memo, plain LRU evicts each entry just before it is asked for again and
    nothing hits. So when a generation fills up having missed more of the messages it evicted
    lately (its two last generations) than it hit, the memo freezes for twice its size in
    look-ups: nothing new comes in,
    and the part of the working set it holds keeps hitting (about size / working set of the
    look-ups). Then a new generation begins, in case the working set changed. Misses of new
    messages (a new working set) never freeze it.

    With `max_bytes`, the keys are bytes (a message's own JSON) and a generation also ends when
    its keys reach half of it: the memo then holds less than `max_bytes` of keys and two keys
    more, beside at most `size` entries.
    """

    def __init__(self, size: int, *, max_bytes: int | None = None) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._recent: dict[Hashable, V] = {}
        self._older: dict[Hashable, V] = {}
        self._recent_bytes = 0  # of the newer generation's keys, with max_bytes
        self._generations = 0  # generations begun
        # The hashes of the keys of the two generations dropped last (not the keys: they may
        # be large).
        self._evicted: tuple[set[int], set[int]] = (set(), set())
        self._counted = 0  # hits when the generation began
        self._returning = 0  # misses of evicted keys in this generation
        self._frozen = 0  # look-ups (past the newer generation) left with nothing new kept

    def __len__(self) -> int:
        return len(self._recent) + len(self._older)

    def get(self, value: Any, make: Callable[[Any], V], key: Hashable | None = None) -> V:
        """`make(value)`, memoised by the content of `value` (`key`, when the caller already
        has it from `content_keys`, or the value's own bytes)."""
        if key is None:
            key = hash(orjson.dumps(value))
        found = self._recent.get(key)
        if found is not None:
            self.hits += 1
            return found
        found = self._older.get(key)
        if found is None:
            found = make(value)
            self.misses += 1
            hashed = hash(key)
            if hashed in self._evicted[0] or hashed in self._evicted[1]:
                self._returning += 1
        else:
            self.hits += 1
        thawed = False
        if self._frozen:
            self._frozen -= 1
            if self._frozen:
                return found
            thawed = True  # a new generation may begin: the working set may have changed
        if len(self._recent) >= max(1, self.size // 2) or (
            self.max_bytes is not None and 2 * self._recent_bytes >= self.max_bytes
        ):
            hits, returning = self.hits - self._counted, self._returning
            self._counted, self._returning = self.hits, 0
            if returning > hits and not thawed:
                self._frozen = 2 * self.size
                return found
            self._evicted = (set(map(hash, self._older)), self._evicted[0])
            self._older, self._recent = self._recent, {}
            self._recent_bytes = 0
            self._generations += 1
        self._recent[key] = found
        if self.max_bytes is not None:
            self._recent_bytes += len(key)  # type: ignore[arg-type]
        return found

    def each(
        self, values: Sequence[Any], make: Callable[[Any], V], keys: Sequence[Hashable]
    ) -> list[V]:
        """`make` of each of `values`, memoised, given their `content_keys`."""
        # Between compactions nearly every message of a request was seen on the turn before:
        # one dict look-up each, and `get`'s bookkeeping only for the others, and for all that
        # follow a new generation (whose look-ups move what they find into it).
        found: list[V | None] = list(map(self._recent.get, keys))
        generations = self._generations
        try:
            first = found.index(None)
        except ValueError:
            self.hits += len(found)
            return found  # type: ignore[return-value]
        self.hits += first
        get = self.get
        for i in range(first, len(found)):
            hit = found[i]
            if hit is None or self._generations != generations:
                found[i] = get(values[i], make, keys[i])
            else:
                self.hits += 1
        return found  # type: ignore[return-value]


class MessageDigests:
    """The digest of each message in the chain, or its place outside it
    (`policies.chain.chain_digest`), memoised: a long history's chain (`policies.Chain.of`) is
    rebuilt every turn, and canonicalising a message, or reading its text for the clients'
    context, costs far more than looking it up."""

    def __init__(self, size: int = 65_536) -> None:
        self.memo: Memo[bytes] = Memo(size)

    def __call__(self, messages: Sequence[Any], keys: Sequence[int]) -> list[bytes]:
        """The digests of `messages`, whose `content_keys` are `keys`."""
        return self.memo.each(messages, chain_digest, keys)


def make_room(entries: dict[K, Any], key: K, max_sessions: int) -> None:
    """Before `key` is put in `entries`: if it is new and they are full, the oldest goes."""
    if key not in entries and len(entries) >= max_sessions:
        del entries[next(iter(entries))]
