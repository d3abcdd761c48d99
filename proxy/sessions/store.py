"""Per-session records: versioned, compare-and-set, and a single-flight lock.

`MemoryStore` serves one process, `RedisStore` replicas sharing a Redis (one server, a
Cluster, or a master behind Sentinels); both pass one contract suite (tests/test_store.py).
Keys are `proxy.sessions.session_key` hashes, so raw client input never reaches the store,
and the Redis keys of one session share a Redis Cluster hash tag. Beside its state, a
session's record keeps the figures of its turns (`turns.StoredTurns`), the session has a
row in the index of recent sessions (`recent`) and its elided originals (`originals`).
Every failure to answer is `StoreUnavailable`."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from redis.typing import EncodableT

from proxy.config.store_url import InvalidStoreURL, parse_store_url
from proxy.errors import StoreUnavailable
from proxy.sessions import recent
from proxy.sessions import redis_scripts as scripts
from proxy.sessions.originals import MemoryOriginals, Originals, RedisOriginals, StoredOriginals
from proxy.sessions.recent import Listing, MemoryRecent, RedisRecent
from proxy.sessions.redis_clients import connect
from proxy.sessions.turns import NO_TURNS, StoredTurns, TurnCounts

log = logging.getLogger("compaction_proxy")

T = TypeVar("T")

_KEY = re.compile(r"[0-9a-f]{32}")


@dataclasses.dataclass(frozen=True)
class Record:
    version: int
    data: bytes


class SessionStore(Protocol):
    async def get(self, key: str) -> Record | None: ...

    async def compare_and_set(
        self, key: str, expected_version: int, data: bytes, *, fence: int | None = None
    ) -> int | None:
        """Write `data` as version `expected_version + 1` if the stored version is
        `expected_version` (0: no record yet); the new version, or None on a conflict.

        With `fence`, also None when a newer lock token than `fence` was issued for the key,
        so a summarizer that lost its lock cannot overwrite. Every write (re)sets the TTL.
        """

    async def add_turns(
        self, key: str, added: StoredTurns, keep: int
    ) -> tuple[TurnCounts, Record | None]:
        """Add turns to the session's: its counts to theirs, its lines after theirs (the last
        `keep` kept), its `who` in place of theirs; the version stays, the TTL is (re)set.
        The counts now, and the record as `get` gives it."""

    async def turns(self, key: str) -> StoredTurns | None:
        """The session's turns, None when none was added."""

    async def delete(self, key: str) -> None:
        """Forget the record, its turns and its row. The lock and the newest token stay until
        they expire, so a summarizer still running stays fenced."""

    async def set_listing(self, key: str, listing: Listing) -> None:
        """The session's row in the index of recent sessions, best-effort; the newer (by its
        time) of two rows of a session stays."""

    async def recent(self) -> list[Listing]:
        """The rows of the index, newest first: at most `recent.MAX_LISTED`, none of a
        session not written for the TTL."""

    async def acquire_lock(self, key: str, ttl_seconds: float) -> int | None:
        """A fencing token (strictly increasing per key), or None while someone holds it."""

    async def release_lock(self, key: str, token: int) -> None:
        """Release the lock, only if `token` still holds it."""

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
    def originals(self, limits: StoredOriginals) -> Originals: ...


def open_store(
    url: str,
    *,
    ttl_seconds: int,
    key_prefix: str = "cp",
    timeout_seconds: float = 0.5,
    max_sessions: int = 10_000,
) -> SessionStore:
    """`memory://` -> MemoryStore; any Redis form (`proxy.config.store_url`) -> RedisStore."""
    if parse_store_url(url).kind == "memory":
        return MemoryStore(ttl_seconds=ttl_seconds, max_sessions=max_sessions)
    return RedisStore(
        url, ttl_seconds=ttl_seconds, key_prefix=key_prefix, timeout_seconds=timeout_seconds
    )


class _LRU(Generic[T]):
    """Entries that expire by themselves, the least recently used out beyond `size`."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[str, tuple[T, float]] = OrderedDict()

    def get(self, key: str, now: float) -> T | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[1] <= now:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, value: T, expires_at: float) -> None:
        self._items[key] = (value, expires_at)
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)

    def pop(self, key: str) -> None:
        self._items.pop(key, None)


@dataclasses.dataclass(frozen=True)
class _Lock:
    token: int  # the newest token issued for the key
    held_until: float  # 0 once released


class MemoryStore:
    """One process: bounded (least recently used out) and with expiry, like Redis."""

    def __init__(self, *, ttl_seconds: float, max_sessions: int = 10_000) -> None:
        _check_positive("ttl_seconds", ttl_seconds)
        _check_positive("max_sessions", max_sessions)
        self._ttl = ttl_seconds
        self._records: _LRU[Record] = _LRU(max_sessions)
        self._locks: _LRU[_Lock] = _LRU(max_sessions)
        self._turns: _LRU[StoredTurns] = _LRU(max_sessions)
        self._recent = MemoryRecent(ttl_seconds, min(max_sessions, recent.MAX_LISTED))
        # One counter for all keys: a token stays above every older one of its key even after
        # the key's lock entry was evicted.
        self._tokens = itertools.count(1)

    async def get(self, key: str) -> Record | None:
        _check_key(key)
        return self._records.get(key, time.monotonic())

    async def compare_and_set(
        self, key: str, expected_version: int, data: bytes, *, fence: int | None = None
    ) -> int | None:
        _check_key(key)
        now = time.monotonic()
        lock = self._locks.get(key, now)
        if fence is not None and lock is not None and lock.token > fence:
            return None
        current = self._records.get(key, now)
        if (current.version if current else 0) != expected_version:
            return None
        record = Record(expected_version + 1, bytes(data))
        self._records.put(key, record, now + self._ttl)
        if lock is not None:
            self._locks.put(key, lock, max(now + self._ttl, lock.held_until))
        return record.version

    async def add_turns(
        self, key: str, added: StoredTurns, keep: int
    ) -> tuple[TurnCounts, Record | None]:
        _check_key(key)
        now = time.monotonic()
        kept = (self._turns.get(key, now) or NO_TURNS).then(added, keep)
        self._turns.put(key, kept, now + self._ttl)
        record = self._records.get(key, now)
        if record is not None:
            self._records.put(key, record, now + self._ttl)
        return kept.counts, record

    async def turns(self, key: str) -> StoredTurns | None:
        _check_key(key)
        return self._turns.get(key, time.monotonic())

    async def delete(self, key: str) -> None:
        _check_key(key)
        self._records.pop(key)
        self._turns.pop(key)
        self._recent.drop(key)

    async def set_listing(self, key: str, listing: Listing) -> None:
        _check_key(key)
        self._recent.put(key, listing)

    async def recent(self) -> list[Listing]:
        return self._recent.recent()

    async def acquire_lock(self, key: str, ttl_seconds: float) -> int | None:
        _check_key(key)
        _check_positive("ttl_seconds", ttl_seconds)
        now = time.monotonic()
        lock = self._locks.get(key, now)
        if lock is not None and lock.held_until > now:
            return None
        lock = _Lock(next(self._tokens), now + ttl_seconds)
        self._locks.put(key, lock, now + max(self._ttl, ttl_seconds))
        return lock.token

    async def release_lock(self, key: str, token: int) -> None:
        _check_key(key)
        now = time.monotonic()
        lock = self._locks.get(key, now)
        if lock is not None and lock.token == token and lock.held_until > now:
            self._locks.put(key, _Lock(token, 0.0), now + self._ttl)

    async def ping(self) -> bool:
        return True

    def originals(self, limits: StoredOriginals) -> Originals:
        return MemoryOriginals(ttl_seconds=self._ttl, limits=limits)

    async def close(self) -> None:
        return None


class RedisStore:
    """Redis (redis-py asyncio): keys `{prefix}:{<key>}:state|lock|fence`, every one with a TTL,
    and the index of recent sessions (`recent`).

    Every error or timeout becomes StoreUnavailable, and opens a backoff during which calls
    fail at once: a dead Redis slows a request down at most once per backoff period. At most
    `max_connections` calls run at once; the others wait for their turn within the timeout.
    """

    def __init__(
        self,
        url: str,
        *,
        ttl_seconds: float,
        key_prefix: str = "cp",
        timeout_seconds: float = 0.5,
        backoff_seconds: float = 1.0,
        max_connections: int = 64,
    ) -> None:
        _check_positive("ttl_seconds", ttl_seconds)
        _check_positive("timeout_seconds", timeout_seconds)
        if not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ValueError("store key prefix must be non-empty and without braces")
        endpoint = parse_store_url(url)
        if endpoint.kind == "memory":
            raise InvalidStoreURL("a Redis store needs a Redis URL")
        self._connected = connect(
            endpoint, timeout_seconds=timeout_seconds, max_connections=max_connections
        )
        self._redis = self._connected.client
        # The cluster client raises when a node's connections are all in use: calls queue here.
        self._slots = asyncio.Semaphore(max_connections)
        self._prefix = key_prefix
        self._ttl_ms = _milliseconds(ttl_seconds)
        self._timeout = timeout_seconds
        self._backoff = backoff_seconds
        self._down_until = 0.0
        self._compare_and_set = self._redis.register_script(scripts.COMPARE_AND_SET)
        self._acquire = self._redis.register_script(scripts.ACQUIRE)
        self._release = self._redis.register_script(scripts.RELEASE)
        self._add_turns = self._redis.register_script(scripts.ADD_TURNS)
        self._recent = RedisRecent(
            self._redis, key_prefix, ttl_seconds, lambda call: self._run(call, backoff=False)
        )

    def _keys(self, key: str) -> tuple[str, str, str]:
        _check_key(key)
        tagged = f"{self._prefix}:{{{key}}}"
        return f"{tagged}:state", f"{tagged}:lock", f"{tagged}:fence"

    async def _run(self, call: Callable[[], Awaitable[T]], *, backoff: bool = True) -> T:
        """`call` within the timeout; a failure fails the next calls fast for a while, unless
        `backoff` is off (the index's own: a shard's node down must not stop the sessions)."""
        now = time.monotonic()
        if now < self._down_until:
            raise StoreUnavailable("session store unavailable (failing fast after an error)")
        try:
            async with asyncio.timeout(self._timeout), self._slots:
                await self._connected.ready()
                return await call()
        except Exception as exc:  # a client's own bug must not fail the request either
            if not backoff:
                raise StoreUnavailable(f"index unavailable ({type(exc).__name__})") from exc
            if self._down_until <= now:
                log.warning(
                    "session store unavailable, failing fast for %.1f s",
                    self._backoff,
                    extra={"error": type(exc).__name__},
                )
            self._down_until = time.monotonic() + self._backoff
            raise StoreUnavailable(f"session store unavailable ({type(exc).__name__})") from exc

    async def get(self, key: str) -> Record | None:
        state, _, _ = self._keys(key)
        found: list[Any] = await self._run(lambda: self._connected.read(state, ("v", "d")))
        return _record(*found)

    async def compare_and_set(
        self, key: str, expected_version: int, data: bytes, *, fence: int | None = None
    ) -> int | None:
        state, _, fence_key = self._keys(key)
        args: list[EncodableT] = [
            expected_version,
            data,
            self._ttl_ms,
            "" if fence is None else fence,
        ]
        version = await self._run(lambda: self._compare_and_set([state, fence_key], args))
        return int(version) or None

    async def add_turns(
        self, key: str, added: StoredTurns, keep: int
    ) -> tuple[TurnCounts, Record | None]:
        state, _, fence_key = self._keys(key)
        counts = added.counts
        args: list[EncodableT] = [added.who, counts.turns, counts.compactions, counts.saved]
        args += [added.lines, keep, self._ttl_ms]
        *found, version, data = await self._run(lambda: self._add_turns([state, fence_key], args))
        return TurnCounts(*map(int, found)), _record(version, data)

    async def turns(self, key: str) -> StoredTurns | None:
        state, _, _ = self._keys(key)
        fields = ("w", "n", "c", "s", "t")
        found: list[Any] = await self._run(lambda: self._connected.read(state, fields))
        who, *counts, lines = found
        if who is None:
            return None
        return StoredTurns(who, TurnCounts(*map(int, counts)), lines.decode())

    async def delete(self, key: str) -> None:
        state, _, _ = self._keys(key)
        await asyncio.gather(self._run(lambda: self._redis.delete(state)), self._recent.drop(key))

    async def set_listing(self, key: str, listing: Listing) -> None:
        _check_key(key)
        await self._recent.put(key, listing)

    async def recent(self) -> list[Listing]:
        return await self._recent.recent()

    async def acquire_lock(self, key: str, ttl_seconds: float) -> int | None:
        _, lock, fence_key = self._keys(key)
        lock_ms = _milliseconds(ttl_seconds)
        args = [lock_ms, max(lock_ms, self._ttl_ms)]
        token = await self._run(lambda: self._acquire([lock, fence_key], args))
        return int(token) or None

    async def release_lock(self, key: str, token: int) -> None:
        _, lock, _ = self._keys(key)
        await self._run(lambda: self._release([lock], [token]))

    async def ping(self) -> bool:
        try:
            await self._run(self._connected.ping)
        except StoreUnavailable:
            return False
        return True

    async def close(self) -> None:
        await self._connected.close()

    def originals(self, limits: StoredOriginals) -> Originals:
        return RedisOriginals(self._redis, self._prefix, self._ttl_ms, self._run, limits)


def _record(version: Any, data: Any) -> Record | None:
    """The record of the `v` and `d` fields as read (bytes, or None when absent)."""
    if version is None or data is None:
        return None
    return Record(int(version), bytes(data))


def _check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise ValueError("store keys are session_key() hashes")


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive")


def _milliseconds(seconds: float) -> int:
    _check_positive("ttl_seconds", seconds)
    return max(1, round(seconds * 1000))
