"""What the proxy adds to a request: the same requests straight to the fake upstream and through
`compaction-proxy serve`, once with the in-memory store and once with Redis.

    .venv/bin/python bench/overhead.py [--redis-url redis://127.0.0.1:6379/0] [--quick]

Prints a Markdown table: added latency (p50/p99) for a small request and for a ~100k-token
history that is not compacted, streaming time to first byte, requests/second at concurrency 16,
the proxy's RSS after the run and its cold start, beside the targets of issue 2 and the LiteLLM
proxy's figures of DESIGN.md section 9. Takes about a minute and a half.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    Server,
    busy_seconds,
    cpu_seconds,
    fake_upstream,
    long_history,
    machine,
    memory_mb,
    percentile,
    proxy,
)

MODEL = "gpt-4o"
WINDOW = 1_000_000  # the fake's window and the proxy's override: nothing is ever compacted
HISTORY_TOKENS = 100_000
CONCURRENCY = 16
STREAM_BEHAVIOR = "slow-stream:0.002"  # events 2 ms apart: a relay that buffers shows in TTFB
HEADERS = {
    "Authorization": "Bearer sk-bench",
    "Content-Type": "application/json",
    "X-Session-Id": "bench-overhead",
}


@dataclass(frozen=True)
class Sizes:
    small: int = 400  # request pairs (direct, through) per latency figure
    large: int = 80
    stream: int = 150
    rate_seconds: float = 3.0

    def scaled(self, factor: float) -> Sizes:
        return Sizes(
            max(10, int(self.small * factor)),
            max(5, int(self.large * factor)),
            max(10, int(self.stream * factor)),
            max(0.5, self.rate_seconds * factor),
        )


@dataclass
class Samples:
    direct: list[float] = field(default_factory=list)
    through: list[float] = field(default_factory=list)

    def added(self, q: float) -> float:
        """Milliseconds the proxy adds at percentile q."""
        return (percentile(self.through, q) - percentile(self.direct, q)) * 1000

    def direct_ms(self, q: float) -> float:
        return percentile(self.direct, q) * 1000


@dataclass
class Run:
    """The figures of one proxy process."""

    store: str
    small: Samples = field(default_factory=Samples)
    large: Samples = field(default_factory=Samples)
    ttfb: Samples = field(default_factory=Samples)
    rate_direct: float = 0.0
    rate_through: float = 0.0
    cpu_proxy_us: float = 0.0  # CPU time per request under load, proxy process
    cpu_fake_us: float = 0.0  # the same for the fake upstream, direct
    others: float = 0.0  # cores' worth of CPU other processes used during the run
    large_overhead_ms: list[float] = field(default_factory=list)  # x-compaction-overhead-ms
    cold_count_ms: float = 0.0  # the proxy's overhead on the first 100k request (counts empty)
    tokens: int = 0
    rss_mb: float = 0.0
    peak_mb: float = 0.0
    cold_start_s: float = 0.0


class Client:
    """One keep-alive aiohttp session; checks every answer before it is counted."""

    def __init__(self, session: aiohttp.ClientSession, direct: str, through: str) -> None:
        self.session = session
        self.direct = f"{direct}/chat/completions"
        self.through = f"{through}/chat/completions"

    async def call(
        self, url: str, body: bytes, headers: dict[str, str] = HEADERS
    ) -> tuple[float, float, aiohttp.ClientResponse]:
        """(seconds to the first body byte, seconds to the end, response) of one request."""
        started = time.perf_counter()
        async with self.session.post(url, data=body, headers=headers) as response:
            first = await response.content.readany()
            first_byte = time.perf_counter() - started
            while await response.content.readany():
                pass
            ended = time.perf_counter() - started
        if response.status != 200 or not first:
            raise RuntimeError(f"{url} answered {response.status}")
        if url == self.through and response.headers.get("x-compaction-action") != "none":
            raise RuntimeError("the proxy compacted a request it should have left alone")
        return first_byte, ended, response

    async def pairs(
        self,
        body: bytes,
        count: int,
        samples: Samples,
        *,
        pick: Callable[[float, float], float] = lambda first, end: end,
        headers: dict[str, str] = HEADERS,
        overheads: list[float] | None = None,
    ) -> None:
        """`count` requests each way, alternating which goes first so that drift cancels out."""
        for i in range(count):
            order = (self.direct, self.through) if i % 2 else (self.through, self.direct)
            for url in order:
                first, end, response = await self.call(url, body, headers)
                kept = samples.direct if url == self.direct else samples.through
                kept.append(pick(first, end))
                if overheads is not None and url == self.through:
                    overheads.append(float(response.headers["x-compaction-overhead-ms"]))

    async def rate(
        self, url: str, body: bytes, seconds: float, pids: tuple[int, ...]
    ) -> tuple[float, list[float]]:
        """Requests/second of CONCURRENCY clients sending back to back for `seconds`, and the
        CPU microseconds each of `pids` spent per request meanwhile."""
        await self._load(url, body, min(0.5, seconds / 4))  # warm the connection pools
        cpu = [cpu_seconds(pid) for pid in pids]
        done, took = await self._load(url, body, seconds)
        return done / took, [
            (cpu_seconds(p) - c) / done * 1e6 for p, c in zip(pids, cpu, strict=True)
        ]

    async def _load(self, url: str, body: bytes, seconds: float) -> tuple[int, float]:
        started = time.perf_counter()
        deadline = started + seconds
        counts = [0] * CONCURRENCY

        async def worker(index: int) -> None:
            while time.perf_counter() < deadline:
                async with self.session.post(url, data=body, headers=HEADERS) as response:
                    await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url} answered {response.status}")
                counts[index] += 1

        await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
        return sum(counts), time.perf_counter() - started


def chat(messages: list[dict[str, Any]], **fields: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": messages, **fields})


async def measure(run: Run, upstream: Server, server: Server, sizes: Sizes, history: bytes) -> None:
    small = chat([{"role": "user", "content": "Say hello."}])
    stream = chat(
        [{"role": "user", "content": "Say hello."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    streaming = {**HEADERS, "x-fake-behavior": STREAM_BEHAVIOR}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        client = Client(session, upstream.url, server.url)
        _, _, first = await client.call(client.through, history)
        run.cold_count_ms = float(first.headers["x-compaction-overhead-ms"])
        run.tokens = int(first.headers["x-compaction-tokens-before"])
        await client.pairs(history, 3, Samples())  # warm both sides' caches and connections
        await client.pairs(small, 20, Samples())
        await client.pairs(small, sizes.small, run.small)
        await client.pairs(history, sizes.large, run.large, overheads=run.large_overhead_ms)
        await client.pairs(
            stream, sizes.stream, run.ttfb, pick=lambda first, end: first, headers=streaming
        )
        run.rate_direct, (run.cpu_fake_us,) = await client.rate(
            client.direct, small, sizes.rate_seconds, (upstream.pid,)
        )
        run.rate_through, (run.cpu_proxy_us,) = await client.rate(
            client.through, small, sizes.rate_seconds, (server.pid,)
        )


def proxy_config(upstream: str, store: str, key_prefix: str) -> str:
    return f"""
listen: {{host: 127.0.0.1, port: 8080}}
store: {{url: "{store}", key_prefix: "{key_prefix}"}}
upstreams:
  fake: {{base_url: "{upstream}"}}
models:
  - {{match: "{MODEL}", context_window: {WINDOW}}}
"""


def bench_store(
    store: str, url: str, upstream: Server, prefix: str, sizes: Sizes, history: bytes
) -> Run:
    run = Run(store)
    with proxy(proxy_config(upstream.url, url, prefix)) as server:
        run.cold_start_s = server.started_in
        pids = (server.pid, upstream.pid)
        started, busy, ours = time.perf_counter(), busy_seconds(), _ours(pids)
        uvloop.run(measure(run, upstream, server, sizes, history))
        others = busy_seconds() - busy - (_ours(pids) - ours)
        run.others = max(0.0, others) / (time.perf_counter() - started)
        memory = memory_mb(server.pid)
        run.rss_mb, run.peak_mb = memory["VmRSS"], memory["VmHWM"]
    return run


def _ours(pids: tuple[int, ...]) -> float:
    return cpu_seconds() + sum(cpu_seconds(pid) for pid in pids)


def redis_reachable(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def delete_keys(url: str, prefix: str) -> int:
    """Remove what the proxy wrote under our own prefix (a non-compacting run writes nothing)."""
    with redis.Redis.from_url(url) as client:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        return int(client.delete(*keys)) if keys else 0


# -- the report -----------------------------------------------------------------------------------

Cell = Callable[[Run], str]


def _verdict(ok: bool) -> str:
    return "ok" if ok else "**missed**"


def _added(samples: Callable[[Run], Samples], q: float, limit: float | None = None) -> Cell:
    """Added milliseconds at percentile q, the direct figure beside, judged against `limit`."""

    def cell(run: Run) -> str:
        value = samples(run).added(q)
        verdict = "" if limit is None else f" {_verdict(value <= limit)}"
        return f"{value:+.2f} ms (direct {samples(run).direct_ms(q):.2f}){verdict}"

    return cell


def _rate(run: Run) -> str:
    ratio = run.rate_through / run.rate_direct
    return (
        f"{run.rate_through:,.0f} vs {run.rate_direct:,.0f} direct = {ratio:.2f}x"
        f" {_verdict(ratio >= 0.55)}"
    )


def report(runs: list[Run], sizes: Sizes) -> str:
    history = f"{runs[0].tokens:,}-token history"
    rows: list[tuple[str, Cell, str, str]] = [
        (
            "added latency p50, small request",
            _added(lambda r: r.small, 50, 1),
            "<= +1 ms",
            "+10.8 ms",
        ),
        ("added latency p99, small request", _added(lambda r: r.small, 99), "", ""),
        (f"added latency p50, {history}", _added(lambda r: r.large, 50, 3), "<= +3 ms", "+14.0 ms"),
        (f"added latency p99, {history}", _added(lambda r: r.large, 99), "", ""),
        (
            "x-compaction-overhead-ms p50, history",
            lambda r: f"{percentile(r.large_overhead_ms, 50):.2f} ms",
            "",
            "",
        ),
        ("the same, first history request", lambda r: f"{r.cold_count_ms:.2f} ms", "", ""),
        ("streaming time to first byte p50", _added(lambda r: r.ttfb, 50, 1), "<= +1 ms", ""),
        ("streaming time to first byte p99", _added(lambda r: r.ttfb, 99), "", ""),
        (f"requests/s at concurrency {CONCURRENCY}", _rate, ">= 0.55x direct", "0.11x"),
        (
            "CPU per request under that load: proxy (fake)",
            lambda r: f"{r.cpu_proxy_us:.0f} us ({r.cpu_fake_us:.0f} us)",
            "",
            "",
        ),
        (
            "proxy RSS after the run (peak)",
            lambda r: f"{r.rss_mb:.0f} MB ({r.peak_mb:.0f}) {_verdict(r.rss_mb <= 120)}",
            "<= 120 MB",
            "388 MB",
        ),
        (
            "cold start, spawn to first /healthz 200",
            lambda r: f"{r.cold_start_s:.2f} s {_verdict(r.cold_start_s <= 1.5)}",
            "<= 1.5 s",
            "",
        ),
        ("other processes' CPU meanwhile", lambda r: f"{r.others:.2f} cores", "", ""),
    ]
    head = ["figure", *(f"{r.store} store" for r in runs), "target", "LiteLLM proxy"]
    lines = [
        f"machine: {machine()}",
        f"samples: {sizes.small} small, {sizes.large} history and {sizes.stream} streamed requests"
        f" each way, alternating; {sizes.rate_seconds:g} s per throughput figure",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, cell, target, litellm in rows:
        lines.append("| " + " | ".join([name, *(cell(r) for r in runs), target, litellm]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--quick", action="store_true", help="a tenth of the samples (a smoke run)")
    args = parser.parse_args()
    sizes = Sizes().scaled(0.1) if args.quick else Sizes()
    started = time.perf_counter()
    history = chat(long_history(HISTORY_TOKENS))
    prefix = f"cpbench-{os.urandom(4).hex()}"
    stores = [("memory", "memory://")]
    if redis_reachable(args.redis_url):
        stores.append(("redis", args.redis_url))
    else:
        print(f"no Redis answers at {args.redis_url}: the Redis run is skipped", file=sys.stderr)
    runs = []
    with fake_upstream({MODEL: WINDOW}) as upstream:
        for name, url in stores:
            try:
                runs.append(bench_store(name, url, upstream, prefix, sizes, history))
            finally:
                if name == "redis":
                    delete_keys(url, prefix)
    print(report(runs, sizes))
    took = time.perf_counter() - started
    print(f"\nhistory body {len(history) / 1024:.0f} KiB; the run took {took:.0f} s")


if __name__ == "__main__":
    main()
