"""The session store's hot read, `HMGET`, sent without redis-py's per-command path.

A replayed turn makes one store call before it is forwarded: the read of the session's
record. Through `execute_command` that read also takes the pool's lock twice, awaits its
observability hooks and event dispatch, and wraps the command in a retry: ~0.15-0.2 ms more
than the command's own send and read when run after a pause, as a request's read is
(bench/README.md, `## Stores`). Here the command goes out on one of redis-py's own
connections (the same class, address, credentials and TLS), so the wire protocol, the parser
and its errors stay redis-py's; only the bookkeeping around them goes.

The failures stay what they were: the connection comes from the client's pool and goes back
to it, checked as the pool checks it; one that failed or was cut mid-command is disconnected
(it connects again when next used); the store's timeout (`RedisStore._run`) bounds it all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import ConnectionPool, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection

Read = Callable[[str, Sequence[str]], Awaitable[list[Any]]]


def packed(*args: str) -> bytes:
    """The command in the Redis protocol, as redis-py packs it (`Connection.pack_command`)."""
    encoded = [arg.encode() for arg in args]
    return b"*%d\r\n" % len(encoded) + b"".join(
        b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in encoded
    )


async def _send_and_read(connection: AbstractConnection, command: bytes) -> Any:
    # Both disconnect on any error, a cancellation too: no answer is left unread for the
    # connection's next command.
    await connection.send_packed_command(command, check_health=False)
    return await connection.read_response()


class PooledReads:
    """`HMGET` on a connection of `pool` (one server's, or the master's behind Sentinels),
    taken and given back as `pool.get_connection` and `pool.release` do, less their lock (the
    event loop runs one coroutine at a time; no await comes between a look at the lists and
    their change) and their observability hooks (not set up here)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    async def hmget(self, key: str, fields: Sequence[str]) -> list[Any]:
        pool = self._pool
        connection = pool.get_available_connection()  # type: ignore[no-untyped-call]
        try:
            # Connected, and replaced when the server closed it (a Sentinel's asks for the
            # master's address: a master that changed drops the pool's idle connections).
            await pool.ensure_connection(connection)
            found: list[Any] = await _send_and_read(connection, packed("HMGET", key, *fields))
            return found
        finally:
            pool._in_use_connections.remove(connection)
            if connection.should_reconnect():
                await connection.disconnect()
            pool._available_connections.append(connection)


class ClusterReads:
    """`HMGET` on a pooled connection of the node that serves the key's slot. Anything but the
    answer (a redirection, a slot not covered, a node down) is left to redis-py's own path,
    which sends it again (a read: harmless), follows the cluster's topology and retries."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = client

    async def hmget(self, key: str, fields: Sequence[str]) -> list[Any]:
        try:
            node = self._client.nodes_manager.get_node_from_slot(self._client.keyslot(key))
            found: list[Any] = await _on_node(node, packed("HMGET", key, *fields))
        except Exception:
            found = await self._client.hmget(key, list(fields))
        return found


async def _on_node(node: ClusterNode, command: bytes) -> Any:
    connection = node.acquire_connection()
    try:
        await node.disconnect_if_needed(connection)
        return await _send_and_read(connection, command)
    finally:
        node.release(connection)
