"""The store's lean read (`proxy.sessions.redis_reads`) against redis-py's own `HMGET`: the same
bytes on the wire, the same answers on each topology (the shared Redis, a Redis Cluster and a
master behind Sentinels, both over TLS, servers of the tests' own), and no answer left behind
for the next read when one is cut off."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import Connection

from proxy.sessions.redis_reads import packed
from proxy.sessions.sessions import session_key
from proxy.sessions.store import Record, RedisStore

REDIS_URL = "redis://127.0.0.1:6379/0"


@given(st.lists(st.text(), max_size=6))
def test_a_command_is_packed_as_redis_py_packs_it(args: list[str]) -> None:
    assert packed("HMGET", *args) == b"".join(Connection().pack_command("HMGET", *args))


@pytest.fixture(
    params=[
        "redis",
        pytest.param("cluster", marks=[pytest.mark.cluster, pytest.mark.tls]),
        pytest.param("sentinel", marks=[pytest.mark.sentinel, pytest.mark.tls]),
    ]
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[RedisStore]:
    url = {
        "redis": lambda: REDIS_URL,
        "cluster": lambda: request.getfixturevalue("tls_cluster").url,
        "sentinel": lambda: request.getfixturevalue("tls_sentinels").url,
    }[request.param]()
    prefix = f"cptest-{secrets.token_hex(6)}"
    store = RedisStore(url, ttl_seconds=60, key_prefix=prefix, timeout_seconds=2)
    yield store
    client = store._redis
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
    for key in keys:  # one at a time: a cluster's keys live on several nodes
        await client.delete(key)
    await store.close()


def new_key() -> str:
    return session_key("tenant", secrets.token_hex(8))


async def test_the_lean_read_answers_as_redis_py_does(store: RedisStore) -> None:
    client: Redis = store._redis  # type: ignore[assignment]
    written, missing = new_key(), new_key()
    data = bytes(range(256)) * 3
    assert await store.compare_and_set(written, 0, data) == 1
    for key in (written, missing):
        state, _, _ = store._keys(key)
        for fields in (("v", "d"), ("w", "n", "c", "s", "t"), ("d", "nothing", "v")):
            assert await store._connected.read(state, fields) == await client.hmget(
                state, list(fields)
            )
    assert await store.get(written) == Record(1, data)
    assert await store.get(missing) is None


async def test_a_read_skips_redis_pys_command_path(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = new_key()
    assert await store.compare_and_set(key, 0, b"plan") == 1
    await store.get(key)  # connected, a cluster's slots read

    async def refused(*args: object, **options: object) -> None:
        raise AssertionError(f"sent through execute_command: {args[0]!r}")

    monkeypatch.setattr(store._redis, "execute_command", refused)
    assert await store.get(key) == Record(1, b"plan")


async def test_reads_at_once_each_get_their_own_answer(store: RedisStore) -> None:
    keys = [new_key() for _ in range(40)]
    for i, key in enumerate(keys):
        assert await store.compare_and_set(key, 0, b"plan %d" % i) == 1
    found = await asyncio.gather(*(store.get(key) for key in keys * 3))
    assert found == [Record(1, b"plan %d" % i) for i in range(len(keys))] * 3


async def test_a_read_cut_off_leaves_no_answer_for_the_next(store: RedisStore) -> None:
    first, second = new_key(), new_key()
    assert await store.compare_and_set(first, 0, b"first") == 1
    assert await store.compare_and_set(second, 0, b"second") == 1
    await store.get(first)  # connected
    for _ in range(20):
        cut = asyncio.create_task(store.get(first))
        await asyncio.sleep(0)  # sent, its answer not read yet
        cut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cut
        assert await store.get(second) == Record(1, b"second")


@pytest.mark.cluster
@pytest.mark.tls
async def test_a_read_sent_to_the_wrong_node_is_redirected(tls_cluster: Any) -> None:
    prefix = f"cptest-{secrets.token_hex(6)}"
    store = RedisStore(tls_cluster.url, ttl_seconds=60, key_prefix=prefix, timeout_seconds=2)
    client: RedisCluster = store._redis  # type: ignore[assignment]
    key = new_key()
    try:
        assert await store.compare_and_set(key, 0, b"plan") == 1
        state, _, _ = store._keys(key)
        slots = client.nodes_manager.slots_cache
        slot = client.keyslot(state)
        owner = slots[slot][0]
        other = next(n for n in client.get_primaries() if n.name != owner.name)
        slots[slot] = [other]  # as after a slot moved: the node answers MOVED
        assert await store.get(key) == Record(1, b"plan")
        assert slots[slot][0].name == owner.name  # redis-py followed the redirection
        await client.delete(state)
    finally:
        await store.close()
