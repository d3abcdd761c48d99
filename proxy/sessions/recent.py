"""The stores' index of recent sessions, which the dashboard lists: a row a session, written
with each write of its turns (`turn_log`), bounded (`MAX_LISTED`, the newest kept) and
expiring with the sessions (a row goes once its session has not been written for the TTL).

A Redis Cluster serves no `SCAN` across its nodes, and one script can only touch the keys of
one slot, while each session has a slot of its own. So the index is `SHARDS` pairs of keys,
each pair under its own hash tag (a Cluster spreads them over its nodes):
`{prefix}:{recent-N}:order`, the sessions by time (a sorted set), and `{prefix}:{recent-N}:rows`,
their rows (a hash). A session's row goes to the shard of its key, best-effort: a row lost or
briefly stale only shows in the list, and a shard's failure never makes the store fail fast.
Sharding keeps one key from taking every session's writes; a list reads the few shards at
once, in one pipeline.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from redis.typing import EncodableT

from proxy.errors import StoreUnavailable
from proxy.sessions.redis_clients import Client
from proxy.sessions.redis_scripts import LIST

log = logging.getLogger("compaction_proxy")

SHARDS = 8
MAX_LISTED = 1024  # rows kept in all


@dataclasses.dataclass(frozen=True)
class Listing:
    """A session's row in the index (bytes the store does not read) and its time, seconds
    since the epoch: the newer of two rows of a session stays."""

    row: bytes
    at: float


def shard(key: str) -> int:
    return zlib.crc32(key.encode()) % SHARDS


class MemoryRecent:
    """The index of one process's store."""

    def __init__(self, ttl_seconds: float, max_listed: int = MAX_LISTED) -> None:
        self._ttl = ttl_seconds
        self._max = max_listed
        self._rows: OrderedDict[str, Listing] = OrderedDict()

    def put(self, key: str, listing: Listing) -> None:
        old = self._rows.get(key)
        if old is not None and old.at > listing.at:
            return
        self._rows[key] = listing
        self._rows.move_to_end(key)
        while len(self._rows) > self._max:
            self._rows.popitem(last=False)

    def drop(self, key: str) -> None:
        self._rows.pop(key, None)

    def recent(self) -> list[Listing]:
        oldest = time.time() - self._ttl
        return newest_first(row for row in self._rows.values() if row.at >= oldest)


class RedisRecent:
    """The index in Redis, reached through the store's own `run` (its timeout, its
    connections), whose failures are `StoreUnavailable`: a write's is only logged."""

    def __init__(
        self,
        client: Client,
        prefix: str,
        ttl_seconds: float,
        run: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl = ttl_seconds
        self._run = run
        self._list = client.register_script(LIST)

    def _shard(self, number: int) -> tuple[str, str]:
        tagged = f"{self._prefix}:{{recent-{number}}}"
        return f"{tagged}:order", f"{tagged}:rows"

    async def put(self, key: str, listing: Listing) -> None:
        keys = self._shard(shard(key))
        ttl_ms = max(1, round(self._ttl * 1000))
        kept = MAX_LISTED // SHARDS
        args: list[EncodableT] = [
            key,
            listing.at,
            listing.row,
            kept,
            ttl_ms,
            listing.at - self._ttl,
        ]
        await self._best_effort(lambda: self._list(keys, args))

    async def drop(self, key: str) -> None:
        order, rows = self._shard(shard(key))

        async def remove() -> None:
            pipe = self._client.pipeline(transaction=False)
            pipe.zrem(order, key)
            pipe.hdel(rows, key)
            await pipe.execute()

        await self._best_effort(remove)

    async def recent(self) -> list[Listing]:
        async def read() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for order, rows in map(self._shard, range(SHARDS)):
                pipe.zrange(order, 0, -1, withscores=True)
                pipe.hgetall(rows)
            return list(await pipe.execute())

        found = await self._run(read)
        oldest = time.time() - self._ttl
        listings = []
        for times, rows in zip(found[::2], found[1::2], strict=True):
            for key, at in times:
                row = rows.get(key)
                if row is not None and at >= oldest:
                    listings.append(Listing(row, at))
        return newest_first(listings)

    async def _best_effort(self, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            await self._run(call)
        except StoreUnavailable as exc:
            log.debug("recent sessions' index not written", extra={"error": str(exc)})


def newest_first(listings: Iterable[Listing]) -> list[Listing]:
    return sorted(listings, key=lambda listing: listing.at, reverse=True)
