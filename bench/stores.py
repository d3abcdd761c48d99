"""What each Redis topology costs a request: one server, one server over TLS, a Redis Cluster
(3 masters, a replica each; plain and TLS) and a master behind 3 Sentinels, all started by the
script on free loopback ports (tests/redis_servers.py), never the shared Redis.

    .venv/bin/python bench/stores.py [--quick]

Two parts:

- the session store alone (`RedisStore`, in this process): a replayed turn's one read
  (`get`, an HMGET) and a compaction's lock, compare-and-set and release, one at a time
  (p50/p99 latency), then `get` from 16 callers at once for 2 s: calls/s and this process's
  CPU per call, which is what the proxy's event loop pays;
- through `compaction-proxy serve` with each store (the fake upstream as in overhead.py): a
  small request's added p50/p99 over direct, requests in turn so that load drifts alike, then
  requests/s at concurrency 16 and the proxy's CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_seconds, fake_upstream, machine, percentile, proxy
from overhead import MODEL, SMALL, WINDOW, Client, Figures, proxy_config

from proxy.sessions.sessions import session_key
from proxy.sessions.store import RedisStore
from tests.redis_servers import (
    free_port,
    make_certificates,
    redis_cluster,
    redis_sentinels,
    redis_server,
)

CONCURRENCY = 16


@dataclass
class StoreFigures:
    name: str
    url: str
    latency_us: dict[str, list[float]] = field(default_factory=dict)
    rate: float = 0.0
    cpu_us: float = 0.0


@contextlib.contextmanager
def topologies() -> Iterator[list[tuple[str, str]]]:
    """(name, store URL) of every topology, its servers running."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        certificates = make_certificates(Path(tmp))
        plain, tls = free_port(), free_port()
        stack.enter_context(redis_server(plain))
        stack.enter_context(redis_server(tls, tls=certificates))
        cluster = stack.enter_context(redis_cluster())
        tls_cluster = stack.enter_context(redis_cluster(tls=certificates))
        sentinels = stack.enter_context(redis_sentinels())
        yield [
            ("one server", f"redis://127.0.0.1:{plain}/0"),
            ("one server, TLS", f"rediss://localhost:{tls}/0?ssl_ca_certs={certificates.ca}"),
            ("Cluster", cluster.url),
            ("Cluster, TLS", tls_cluster.url),
            ("Sentinel", sentinels.url),
        ]


async def timed(samples: list[float], call: Callable[[], Awaitable[object]]) -> None:
    started = time.perf_counter()
    await call()
    samples.append((time.perf_counter() - started) * 1e6)


async def measure_store(name: str, url: str, runs: int, seconds: float) -> StoreFigures:
    figures = StoreFigures(name, url)
    store = RedisStore(url, ttl_seconds=600, key_prefix="cpbench", timeout_seconds=2)
    keys = [session_key("bench", f"session {i}") for i in range(64)]
    try:
        for key in keys:  # connections made, scripts loaded, keys written
            await store.compare_and_set(key, 0, b"x" * 2000)
        reads: list[float] = []
        compactions: list[float] = []
        for i in range(runs):
            key = keys[i % len(keys)]
            await timed(reads, lambda key=key: store.get(key))  # type: ignore[misc]

            async def compaction(key: str = key) -> None:
                token = await store.acquire_lock(key, 30)
                record = await store.get(key)
                assert token is not None and record is not None
                await store.compare_and_set(key, record.version, b"y" * 2000, fence=token)
                await store.release_lock(key, token)

            await timed(compactions, compaction)
        figures.latency_us = {"get": reads, "compaction": compactions}
        done = 0
        deadline = time.perf_counter() + seconds

        async def caller(index: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await store.get(keys[(index * 7 + done) % len(keys)])
                done += 1

        cpu, started = cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(CONCURRENCY)))
        figures.rate = done / (time.perf_counter() - started)
        figures.cpu_us = (cpu_seconds() - cpu) / done * 1e6
    finally:
        await store.close()
    return figures


async def measure_proxies(direct: Figures, ways: list[Figures], small: int, seconds: float) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        client = Client(session)
        await client.rounds("warm-up", SMALL, 30, [direct, *ways])
        await client.rounds("small", SMALL, small, [direct, *ways])
        for way in ways:
            way.rate, way.cpu_us = await client.rate(way, seconds, way.pid)


def report(stores: list[StoreFigures], direct: Figures, ways: list[Figures]) -> str:
    base = stores[0]
    lines = [
        f"machine: {machine()}",
        "",
        "The session store alone (RedisStore in this process; a 2 KB record):",
        "",
        "| topology | get p50 | get p99 | lock + get + compare-and-set + release p50 |"
        f" get/s at concurrency {CONCURRENCY} | CPU per get | vs one server |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in stores:
        get, compaction = f.latency_us["get"], f.latency_us["compaction"]
        lines.append(
            f"| {f.name} | {statistics.median(get):.0f} us | {percentile(get, 99):.0f} us |"
            f" {statistics.median(compaction):.0f} us | {f.rate:,.0f} | {f.cpu_us:.0f} us |"
            f" {f.cpu_us - base.cpu_us:+.0f} us CPU |"
        )
    small = direct.seconds["small"]
    lines += [
        "",
        "Through `compaction-proxy serve`, a small request (one store read):",
        "",
        f"| store | added p50 | added p99 | requests/s at concurrency {CONCURRENCY} |"
        " proxy CPU per request |",
        "|---|---|---|---|---|",
    ]
    for way in ways:
        added = [
            (percentile(way.seconds["small"], q) - percentile(small, q)) * 1000 for q in (50, 99)
        ]
        lines.append(
            f"| {way.name} | {added[0]:+.2f} ms | {added[1]:+.2f} ms | {way.rate:,.0f} |"
            f" {way.cpu_us:.0f} us |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the samples")
    args = parser.parse_args()
    runs, small, seconds = (200, 40, 0.5) if args.quick else (2000, 400, 2.0)
    started = time.perf_counter()
    with topologies() as urls, fake_upstream({MODEL: WINDOW}) as upstream:
        stores = [uvloop.run(measure_store(name, url, runs, seconds)) for name, url in urls]
        direct = Figures("direct", f"{upstream.url}/chat/completions", pid=upstream.pid)
        with contextlib.ExitStack() as stack:
            ways = []
            for name, url in [("memory", "memory://"), *urls]:
                server = stack.enter_context(proxy(proxy_config(upstream.url, url, "cpbench")))
                ways.append(Figures.of(name, server, True))
            uvloop.run(measure_proxies(direct, ways, small, seconds))
    print(report(stores, direct, ways))
    print(f"\nthe run took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
