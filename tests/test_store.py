"""The session store contract, run against MemoryStore and RedisStore on the real local Redis,
on a Redis Cluster and behind Sentinels (both over TLS, servers of the tests' own).

Tests on the shared Redis use their own key prefix and delete only their keys; the tests that
stop Redis or need a silent one start their own server on a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
import traceback
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from proxy.errors import StoreUnavailable
from proxy.sessions import recent
from proxy.sessions.recent import Listing
from proxy.sessions.sessions import session_key
from proxy.sessions.store import MemoryStore, Record, RedisStore, SessionStore, open_store
from proxy.sessions.turns import StoredTurns, TurnCounts
from tests.conftest import examples
from tests.redis_servers import free_port, redis_server

REDIS_URL = "redis://127.0.0.1:6379/0"
SECRET = "hunter2-do-not-print"

MakeStore = Callable[..., SessionStore]


@pytest.fixture
def prefix() -> str:
    return f"cptest-{secrets.token_hex(6)}"


@pytest.fixture
async def redis(prefix: str) -> AsyncIterator[Redis]:
    """A plain client on the shared Redis, to look at what the store wrote; deletes it after."""
    client = Redis.from_url(REDIS_URL)
    yield client
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture(
    params=[
        "memory",
        "redis",
        pytest.param("cluster", marks=[pytest.mark.cluster, pytest.mark.tls]),
        pytest.param("sentinel", marks=[pytest.mark.sentinel, pytest.mark.tls]),
    ]
)
async def make_store(
    request: pytest.FixtureRequest, prefix: str, redis: Redis
) -> AsyncIterator[MakeStore]:
    made: list[SessionStore] = []
    url = {
        "redis": lambda: REDIS_URL,
        "cluster": lambda: request.getfixturevalue("tls_cluster").url,
        "sentinel": lambda: request.getfixturevalue("tls_sentinels").url,
    }.get(request.param, lambda: "memory://")()

    def make(ttl_seconds: float = 60) -> SessionStore:
        store: SessionStore
        if request.param == "memory":
            store = MemoryStore(ttl_seconds=ttl_seconds)
        else:
            # A generous timeout: these tests are about semantics, on a possibly busy machine.
            store = RedisStore(url, ttl_seconds=ttl_seconds, key_prefix=prefix, timeout_seconds=2)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture
def store(make_store: MakeStore) -> SessionStore:
    return make_store()


def new_key() -> str:
    return session_key("tenant", secrets.token_hex(8))


# -- session_key ---------------------------------------------------------------------------


def test_session_key_is_a_short_stable_hash() -> None:
    key = session_key("tenant-a", "conversation {1}")
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert key == session_key("tenant-a", "conversation {1}")
    assert "tenant" not in key


@given(st.text(max_size=12), st.text(max_size=12), st.text(max_size=12), st.text(max_size=12))
def test_session_key_is_unambiguous(t1: str, s1: str, t2: str, s2: str) -> None:
    assert (session_key(t1, s1) == session_key(t2, s2)) == ((t1, s1) == (t2, s2))


@given(st.text(max_size=24), st.integers(0, 24), st.integers(0, 24))
def test_moving_the_boundary_changes_the_key(joined: str, i: int, j: int) -> None:
    """Tenant + session that concatenate to the same text still address different state."""
    i, j = min(i, len(joined)), min(j, len(joined))
    same = session_key(joined[:i], joined[i:]) == session_key(joined[:j], joined[j:])
    assert same == (i == j)


def test_session_key_accepts_any_string() -> None:
    assert session_key("\ud800", "\x00") != session_key("\ud801", "\x00")


# -- the contract, on both stores ----------------------------------------------------------


async def test_compare_and_set_versions(store: SessionStore) -> None:
    key = new_key()
    assert await store.get(key) is None
    assert await store.compare_and_set(key, 1, b"no record yet") is None
    assert await store.compare_and_set(key, 0, b"first") == 1
    assert await store.get(key) == Record(1, b"first")
    assert await store.compare_and_set(key, 0, b"again") is None
    assert await store.compare_and_set(key, 1, b"second") == 2
    assert await store.compare_and_set(key, 1, b"stale") is None
    assert await store.compare_and_set(key, 3, b"ahead") is None
    assert await store.get(key) == Record(2, b"second")


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.one_of(st.none(), st.integers(0, 4)), st.binary(max_size=64)),
            st.just("delete"),
        ),
        max_size=15,
    )
)
async def test_store_behaves_like_a_versioned_cell(
    store: SessionStore, ops: list[tuple[int | None, bytes] | str]
) -> None:
    """Random writes (at the current version or a guessed one) and deletes, against a model."""
    key = new_key()
    model: Record | None = None
    for op in ops:
        if op == "delete":
            await store.delete(key)
            model = None
        else:
            assert isinstance(op, tuple)
            guess, data = op
            current = model.version if model else 0
            expected = current if guess is None else guess
            written = await store.compare_and_set(key, expected, data)
            if expected == current:
                assert written == current + 1
                model = Record(current + 1, data)
            else:
                assert written is None
        assert await store.get(key) == model
    await store.delete(key)


async def test_no_lost_update_under_concurrent_writers(store: SessionStore) -> None:
    key = new_key()

    async def increment() -> int:
        for conflicts in range(200):
            record = await store.get(key)
            count = int(record.data) if record else 0
            await asyncio.sleep(0)  # let the others read the same version
            version = record.version if record else 0
            if await store.compare_and_set(key, version, b"%d" % (count + 1)) is not None:
                return conflicts
        raise AssertionError("no progress after 200 attempts")

    conflicts = await asyncio.gather(*(increment() for _ in range(50)))
    assert await store.get(key) == Record(50, b"50")
    assert sum(conflicts) > 0, "the writers never raced: the test proved nothing"


async def test_records_expire_and_every_write_renews_the_ttl(make_store: MakeStore) -> None:
    store = make_store(ttl_seconds=0.5)
    key = new_key()
    assert await store.compare_and_set(key, 0, b"a") == 1
    await asyncio.sleep(0.3)
    assert await store.compare_and_set(key, 1, b"b") == 2
    await asyncio.sleep(0.3)
    assert await store.get(key) == Record(2, b"b")  # 0.6 s after the first write
    await asyncio.sleep(0.6)
    assert await store.get(key) is None
    assert await store.compare_and_set(key, 0, b"fresh") == 1


async def test_delete(store: SessionStore) -> None:
    key, other = new_key(), new_key()
    await store.delete(key)  # nothing there: no error
    assert await store.compare_and_set(key, 0, b"x") == 1
    assert await store.compare_and_set(other, 0, b"y") == 1
    await store.delete(key)
    assert await store.get(key) is None
    assert await store.get(other) == Record(1, b"y")
    assert await store.compare_and_set(key, 1, b"gone") is None
    assert await store.compare_and_set(key, 0, b"again") == 1


async def test_lock_is_exclusive_and_released_only_by_its_holder(store: SessionStore) -> None:
    key, other = new_key(), new_key()
    first = await store.acquire_lock(key, 5)
    assert first is not None
    assert await store.acquire_lock(key, 5) is None
    assert await store.acquire_lock(other, 5) is not None
    await store.release_lock(key, first + 1)  # not the holder's token: no effect
    assert await store.acquire_lock(key, 5) is None
    await store.release_lock(key, first)
    second = await store.acquire_lock(key, 5)
    assert second is not None
    assert second > first


async def test_lock_expires_by_itself(store: SessionStore) -> None:
    key = new_key()
    first = await store.acquire_lock(key, 0.1)
    assert first is not None
    assert await store.acquire_lock(key, 0.1) is None
    await asyncio.sleep(0.2)
    second = await store.acquire_lock(key, 5)
    assert second is not None
    assert second > first
    await store.release_lock(key, first)  # the expired holder cannot free the new one's lock
    assert await store.acquire_lock(key, 5) is None


async def test_a_stale_fence_cannot_write(store: SessionStore) -> None:
    key = new_key()
    assert await store.compare_and_set(key, 0, b"before any lock", fence=7) == 1
    stale = await store.acquire_lock(key, 0.1)
    assert stale is not None
    await asyncio.sleep(0.2)  # the summarizer holding `stale` took too long
    fresh = await store.acquire_lock(key, 5)
    assert fresh is not None
    assert await store.compare_and_set(key, 1, b"stale summary", fence=stale) is None
    assert await store.compare_and_set(key, 1, b"fresh summary", fence=fresh) == 2
    await store.release_lock(key, fresh)
    assert await store.compare_and_set(key, 2, b"after release", fence=fresh) == 3
    await store.delete(key)  # a reset does not unfence an old holder
    assert await store.compare_and_set(key, 0, b"stale again", fence=stale) is None
    assert await store.get(key) is None
    assert await store.compare_and_set(key, 0, b"unfenced") == 1


async def test_tokens_strictly_increase(store: SessionStore) -> None:
    key = new_key()
    tokens = []
    for _ in range(5):
        token = await store.acquire_lock(key, 5)
        assert token is not None
        tokens.append(token)
        await store.release_lock(key, token)
    assert tokens == sorted(set(tokens))


async def test_tenants_are_isolated(store: SessionStore) -> None:
    alice, mallory = session_key("alice", "chat-1"), session_key("mallory", "chat-1")
    assert alice != mallory
    assert await store.compare_and_set(alice, 0, b"alice's plan") == 1
    assert await store.get(mallory) is None
    assert await store.compare_and_set(mallory, 0, b"mallory's plan") == 1
    await store.delete(mallory)
    assert await store.acquire_lock(mallory, 5) is not None
    assert await store.get(alice) == Record(1, b"alice's plan")
    assert await store.acquire_lock(alice, 5) is not None


@pytest.mark.parametrize(
    "bad", ["", "chat-1", "{abc}", "A" * 32, "0" * 31, "0" * 33, "0" * 31 + "}"]
)
async def test_only_session_keys_are_accepted(store: SessionStore, bad: str) -> None:
    with pytest.raises(ValueError, match="session_key"):
        await store.get(bad)
    with pytest.raises(ValueError, match="session_key"):
        await store.compare_and_set(bad, 0, b"x")
    with pytest.raises(ValueError, match="session_key"):
        await store.acquire_lock(bad, 1)


async def test_ping(store: SessionStore) -> None:
    assert await store.ping() is True


# -- a session's turns ------------------------------------------------------------------------


def added(lines: str, who: bytes = b"w", turns: int = 1) -> StoredTurns:
    return StoredTurns(who, TurnCounts(turns, turns // 2, 10 * turns), lines)


async def test_turns_are_added_beside_the_state_and_never_change_it(store: SessionStore) -> None:
    key = new_key()
    assert await store.turns(key) is None
    assert await store.add_turns(key, added("a"), keep=3) == (TurnCounts(1, 0, 10), None)
    assert await store.get(key) is None  # what a request reads: still nothing
    assert await store.compare_and_set(key, 0, b"plan") == 1
    counts, record = await store.add_turns(key, added("b\nc\nd", b"w2", turns=3), keep=3)
    assert (counts, record) == (TurnCounts(4, 1, 40), Record(1, b"plan"))
    assert await store.turns(key) == StoredTurns(b"w2", TurnCounts(4, 1, 40), "b\nc\nd")
    assert await store.compare_and_set(key, 1, b"plan 2") == 2  # the version stayed
    assert (await store.turns(key)).counts.turns == 4  # type: ignore[union-attr]
    await store.delete(key)
    assert await store.turns(key) is None and await store.get(key) is None


async def test_adding_turns_renews_the_ttl_of_the_record(make_store: MakeStore) -> None:
    store = make_store(ttl_seconds=0.5)
    key = new_key()
    assert await store.compare_and_set(key, 0, b"plan") == 1
    await asyncio.sleep(0.3)
    await store.add_turns(key, added("a"), keep=3)
    await asyncio.sleep(0.3)
    assert await store.get(key) == Record(1, b"plan")  # 0.6 s after its write
    await asyncio.sleep(0.6)
    assert await store.get(key) is None and await store.turns(key) is None


# -- the index of recent sessions ------------------------------------------------------------


def listed(key: str, at: float) -> Listing:
    return Listing(f"row of {key} at {at}".encode(), at)


async def test_sessions_are_listed_newest_first(store: SessionStore) -> None:
    now = time.time()
    keys = [new_key() for _ in range(3)]
    assert await store.recent() == []
    for i, key in enumerate(keys):
        await store.set_listing(key, listed(key, now + i))
    assert await store.recent() == [listed(k, now + i) for i, k in reversed(list(enumerate(keys)))]
    # A later row of the oldest puts it first; a row older than the one listed is not kept.
    await store.set_listing(keys[0], listed(keys[0], now + 5))
    await store.set_listing(keys[1], listed(keys[1], now - 5))
    assert await store.recent() == [
        listed(keys[0], now + 5),
        listed(keys[2], now + 2),
        listed(keys[1], now + 1),
    ]


async def test_a_deleted_session_is_unlisted(store: SessionStore) -> None:
    key, other = new_key(), new_key()
    now = time.time()
    await store.set_listing(key, listed(key, now))
    await store.set_listing(other, listed(other, now))
    await store.delete(key)
    assert await store.recent() == [listed(other, now)]


async def test_the_index_keeps_the_newest_rows(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recent, "MAX_LISTED", 2 * recent.SHARDS)
    store = make_store()
    now = time.time()
    written = []
    for i in range(6 * recent.SHARDS):
        key = new_key()
        written.append(listed(key, now + i))
        await store.set_listing(key, written[-1])
    rows = await store.recent()
    # Redis keeps the newest of each shard: the newest two of all are kept whatever the shards.
    assert len(rows) <= 2 * recent.SHARDS
    assert rows[:2] == written[:-3:-1]


async def test_rows_expire_with_their_sessions(make_store: MakeStore) -> None:
    # A TTL long enough that the fresh row is still listed on a loaded machine (a Cluster's
    # calls, a test beside others) when it is read at once.
    store = make_store(ttl_seconds=2)
    key, old = new_key(), new_key()
    now = time.time()
    await store.set_listing(old, listed(old, now - 2.1))
    await store.set_listing(key, listed(key, now))
    assert await store.recent() == [listed(key, now)]
    await asyncio.sleep(max(0.0, now + 2.1 - time.time()))
    assert await store.recent() == []


# -- Redis specifics -----------------------------------------------------------------------


async def test_every_redis_key_has_a_ttl_and_the_session_hash_tag(
    prefix: str, redis: Redis
) -> None:
    store = RedisStore(REDIS_URL, ttl_seconds=100, key_prefix=prefix)
    keys = [session_key("tenant", f"session {i}") for i in range(3)]
    tokens = []
    try:
        for key in keys:
            assert await store.compare_and_set(key, 0, b"plan") == 1
            token = await store.acquire_lock(key, 7)
            assert token is not None
            tokens.append(token)
            assert await store.compare_and_set(key, 1, b"summary", fence=token) == 2
        await store.release_lock(keys[1], tokens[1])
        await store.delete(keys[2])
    finally:
        await store.close()
    shape = re.compile(rf"{prefix}:\{{([0-9a-f]{{32}})\}}:(state|lock|fence)")
    written: dict[str, set[str]] = {}
    async for raw in redis.scan_iter(match=f"{prefix}:*"):
        name = raw.decode()
        match = shape.fullmatch(name)
        assert match, name
        written.setdefault(match[1], set()).add(match[2])
        ttl_ms = await redis.pttl(name)
        limit = 7_000 if match[2] == "lock" else 100_000
        assert limit - 2_000 < ttl_ms <= limit, (name, ttl_ms)
    assert written == {
        keys[0]: {"state", "lock", "fence"},
        keys[1]: {"state", "fence"},
        keys[2]: {"lock", "fence"},
    }


async def test_the_index_is_a_few_keys_each_under_its_own_hash_tag_with_a_ttl(
    prefix: str, redis: Redis
) -> None:
    store = RedisStore(REDIS_URL, ttl_seconds=100, key_prefix=prefix)
    try:
        for i in range(4 * recent.SHARDS):
            key = new_key()
            await store.set_listing(key, listed(key, i))
    finally:
        await store.close()
    names = [raw.decode() async for raw in redis.scan_iter(match=f"{prefix}:{{recent-*")]
    shape = re.compile(rf"{prefix}:\{{recent-([0-9]+)\}}:(order|rows)")
    assert {shape.fullmatch(name)[2] for name in names} == {"order", "rows"}  # type: ignore[index]
    assert len(names) <= 2 * recent.SHARDS
    assert len({shape.fullmatch(name)[1] for name in names}) > 1  # type: ignore[index]
    for name in names:
        assert 98_000 < await redis.pttl(name) <= 100_000


async def test_a_broken_index_fails_no_write_of_a_session(prefix: str, redis: Redis) -> None:
    """The index is best-effort: its keys unusable (here of the wrong type), a row is not
    written, and the store does not fail fast afterwards as it does when Redis fails."""
    store = RedisStore(REDIS_URL, ttl_seconds=100, key_prefix=prefix)
    try:
        for n in range(recent.SHARDS):
            await redis.set(f"{prefix}:{{recent-{n}}}:order", "not a sorted set")
        key = new_key()
        await store.set_listing(key, listed(key, 1.0))
        assert await store.compare_and_set(key, 0, b"x") == 1
        assert await store.get(key) == Record(1, b"x")
        await store.delete(key)
        assert await store.get(key) is None
    finally:
        await store.close()


async def test_the_fence_outlives_a_short_state_ttl(prefix: str, redis: Redis) -> None:
    """A lock longer than the session TTL keeps its fence as long, writes or not."""
    store = RedisStore(REDIS_URL, ttl_seconds=1, key_prefix=prefix)
    key = new_key()
    try:
        token = await store.acquire_lock(key, 30)
        assert token is not None
        assert await store.compare_and_set(key, 0, b"summary", fence=token) == 1
    finally:
        await store.close()
    assert 28_000 < await redis.pttl(f"{prefix}:{{{key}}}:fence") <= 30_000


@pytest.mark.parametrize(
    "url",
    [
        "",
        "localhost:6379",
        "http://localhost:6379",
        "memcached://localhost",
        "memory://elsewhere",
        f"redis://:{SECRET}@localhost:notaport/0",
        f"redis://:{SECRET}@localhost:6379/notadb",
        f"unix://:{SECRET}@/tmp/redis.sock",
    ],
)
def test_open_store_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match=r"store\.url") as caught:
        open_store(url, ttl_seconds=60)
    assert SECRET not in "".join(traceback.format_exception(caught.value))


def test_open_store_checks_its_settings() -> None:
    with pytest.raises(ValueError, match="ttl_seconds"):
        open_store("memory://", ttl_seconds=0)
    with pytest.raises(ValueError, match="ttl_seconds"):
        open_store(REDIS_URL, ttl_seconds=-1)
    with pytest.raises(ValueError, match="prefix"):
        open_store(REDIS_URL, ttl_seconds=60, key_prefix="cp{x}")


async def test_memory_store_evicts_the_least_recently_used() -> None:
    store = MemoryStore(ttl_seconds=60, max_sessions=3)
    keys = [new_key() for _ in range(4)]
    for key in keys[:3]:
        assert await store.compare_and_set(key, 0, b"x") == 1
    assert await store.get(keys[0]) is not None  # now the most recently used
    assert await store.compare_and_set(keys[3], 0, b"x") == 1
    assert [await store.get(key) is not None for key in keys] == [True, False, True, True]


# -- Redis down ----------------------------------------------------------------------------


async def expect_unavailable(store: SessionStore, key: str) -> float:
    """Every operation raises StoreUnavailable; returns the slowest one's duration."""
    calls = [
        lambda: store.get(key),
        lambda: store.compare_and_set(key, 0, b"x"),
        lambda: store.delete(key),
        lambda: store.acquire_lock(key, 1),
        lambda: store.release_lock(key, 1),
    ]
    slowest = 0.0
    for call in calls:
        started = time.perf_counter()
        with pytest.raises(StoreUnavailable) as caught:
            await call()
        slowest = max(slowest, time.perf_counter() - started)
        assert SECRET not in "".join(traceback.format_exception(caught.value))
    return slowest


async def test_unreachable_redis(caplog: pytest.LogCaptureFixture) -> None:
    store = RedisStore(
        f"redis://:{SECRET}@127.0.0.1:{free_port()}/0", ttl_seconds=60, timeout_seconds=0.5
    )
    try:
        assert await expect_unavailable(store, new_key()) < 0.4
        assert await store.ping() is False
    finally:
        await store.close()
    assert "unavailable" in caplog.text
    assert SECRET not in caplog.text


async def test_a_read_sends_its_command_without_a_task_of_its_own(store: SessionStore) -> None:
    """On a replayed turn the store's read is the only call before the request is forwarded:
    redis-py with a socket timeout sends through `asyncio.wait_for`, on Python 3.11 a task
    and a turn of the event loop more per command (the store times its calls itself)."""
    key = new_key()
    await store.get(key)  # connected, a cluster's slots read
    loop = asyncio.get_running_loop()
    made: list[str] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **options: Any) -> asyncio.Task[Any]:
        made.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **options)

    loop.set_task_factory(counting)
    try:
        assert await store.get(key) is None
        assert await store.compare_and_set(key, 0, b"plan") == 1
    finally:
        loop.set_task_factory(factory)
    # (The cluster client runs each command as a task of its own: its choice, not a timeout's.)
    assert [name for name in made if "send" in name] == []


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """Accepts connections and never answers: a hung Redis."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def test_a_hung_redis_slows_a_request_once_per_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with silent_server() as port:
        store = RedisStore(
            f"redis://:{SECRET}@127.0.0.1:{port}/0",
            ttl_seconds=60,
            timeout_seconds=0.2,
            backoff_seconds=0.6,
        )
        key = new_key()
        try:
            started = time.perf_counter()
            with pytest.raises(StoreUnavailable):
                await store.get(key)
            assert 0.15 < time.perf_counter() - started < 0.5  # the timeout, and no retries
            assert await expect_unavailable(store, key) < 0.02  # failing fast in the backoff
            assert await store.ping() is False
            await asyncio.sleep(0.6)
            started = time.perf_counter()
            with pytest.raises(StoreUnavailable):
                await store.get(key)
            assert 0.15 < time.perf_counter() - started < 0.5  # tried again after the backoff
        finally:
            await store.close()
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 2  # once per failure, not once per fast-failed call
    assert SECRET not in caplog.text


async def test_redis_stopped_mid_run_then_back() -> None:
    port = free_port()
    store = RedisStore(
        f"redis://127.0.0.1:{port}/0", ttl_seconds=60, timeout_seconds=0.3, backoff_seconds=0.3
    )
    key = new_key()
    try:
        with redis_server(port):
            assert await store.compare_and_set(key, 0, b"plan") == 1
            assert await store.acquire_lock(key, 5) is not None
            assert await store.ping() is True
        with pytest.raises(StoreUnavailable):
            await store.get(key)
        assert await expect_unavailable(store, key) < 0.02
        with redis_server(port):
            await asyncio.sleep(0.35)
            assert await store.ping() is True
            assert await store.get(key) is None  # a new, empty server
            # Its script cache is empty too: EVALSHA falls back to loading the scripts.
            assert await store.compare_and_set(key, 0, b"plan") == 1
            assert await store.acquire_lock(key, 5) is not None
    finally:
        await store.close()
