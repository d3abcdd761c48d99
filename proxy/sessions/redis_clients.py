"""The redis-py asyncio client for each Redis topology a store URL names
(`proxy.config.store_url`): one server, a Redis Cluster, or the master a set of Sentinels
points at. The session store (`proxy.store.RedisStore`) works through any of them alike.

The store's backoff decides when to try a failed server again, so a dead server slows a
request down at most once per backoff period; the clients themselves do not retry, except the
cluster client, which must follow the cluster's topology: after a connection error it reads
the topology again and retries (within the store's timeout). Without that, the calls that
arrive while it reads the topology fail with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import ConnectionPool, Redis, RedisCluster, SSLConnection
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import Connection, RedisSSLContext
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelManagedSSLConnection
from redis.backoff import NoBackoff

from proxy.config.store_url import StoreURL
from proxy.sessions.redis_reads import ClusterReads, PooledReads, Read

Client = Redis | RedisCluster
CLUSTER_RETRIES = 2


async def _no_wait() -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Connected:
    """A client, its lean `HMGET` (`redis_reads`), what to await before a command, how to
    tell that every server it needs answers, and how to close it."""

    client: Client
    read: Read
    ping: Callable[[], Awaitable[Any]]
    close: Callable[[], Awaitable[None]]
    ready: Callable[[], Awaitable[None]] = _no_wait


def connect(url: StoreURL, *, timeout_seconds: float, max_connections: int) -> Connected:
    """The client for `url` (a Redis kind); connections are made on first use."""
    options: dict[str, Any] = {
        # No socket timeout: the store times every call itself (`RedisStore._run`), and with
        # one, redis-py sends each command through `asyncio.wait_for`, which on Python 3.11
        # is a task of its own and a turn of the event loop before the command leaves.
        "socket_timeout": None,
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
        connection_class=_sharing_context(SSLConnection) if url.tls else Connection,
        **options,
        **{name: value for name, value in tls.items() if name != "ssl"},
    )
    client = Redis.from_pool(pool)
    return Connected(client, PooledReads(pool).hmget, client.ping, client.aclose)


def _cluster(url: StoreURL, options: dict[str, Any], max_connections: int) -> Connected:
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in url.nodes],
        # Slots whose master is down do not stop the others from being served.
        require_full_coverage=False,
        max_connections=max_connections,  # per node
        **options | {"retry": Retry(NoBackoff(), CLUSTER_RETRIES)},
    )
    if url.tls:
        # The cluster client takes no connection class: set it where its nodes are made from.
        shared = _sharing_context(SSLConnection)
        client.nodes_manager.connection_kwargs["connection_class"] = shared
        for node in client.nodes_manager.startup_nodes.values():
            node.connection_class = shared

    async def ping() -> Any:
        return await client.ping(target_nodes=RedisCluster.PRIMARIES)

    # Before it knows the slots, the client sends a command to any node and follows its MOVED
    # answer; many at once make it read the topology again and again, and drop connections
    # that others are using. So the first command waits for the slots to be read, once.
    started = asyncio.Event()
    starting = asyncio.Lock()

    async def ready() -> None:
        if started.is_set():
            return
        async with starting:
            if not started.is_set():
                await client.initialize()
                started.set()

    return Connected(client, ClusterReads(client).hmget, ping, client.aclose, ready)


def _sentinel(
    url: StoreURL, options: dict[str, Any], tls: dict[str, Any], max_connections: int
) -> Connected:
    # The Sentinels take the same timeouts and TLS, and the credentials only when asked to:
    # most deployments do not protect them.
    own = {k: v for k, v in options.items() if url.sentinel_auth or k not in _CREDENTIALS}
    sentinel = Sentinel(url.nodes, sentinel_kwargs=own | tls, **options, **tls)  # type: ignore[no-untyped-call]
    if url.tls:
        tls = {"connection_class": _sharing_context(SentinelManagedSSLConnection)}
        # The Sentinels' own clients take no connection class either: each new connection to
        # the master asks a Sentinel for its address.
        shared = _sharing_context(SSLConnection)
        for own_client in sentinel.sentinels:
            own_client.connection_pool.connection_class = shared
    client = sentinel.master_for(url.master, db=url.db, max_connections=max_connections, **tls)

    async def close() -> None:
        await client.aclose()
        await sentinel.aclose()

    return Connected(client, PooledReads(client.connection_pool).hmget, client.ping, close)


_CREDENTIALS = ("username", "password")


def _sharing_context(base: type[SSLConnection]) -> type[SSLConnection]:
    """`base` whose connections share one SSL context (one class per client). redis-py makes
    a context per connection, and each loads the system's CA store: ~60 ms of CPU, which a
    burst of new connections would spend on the event loop."""
    shared: list[RedisSSLContext] = []

    class SharingContext(base):  # type: ignore[valid-type,misc]
        ssl_context: RedisSSLContext

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            if not shared:
                shared.append(self.ssl_context)
            self.ssl_context = shared[0]

    return SharingContext
