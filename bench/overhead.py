"""What the proxy adds to a request: the same requests straight to the fake upstream, through
`compaction-proxy serve` (in-memory store, then Redis) and through a bare relay (the floor).

    .venv/bin/python bench/overhead.py [--redis-url redis://127.0.0.1:6379/0] [--quick]
                                       [--compare REV]

Prints a Markdown table: added latency (p50/p99) for a small request and for a ~100k-token
history that is not compacted, streaming time to first byte, requests/second at concurrency 16,
RSS after the run and cold start, beside the targets and the LiteLLM proxy's figures measured
earlier (bench/README.md). Every server is its own process; latency requests go to all of
them in turn, so that a change in the machine's load shows in every column alike. Takes under
a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
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
    bare_relay,
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
STREAM_BEHAVIOR = "slow-stream:0.001"  # events 1 ms apart: a relay that buffers shows in TTFB
BUSY = 0.25  # cores used by other processes beyond which the figures are not to be trusted
HEADERS = {
    "Authorization": "Bearer sk-bench",
    "Content-Type": "application/json",
    "X-Session-Id": "bench-overhead",
}
STREAM_HEADERS = {**HEADERS, "x-fake-behavior": STREAM_BEHAVIOR}


def chat(messages: list[dict[str, Any]], **fields: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": messages, **fields})


SMALL = chat([{"role": "user", "content": "Say hello."}])
STREAM = chat(
    [{"role": "user", "content": "Say hello."}], stream=True, stream_options={"include_usage": True}
)


@dataclass(frozen=True)
class Sizes:
    small: int = 400  # requests to each server per latency figure
    large: int = 80
    stream: int = 120
    rate_seconds: float = 3.0

    def scaled(self, factor: float) -> Sizes:
        return Sizes(
            max(10, int(self.small * factor)),
            max(5, int(self.large * factor)),
            max(10, int(self.stream * factor)),
            max(0.5, self.rate_seconds * factor),
        )


@dataclass
class Figures:
    """What was measured of one way to the upstream: direct, or through one server."""

    name: str
    url: str  # the chat completions URL
    proxied: bool = False  # the compaction proxy: it says what it did in x-compaction-* headers
    pid: int = 0
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rate: float = 0.0
    rate_direct: float = 0.0  # the direct figure measured just before this one
    cpu_us: float = 0.0  # CPU time per request under that load
    overhead_ms: list[float] = field(default_factory=list)  # x-compaction-overhead-ms, history
    cold_overhead_ms: float = 0.0  # the same on the first history request (nothing cached)
    tokens: int = 0  # the proxy's count of the history
    rss_mb: float = 0.0
    peak_mb: float = 0.0
    cold_start_s: float = 0.0  # spawn to the first /healthz 200
    first_chat_s: float = 0.0  # spawn to the first chat completion answered

    @classmethod
    def of(cls, name: str, server: Server, proxied: bool) -> Figures:
        return cls(name, f"{server.url}/chat/completions", proxied, server.pid)


class Client:
    """One keep-alive aiohttp session; checks every answer before it is counted."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def call(
        self, to: Figures, body: bytes, headers: dict[str, str] = HEADERS
    ) -> tuple[float, float, aiohttp.ClientResponse]:
        """(seconds to the first body byte, seconds to the end, response) of one request."""
        started = time.perf_counter()
        async with self.session.post(to.url, data=body, headers=headers) as response:
            first = await response.content.readany()
            first_byte = time.perf_counter() - started
            while await response.content.readany():
                pass
            ended = time.perf_counter() - started
        if response.status != 200 or not first:
            raise RuntimeError(f"{to.name} answered {response.status}")
        action = response.headers.get("x-compaction-action")
        if to.proxied and action != "none":
            raise RuntimeError(f"the proxy did {action!r} to a request it should leave alone")
        return first_byte, ended, response

    async def rounds(
        self, kind: str, body: bytes, count: int, ways: list[Figures], *, first_byte: bool = False
    ) -> None:
        """`count` requests each way, the order rotating so that each goes first as often."""
        headers = STREAM_HEADERS if first_byte else HEADERS
        for i in range(count):
            shift = i % len(ways)
            for way in ways[shift:] + ways[:shift]:
                first, end, response = await self.call(way, body, headers)
                way.seconds[kind].append(first if first_byte else end)
                if kind == "history" and way.proxied:
                    way.overhead_ms.append(float(response.headers["x-compaction-overhead-ms"]))

    async def rate(self, way: Figures, seconds: float, pid: int) -> tuple[float, float]:
        """Requests/second of CONCURRENCY clients sending back to back for `seconds`, and the
        CPU microseconds process `pid` spent per request meanwhile."""
        await self._load(way, min(0.5, seconds / 4))  # warm the connection pools
        cpu = cpu_seconds(pid)
        done, took = await self._load(way, seconds)
        return done / took, (cpu_seconds(pid) - cpu) / done * 1e6

    async def _load(self, way: Figures, seconds: float) -> tuple[int, float]:
        started = time.perf_counter()
        deadline = started + seconds
        counts = [0] * CONCURRENCY

        async def worker(index: int) -> None:
            while time.perf_counter() < deadline:
                async with self.session.post(way.url, data=SMALL, headers=HEADERS) as response:
                    await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{way.name} answered {response.status}")
                counts[index] += 1

        await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
        return sum(counts), time.perf_counter() - started


async def measure(direct: Figures, through: list[Figures], sizes: Sizes, history: bytes) -> None:
    ways = [direct, *through]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        client = Client(session)
        for way in through:
            if way.proxied:
                _, _, first = await client.call(way, history)
                way.cold_overhead_ms = float(first.headers["x-compaction-overhead-ms"])
                way.tokens = int(first.headers["x-compaction-tokens-before"])
        await client.rounds("warm-up", history, 3, ways)  # caches and connections, both sides
        await client.rounds("warm-up", SMALL, 20, ways)
        await client.rounds("small", SMALL, sizes.small, ways)
        await client.rounds("history", history, sizes.large, ways)
        await client.rounds("ttfb", STREAM, sizes.stream, ways, first_byte=True)
        for way in through:
            way.rate_direct, _ = await client.rate(direct, sizes.rate_seconds, direct.pid)
            way.rate, way.cpu_us = await client.rate(way, sizes.rate_seconds, way.pid)
        direct.rate, direct.cpu_us = await client.rate(direct, sizes.rate_seconds, direct.pid)


def first_chat(server: Server) -> float:
    """Seconds from spawning `server` to its first chat completion answered."""
    request = urllib.request.Request(f"{server.url}/chat/completions", SMALL, HEADERS)
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
    return time.perf_counter() - server.spawned


def proxy_config(upstream: str, store: str, key_prefix: str) -> str:
    return f"""
listen: {{host: 127.0.0.1, port: 8080}}
store: {{url: "{store}", key_prefix: "{key_prefix}"}}
upstreams:
  fake: {{base_url: "{upstream}"}}
models:
  - {{match: "{MODEL}", context_window: {WINDOW}}}
"""


def redis_reachable(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def own_keys(url: str, prefix: str) -> Iterator[None]:
    """Afterwards, delete what the proxy wrote under our prefix (a run without compaction
    writes nothing, so normally nothing)."""
    try:
        yield
    finally:
        with redis.Redis.from_url(url) as client:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """A temporary git worktree of `revision`, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="bench-ab-")) / "tree"
    git = ["git", "-C", str(Path(__file__).resolve().parent.parent)]
    subprocess.run([*git, "worktree", "add", "--detach", str(path), revision], check=True)
    try:
        yield path
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(path)], check=False)


def run(
    sizes: Sizes, redis_url: str | None, history: bytes, compare: str | None
) -> tuple[list[Figures], float]:
    """Start the servers one by one, measure them all, read their memory, stop them.

    Returns the figures, direct first, and the cores' worth of CPU other processes used.
    """
    prefix = f"cpbench-{os.urandom(4).hex()}"
    with fake_upstream({MODEL: WINDOW}) as upstream, contextlib.ExitStack() as stack:
        direct = Figures("direct", f"{upstream.url}/chat/completions", pid=upstream.pid)
        memory = proxy_config(upstream.url, "memory://", prefix)
        starts: list[tuple[str, contextlib.AbstractContextManager[Server], bool]] = [
            ("proxy, memory store", proxy(memory), True)
        ]
        if compare:
            tree = stack.enter_context(checkout(compare))
            starts.append((f"proxy at {compare}, memory store", proxy(memory, tree), True))
        if redis_url:
            stack.enter_context(own_keys(redis_url, prefix))
            on_redis = proxy(proxy_config(upstream.url, redis_url, prefix))
            starts.append(("proxy, Redis store", on_redis, True))
        starts.append(("bare relay (floor)", bare_relay(upstream.url), False))
        through = []
        for name, start, proxied in starts:
            server = stack.enter_context(start)
            way = Figures.of(name, server, proxied)
            way.first_chat_s = first_chat(server)
            way.cold_start_s = server.started_in
            through.append(way)
        pids = [upstream.pid, *(way.pid for way in through)]
        started, busy, ours = time.perf_counter(), busy_seconds(), _ours(pids)
        uvloop.run(measure(direct, through, sizes, history))
        others = busy_seconds() - busy - (_ours(pids) - ours)
        for way in through:
            memory = memory_mb(way.pid)
            way.rss_mb, way.peak_mb = memory["VmRSS"], memory["VmHWM"]
        return [direct, *through], max(0.0, others) / (time.perf_counter() - started)


def _ours(pids: list[int]) -> float:
    return cpu_seconds() + sum(cpu_seconds(pid) for pid in pids)


# -- the report -----------------------------------------------------------------------------------

Cell = Callable[[Figures, Figures], str]  # (through, direct) -> text
Direct = Callable[[Figures], str]


def _verdict(ok: bool) -> str:
    return "ok" if ok else "**missed**"


def _ms(kind: str, q: float) -> Direct:
    return lambda direct: f"{percentile(direct.seconds[kind], q) * 1000:.2f} ms"


def _added(kind: str, q: float, limit: float | None = None) -> Cell:
    """Milliseconds added at percentile q, judged against `limit`."""

    def cell(way: Figures, direct: Figures) -> str:
        value = (percentile(way.seconds[kind], q) - percentile(direct.seconds[kind], q)) * 1000
        return f"{value:+.2f} ms" + ("" if limit is None else f" {_verdict(value <= limit)}")

    return cell


def _proxied(cell: Callable[[Figures], str]) -> Cell:
    return lambda way, direct: cell(way) if way.proxied else "-"


def _rate(way: Figures, direct: Figures) -> str:
    ratio = way.rate / way.rate_direct
    return f"{way.rate:,.0f} = {ratio:.2f}x direct {_verdict(ratio >= 0.55)}"


def _none(direct: Figures) -> str:
    return "-"


ROWS: list[tuple[str, Direct, Cell, str, str]] = [
    ("small request, p50", _ms("small", 50), _added("small", 50, 1), "<= +1 ms", "+10.8 ms"),
    ("small request, p99", _ms("small", 99), _added("small", 99), "", ""),
    ("{history}, p50", _ms("history", 50), _added("history", 50, 3), "<= +3 ms", "+14.0 ms"),
    ("{history}, p99", _ms("history", 99), _added("history", 99), "", ""),
    (
        "proxy's x-compaction-overhead-ms p50, history",
        _none,
        _proxied(lambda w: f"{percentile(w.overhead_ms, 50):.2f} ms"),
        "",
        "",
    ),
    (
        "the same, first history request (cold caches)",
        _none,
        _proxied(lambda w: f"{w.cold_overhead_ms:.2f} ms"),
        "",
        "",
    ),
    ("streaming, time to first byte p50", _ms("ttfb", 50), _added("ttfb", 50, 1), "<= +1 ms", ""),
    ("streaming, time to first byte p99", _ms("ttfb", 99), _added("ttfb", 99), "", ""),
    (
        f"requests/s at concurrency {CONCURRENCY}, small",
        lambda d: f"{d.rate:,.0f}",
        _rate,
        ">= 0.55x direct",
        "0.11x",
    ),
    (
        "CPU per request at that load",
        lambda d: f"{d.cpu_us:.0f} us",
        lambda w, d: f"{w.cpu_us:.0f} us",
        "",
        "",
    ),
    (
        "RSS after the run (peak)",
        _none,
        lambda w, d: f"{w.rss_mb:.0f} MB ({w.peak_mb:.0f}) {_verdict(w.rss_mb <= 120)}",
        "<= 120 MB",
        "388 MB",
    ),
    (
        "cold start: spawn to first /healthz 200",
        _none,
        lambda w, d: f"{w.cold_start_s:.2f} s {_verdict(w.cold_start_s <= 1.5)}",
        "<= 1.5 s",
        "",
    ),
    (
        "spawn to first chat completion answered",
        _none,
        lambda w, d: f"{w.first_chat_s:.2f} s",
        "",
        "",
    ),
]


def report(figures: list[Figures], others: float, sizes: Sizes) -> str:
    direct, *through = figures
    history = f"{max(way.tokens for way in through):,}-token history"
    head = ["figure", "direct", *(way.name for way in through), "target", "LiteLLM proxy"]
    lines = [
        f"machine: {machine()}",
        f"samples: {sizes.small} small, {sizes.large} history and {sizes.stream} streamed requests"
        f" each way, in turn; {sizes.rate_seconds:g} s per throughput figure",
        f"other processes' CPU meanwhile: {others:.2f} cores",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, of_direct, cell, target, litellm in ROWS:
        cells = [name.format(history=history), of_direct(direct)]
        cells += [cell(way, direct) for way in through]
        lines.append("| " + " | ".join([*cells, target, litellm]) + " |")
    if others > BUSY:
        lines.append(
            f"\nWARNING: other processes used {others:.2f} cores meanwhile (more than {BUSY}):"
            " the figures are disturbed. Run again on a quiet machine."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--quick", action="store_true", help="a tenth of the samples (a smoke run)")
    parser.add_argument(
        "--compare", metavar="REV", help="also measure the proxy at this git revision (A/B)"
    )
    args = parser.parse_args()
    sizes = Sizes().scaled(0.1) if args.quick else Sizes()
    started = time.perf_counter()
    history = chat(long_history(HISTORY_TOKENS))
    redis_url = args.redis_url if redis_reachable(args.redis_url) else None
    if redis_url is None:
        print(f"no Redis answers at {args.redis_url}: its run is skipped", file=sys.stderr)
    figures, others = run(sizes, redis_url, history, args.compare)
    print(report(figures, others, sizes))
    took = time.perf_counter() - started
    print(f"\nhistory body {len(history) / 1024:.0f} KiB; the run took {took:.0f} s")


if __name__ == "__main__":
    main()
