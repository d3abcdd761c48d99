"""The redis-py asyncio client for each Redis topology a store URL names
(`proxy.config.store_url`): one server, a Redis Cluster, or the master a set of Sentinels
points at. The session store (`proxy.store.RedisStore`) works through any of them alike.

None of them retries on its own: the store's backoff decides when to try again, so a dead
server slows a request down at most once per backoff period.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import ConnectionPool, Redis, RedisCluster, SSLConnection
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from .config.store_url import StoreURL

Client = Redis | RedisCluster


@dataclasses.dataclass(frozen=True)
class Connected:
    """A client, how to tell that every server it needs answers, and how to close it."""

    client: Client
    ping: Callable[[], Awaitable[Any]]
    close: Callable[[], Awaitable[None]]


def connect(url: StoreURL, *, timeout_seconds: float, max_connections: int) -> Connected:
    """The client for `url` (a Redis kind); connections are made on first use."""
    options: dict[str, Any] = {
        "socket_timeout": timeout_seconds,
        "socket_connect_timeout": timeout_seconds,
        "username": url.username,
        "password": url.password,
        "retry": Retry(NoBackoff(), 0),
    }
    tls = url.tls.options() if url.tls else {}
    if url.kind == "cluster":
        return _cluster(url, options | tls, max_connections)
    if url.kind == "sentinel":
        return _sentinel(url, options, tls, max_connections)
    (host, port), *_ = url.nodes
    pool = ConnectionPool(
        host=host,
        port=port,
        db=url.db,
        max_connections=max_connections,
        connection_class=SSLConnection if url.tls else Connection,
        **options,
        **{name: value for name, value in tls.items() if name != "ssl"},
    )
    client = Redis.from_pool(pool)
    return Connected(client, client.ping, client.aclose)


def _cluster(url: StoreURL, options: dict[str, Any], max_connections: int) -> Connected:
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in url.nodes],
        # Slots whose master is down do not stop the others from being served.
        require_full_coverage=False,
        max_connections=max_connections,  # per node
        **options,
    )

    async def ping() -> Any:
        return await client.ping(target_nodes=RedisCluster.PRIMARIES)

    return Connected(client, ping, client.aclose)


def _sentinel(
    url: StoreURL, options: dict[str, Any], tls: dict[str, Any], max_connections: int
) -> Connected:
    # The Sentinels take the same timeouts and TLS, and the credentials only when asked to:
    # most deployments do not protect them.
    own = {k: v for k, v in options.items() if url.sentinel_auth or k not in _CREDENTIALS}
    sentinel = Sentinel(url.nodes, sentinel_kwargs=own | tls, **options, **tls)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(url.master, db=url.db, max_connections=max_connections)

    async def close() -> None:
        await client.aclose()
        await sentinel.aclose()

    return Connected(client, client.ping, close)


_CREDENTIALS = ("username", "password")
