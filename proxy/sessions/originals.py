"""The originals of a session's elided tool outputs, kept for the retrieval tool to read back.

Each is kept once under its handle (`policies.retrieval.handle_of`: derived from the content),
with the session's TTL, in insertion order: past `session_bytes` a session's oldest go first,
and in the memory store past `total_bytes` the oldest of any session. A handle that went is
remembered as gone (so that its marker says so, and it is never kept again). Beside them, the
items of the session's last hidden rounds (`put_round`), put back into its later requests. In
Redis a session's originals are the keys `{prefix}:{<key>}:orig`, `:orig:order`, `:orig:gone`
and `:orig:rounds`, the session's hash tag, so one Cluster node holds them with its state.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.typing import EncodableT

from proxy.config import StoredOriginals as StoredOriginals

T = TypeVar("T")
Run = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]

MAX_GONE = 4096  # handles remembered as gone per session (each ~17 bytes)
MAX_ROUNDS = 16  # hidden rounds kept per session, to put back into its later requests
ROUND = "\0"  # before an answer's key: a hidden round among the memory store's entries


@dataclasses.dataclass(frozen=True)
class OriginalsIndex:
    """The handles a session keeps, oldest first, and those that went."""

    kept: tuple[str, ...] = ()
    gone: frozenset[str] = frozenset()
    rounds: tuple[str, ...] = ()  # the keys of the hidden rounds kept (`put_round`)

    @property
    def empty(self) -> bool:
        return not self.kept and not self.gone


@dataclasses.dataclass
class ViewOriginals:
    """One request's kept originals: the session's index as read, those its view adds."""

    index: OriginalsIndex
    new: dict[str, bytes] = dataclasses.field(default_factory=dict)


class Originals(Protocol):
    async def index(self, key: str) -> OriginalsIndex:
        """What the session keeps and lost."""

    async def add(self, key: str, originals: Mapping[str, bytes]) -> None:
        """Keep the originals not kept nor gone yet; the oldest out past the bounds."""

    async def read(self, key: str, handle: str) -> bytes | None:
        """The original under `handle` in this session only; None when it has none."""

    async def put_round(self, key: str, answer: str, items: bytes) -> None:
        """Keep the items of a hidden round before the answer keyed `answer` (the last
        `MAX_ROUNDS` kept)."""

    async def read_round(self, key: str, answer: str) -> bytes | None:
        """The items of the hidden round kept before the answer keyed `answer`."""


class _Session:
    def __init__(self) -> None:
        self.kept: OrderedDict[str, bytes] = OrderedDict()
        self.gone: OrderedDict[str, None] = OrderedDict()
        self.rounds: OrderedDict[str, bytes] = OrderedDict()
        self.bytes = 0
        self.expires_at = 0.0


class MemoryOriginals:
    """One process's originals, bounded per session and in all."""

    def __init__(self, *, ttl_seconds: float, limits: StoredOriginals) -> None:
        self._ttl = ttl_seconds
        self._limits = limits
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently written first
        self._order: OrderedDict[tuple[str, str], int] = OrderedDict()  # every kept, oldest first
        self._bytes = 0

    async def index(self, key: str) -> OriginalsIndex:
        session = self._live(key)
        if session is None:
            return OriginalsIndex()
        return OriginalsIndex(tuple(session.kept), frozenset(session.gone), tuple(session.rounds))

    async def add(self, key: str, originals: Mapping[str, bytes]) -> None:
        session = self._written(key)
        for handle, data in originals.items():
            if handle in session.kept or handle in session.gone:
                continue
            session.kept[handle] = data
            session.bytes += len(data)
            self._order[key, handle] = len(data)
            self._bytes += len(data)
        while session.bytes > self._limits.session_bytes:
            self._evict(key, next(iter(session.kept)))
        while self._bytes > self._limits.total_bytes:
            self._evict(*next(iter(self._order)))

    async def read(self, key: str, handle: str) -> bytes | None:
        session = self._live(key)
        return None if session is None else session.kept.get(handle)

    async def put_round(self, key: str, answer: str, items: bytes) -> None:
        session = self._written(key)
        if answer in session.rounds:
            self._evict(key, ROUND + answer)
        session.rounds[answer] = items
        self._order[key, ROUND + answer] = len(items)  # counted in all, oldest out first
        self._bytes += len(items)
        if len(session.rounds) > MAX_ROUNDS:
            self._evict(key, ROUND + next(iter(session.rounds)))
        while self._bytes > self._limits.total_bytes:
            self._evict(*next(iter(self._order)))

    async def read_round(self, key: str, answer: str) -> bytes | None:
        session = self._live(key)
        return None if session is None else session.rounds.get(answer)

    def _written(self, key: str) -> _Session:
        """The session about to be written, its TTL set again (expired ones out first)."""
        now = time.monotonic()
        self._expire(now)
        session = self._sessions.pop(key, None) or _Session()
        self._sessions[key] = session
        session.expires_at = now + self._ttl
        return session

    def _live(self, key: str) -> _Session | None:
        session = self._sessions.get(key)
        if session is None or session.expires_at <= time.monotonic():
            return None
        return session

    def _evict(self, key: str, handle: str) -> None:
        """Forget an original (remembered as gone) or, `ROUND` and its key, a hidden round."""
        session = self._sessions[key]
        if handle.startswith(ROUND):
            self._bytes -= len(session.rounds.pop(handle[len(ROUND) :]))
            del self._order[key, handle]
            return
        data = session.kept.pop(handle)
        session.bytes -= len(data)
        self._bytes -= len(data)
        del self._order[key, handle]
        session.gone[handle] = None
        if len(session.gone) > MAX_GONE:
            session.gone.popitem(last=False)

    def _expire(self, now: float) -> None:
        while self._sessions:
            key, session = next(iter(self._sessions.items()))
            if session.expires_at > now:
                return
            for entry in [*session.kept, *(ROUND + answer for answer in session.rounds)]:
                self._evict(key, entry)
            del self._sessions[key]


# KEYS: originals, order, gone. ARGV: TTL ms, session bytes, max gone, then handle, data pairs.
# The hash holds each original as `k:<handle>` and the session's total as `n`.
_ADD = """
for i = 4, #ARGV, 2 do
  local field = 'k:' .. ARGV[i]
  if redis.call('HEXISTS', KEYS[1], field) == 0
      and redis.call('SISMEMBER', KEYS[3], ARGV[i]) == 0 then
    redis.call('HSET', KEYS[1], field, ARGV[i + 1])
    redis.call('HINCRBY', KEYS[1], 'n', #ARGV[i + 1])
    redis.call('RPUSH', KEYS[2], ARGV[i])
  end
end
while tonumber(redis.call('HGET', KEYS[1], 'n') or '0') > tonumber(ARGV[2]) do
  local oldest = redis.call('LPOP', KEYS[2])
  if not oldest then break end
  redis.call('HINCRBY', KEYS[1], 'n', -redis.call('HSTRLEN', KEYS[1], 'k:' .. oldest))
  redis.call('HDEL', KEYS[1], 'k:' .. oldest)
  if redis.call('SCARD', KEYS[3]) < tonumber(ARGV[3]) then
    redis.call('SADD', KEYS[3], oldest)
  end
end
for i = 1, 3 do
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return 1
"""

# KEYS: originals, rounds. ARGV: TTL ms, rounds kept, answer key, items. A round is `r:<key>`.
_PUT_ROUND = """
if redis.call('HEXISTS', KEYS[1], 'r:' .. ARGV[3]) == 0 then
  redis.call('RPUSH', KEYS[2], ARGV[3])
end
redis.call('HSET', KEYS[1], 'r:' .. ARGV[3], ARGV[4])
while redis.call('LLEN', KEYS[2]) > tonumber(ARGV[2]) do
  redis.call('HDEL', KEYS[1], 'r:' .. redis.call('LPOP', KEYS[2]))
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
"""

# KEYS: order, gone, rounds.
_INDEX = """
return {redis.call('LRANGE', KEYS[1], 0, -1), redis.call('SMEMBERS', KEYS[2]),
        redis.call('LRANGE', KEYS[3], 0, -1)}
"""


class RedisOriginals:
    """Originals in the session store's Redis, through its calls (`RedisStore.call`)."""

    def __init__(
        self,
        redis: Redis | RedisCluster,
        prefix: str,
        ttl_ms: int,
        run: Run,
        limits: StoredOriginals,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._ttl_ms = ttl_ms
        self._run = run
        self._limits = limits
        self._add = redis.register_script(_ADD)
        self._index = redis.register_script(_INDEX)
        self._put_round = redis.register_script(_PUT_ROUND)

    def _keys(self, key: str) -> tuple[str, str, str]:
        base = f"{self._prefix}:{{{key}}}:orig"
        return base, f"{base}:order", f"{base}:gone"

    async def index(self, key: str) -> OriginalsIndex:
        data, order, gone = self._keys(key)
        keys = [order, gone, f"{data}:rounds"]
        kept, lost, rounds = await self._run(lambda: self._index(keys, []))
        return OriginalsIndex(
            tuple(h.decode() for h in kept),
            frozenset(h.decode() for h in lost),
            tuple(r.decode() for r in rounds),
        )

    async def add(self, key: str, originals: Mapping[str, bytes]) -> None:
        if not originals:
            return
        args: list[EncodableT] = [self._ttl_ms, self._limits.session_bytes, MAX_GONE]
        for handle, data in originals.items():
            args += [handle, data]
        await self._run(lambda: self._add(list(self._keys(key)), args))

    async def read(self, key: str, handle: str) -> bytes | None:
        return await self._field(key, f"k:{handle}")

    async def put_round(self, key: str, answer: str, items: bytes) -> None:
        data, _, _ = self._keys(key)
        args: list[EncodableT] = [self._ttl_ms, MAX_ROUNDS, answer, items]
        await self._run(lambda: self._put_round([data, f"{data}:rounds"], args))

    async def read_round(self, key: str, answer: str) -> bytes | None:
        return await self._field(key, f"r:{answer}")

    async def _field(self, key: str, field: str) -> bytes | None:
        data, _, _ = self._keys(key)
        found = await self._run(lambda: self._redis.hget(data, field))
        return None if found is None else bytes(found)
