"""What the proxy adds to a request: the same requests straight to the fake upstream, through
`compaction-proxy serve` (in-memory store, then Redis) and through a bare relay (the floor).

    .venv/bin/python bench/overhead.py [--redis-url redis://127.0.0.1:6379/0] [--quick]
                                       [--compare REV]

Prints a Markdown table: added latency (p50/p99) for a small request and for a ~100k-token
history that is not compacted (chat messages, and the same as a Codex-like Responses request),
streaming time to first byte, requests/second at concurrency 16, RSS after the run and cold
start, beside the targets and the LiteLLM proxy's figures measured earlier (bench/README.md).
Every server is its own process; latency requests go to all of them in turn, so that a change
in the machine's load shows in every column alike. Takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
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
    as_responses_items,
    bare_relay,
    busy_seconds,
    cpu_seconds,
    fake_anthropic,
    fake_upstream,
    long_history,
    machine,
    memory_mb,
    percentile,
    proxy,
)
from replayed_turns import KINDS, Replayed, cases, compact, models_yaml
from replayed_turns import MODEL as REPLAYED_MODEL

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


Request = tuple[str, bytes]  # a path below /v1, and a body


def chat(messages: list[dict[str, Any]], **fields: Any) -> Request:
    return "/chat/completions", orjson.dumps({"model": MODEL, "messages": messages, **fields})


def responses(items: list[dict[str, Any]]) -> Request:
    """A Codex-like request: instructions, and the history as input items."""
    body = {"model": MODEL, "instructions": "You are Codex.", "input": items, "store": False}
    return "/responses", orjson.dumps(body)


# The long histories, by the name of their figures: chat messages, and the same as a Codex-like
# Responses request (reasoning items, function calls and outputs).
HISTORIES = {"history": "history (chat)", "codex": "history (Responses, Codex-like)"}
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
    url: str  # the base URL, with /v1
    proxied: bool = False  # the compaction proxy: it says what it did in x-compaction-* headers
    pid: int = 0
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rate: float = 0.0
    rate_direct: float = 0.0  # the direct figure measured just before this one
    cpu_us: float = 0.0  # CPU time per request under that load
    # x-compaction-overhead-ms of each history request, and of the first (nothing cached)
    overhead_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cold_overhead_ms: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)  # the proxy's count of each history
    forwarded: dict[str, int] = field(default_factory=dict)  # of a replayed turn's view
    rss_mb: float = 0.0
    peak_mb: float = 0.0
    cold_start_s: float = 0.0  # spawn to the first /healthz 200
    first_chat_s: float = 0.0  # spawn to the first chat completion answered

    @classmethod
    def of(cls, name: str, server: Server, proxied: bool) -> Figures:
        return cls(name, server.url, proxied, server.pid)


class Client:
    """One keep-alive aiohttp session; checks every answer before it is counted."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def call(
        self,
        to: Figures,
        request: Request,
        headers: dict[str, str] = HEADERS,
        action: str = "none",
        url: str | None = None,
    ) -> tuple[float, float, aiohttp.ClientResponse]:
        """(seconds to the first body byte, seconds to the end, response) of one request, to
        `url` (else `to`'s) below /v1; the proxy is to have done `action`."""
        path, body = request
        started = time.perf_counter()
        base = url or to.url
        async with self.session.post(f"{base}{path}", data=body, headers=headers) as response:
            first = await response.content.readany()
            first_byte = time.perf_counter() - started
            while await response.content.readany():
                pass
            ended = time.perf_counter() - started
        if response.status != 200 or not first:
            raise RuntimeError(f"{to.name} answered {response.status}: {first[:300]!r}")
        done = response.headers.get("x-compaction-action")
        if to.proxied and done != action:
            raise RuntimeError(f"the proxy did {done!r} to a request, not {action!r}")
        return first_byte, ended, response

    async def rounds(
        self,
        kind: str,
        request: Request,
        count: int,
        ways: list[Figures],
        *,
        first_byte: bool = False,
    ) -> None:
        """`count` requests each way, the order rotating so that each goes first as often."""
        headers = STREAM_HEADERS if first_byte else HEADERS
        for i in range(count):
            shift = i % len(ways)
            for way in ways[shift:] + ways[:shift]:
                first, end, response = await self.call(way, request, headers)
                way.seconds[kind].append(first if first_byte else end)
                if kind in HISTORIES and way.proxied:
                    overhead = float(response.headers["x-compaction-overhead-ms"])
                    way.overhead_ms[kind].append(overhead)

    async def replayed(
        self, kind: str, case: Replayed, count: int, ways: list[Figures], anthropic: str
    ) -> None:
        """A compacted session's replayed turns through each proxy, and what they forward
        sent direct (and through the relay, but for Messages, which it does not relay), in
        turn as `rounds`."""
        direct = anthropic if case.api == "messages" else None
        sent, forwarded = (case.path, case.sent), (case.path, case.forwarded)
        for i in range(count):
            shift = i % len(ways)
            for way in ways[shift:] + ways[:shift]:
                if way.proxied:
                    _, end, response = await self.call(way, sent, case.headers, "replayed")
                    overhead = float(response.headers["x-compaction-overhead-ms"])
                    way.overhead_ms[kind].append(overhead)
                elif way.name == "direct":
                    _, end, _ = await self.call(way, forwarded, case.headers, url=direct)
                elif case.api != "messages":
                    _, end, _ = await self.call(way, forwarded, case.headers)
                else:
                    continue
                way.seconds[kind].append(end)

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
                url = f"{way.url}{SMALL[0]}"
                async with self.session.post(url, data=SMALL[1], headers=HEADERS) as response:
                    await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{way.name} answered {response.status}")
                counts[index] += 1

        await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
        return sum(counts), time.perf_counter() - started


async def measure(
    direct: Figures,
    through: list[Figures],
    sizes: Sizes,
    histories: dict[str, Request],
    replayed: dict[str, Replayed],
    anthropic: str,
) -> None:
    ways = [direct, *through]
    # The histories built, out of the collector's sight: a full collection of them (~20 ms)
    # would stall a request in flight and stand in its way's figures.
    gc.freeze()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        client = Client(session)
        for kind, history in histories.items():
            for way in through:
                if way.proxied:
                    _, _, first = await client.call(way, history)
                    way.cold_overhead_ms[kind] = float(first.headers["x-compaction-overhead-ms"])
                    way.tokens[kind] = int(first.headers["x-compaction-tokens-before"])
            await client.rounds("warm-up", history, 3, ways)  # caches and connections
        await client.rounds("warm-up", SMALL, 20, ways)
        await client.rounds("small", SMALL, sizes.small, ways)
        for kind, history in histories.items():
            await client.rounds(kind, history, sizes.large, ways)
        for kind, case in replayed.items():
            for way in through:
                if way.proxied:
                    cold, way.tokens[kind], way.forwarded[kind] = await compact(
                        session, way.url, case
                    )
                    way.cold_overhead_ms[kind] = cold
            await client.replayed("warm-up", case, 3, ways, anthropic)
            await client.replayed(kind, case, sizes.large, ways, anthropic)
        await client.rounds("ttfb", STREAM, sizes.stream, ways, first_byte=True)
        for way in through:
            way.rate_direct, _ = await client.rate(direct, sizes.rate_seconds, direct.pid)
            way.rate, way.cpu_us = await client.rate(way, sizes.rate_seconds, way.pid)
        direct.rate, direct.cpu_us = await client.rate(direct, sizes.rate_seconds, direct.pid)


def sealed_reasoning(upstream: str) -> str:
    """Encrypted reasoning content the fake upstream made, so that it takes it back (as the
    API, it refuses any other)."""
    body = {"model": "o4-mini", "input": "hi", "include": ["reasoning.encrypted_content"]}
    request = urllib.request.Request(f"{upstream}/responses", orjson.dumps(body), HEADERS)
    with urllib.request.urlopen(request, timeout=10) as answer:
        output = orjson.loads(answer.read())["output"]
    return str(next(item for item in output if item["type"] == "reasoning")["encrypted_content"])


def first_chat(server: Server) -> float:
    """Seconds from spawning `server` to its first chat completion answered."""
    request = urllib.request.Request(f"{server.url}{SMALL[0]}", SMALL[1], HEADERS)
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
    return time.perf_counter() - server.spawned


def proxy_config(upstream: str, store: str, key_prefix: str, anthropic: str = "") -> str:
    """The admin API on, and with it the dashboard's bookkeeping of every turn; with
    `anthropic`, Messages go to it, and the replayed turns' model is served at its window."""
    config = f"""
listen: {{host: 127.0.0.1, port: 8080}}
store: {{url: "{store}", key_prefix: "{key_prefix}"}}
upstreams:
  fake: {{base_url: "{upstream}"}}
models:
  - {{match: "{MODEL}", context_window: {WINDOW}}}
admin: {{token: bench-admin-token}}
"""
    if not anthropic:
        return config
    config = config.replace("models:\n", "models:\n" + models_yaml())
    return config.replace(
        "upstreams:\n",
        f"default_upstream: {{chat: fake, responses: fake, messages: claude}}\nupstreams:\n"
        f'  claude: {{base_url: "{anthropic}", kind: anthropic}}\n',
    )


def redis_reachable(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def own_keys(url: str, prefix: str) -> Iterator[None]:
    """Afterwards, delete what the proxy wrote under our prefix (a run without compaction
    writes only the dashboard's turns of its one session, and its row in the list)."""
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
    sizes: Sizes, redis_url: str | None, history: list[dict[str, Any]], compare: str | None
) -> tuple[list[Figures], float, dict[str, Request]]:
    """Start the servers one by one, measure them all, read their memory, stop them.

    Returns the figures, direct first, the cores' worth of CPU other processes used and the
    history requests.
    """
    prefix = f"cpbench-{os.urandom(4).hex()}"
    windows = {MODEL: WINDOW, REPLAYED_MODEL: WINDOW}
    with (
        fake_upstream(windows) as upstream,
        fake_anthropic(windows) as anthropic,
        contextlib.ExitStack() as stack,
    ):
        codex = as_responses_items(history, sealed_reasoning(upstream.url))
        histories = {"history": chat(history), "codex": responses(codex)}
        replayed = cases(history, codex, HEADERS)
        direct = Figures("direct", upstream.url, pid=upstream.pid)
        claude = anthropic.url + "/v1"
        memory = proxy_config(upstream.url, "memory://", prefix, claude)
        starts: list[tuple[str, contextlib.AbstractContextManager[Server], bool]] = [
            ("proxy, memory store", proxy(memory), True)
        ]
        tree = stack.enter_context(checkout(compare)) if compare else None
        if tree:
            starts.append((f"proxy at {compare}, memory store", proxy(memory, tree), True))
        if redis_url:
            # Each proxy its own prefix: their sessions have the same ids.
            for at, code in (("", None), (f" at {compare}", tree)):
                if at and code is None:
                    continue
                own = f"{prefix}{at.replace(' ', '-')}"
                stack.enter_context(own_keys(redis_url, own))
                on_redis = proxy(proxy_config(upstream.url, redis_url, own, claude), code)
                starts.append((f"proxy{at}, Redis store", on_redis, True))
        starts.append(("bare relay (floor)", bare_relay(upstream.url), False))
        through = []
        for name, start, proxied in starts:
            server = stack.enter_context(start)
            way = Figures.of(name, server, proxied)
            way.first_chat_s = first_chat(server)
            way.cold_start_s = server.started_in
            through.append(way)
        pids = [upstream.pid, anthropic.pid, *(way.pid for way in through)]
        started, busy, ours = time.perf_counter(), busy_seconds(), _ours(pids)
        uvloop.run(measure(direct, through, sizes, histories, replayed, claude))
        others = busy_seconds() - busy - (_ours(pids) - ours)
        for way in through:
            memory = memory_mb(way.pid)
            way.rss_mb, way.peak_mb = memory["VmRSS"], memory["VmHWM"]
        busy = max(0.0, others) / (time.perf_counter() - started)
        return [direct, *through], busy, histories


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
        if not way.seconds[kind]:
            return "-"  # not measured this way (the relay does not relay Messages)
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


def _below(ms: float, limit: float) -> str:
    return f"{ms:.2f} ms {_verdict(ms < limit)}"


ROWS: list[tuple[str, Direct, Cell, str, str]] = [
    ("small request, p50", _ms("small", 50), _added("small", 50, 1), "<= +1 ms", "+10.8 ms"),
    ("small request, p99", _ms("small", 99), _added("small", 99), "", ""),
    *(
        row
        for kind, litellm in (("history", "+14.0 ms"), ("codex", ""))
        for row in (
            (f"{{{kind}}}, p50", _ms(kind, 50), _added(kind, 50, 3), "<= +3 ms", litellm),
            (f"{{{kind}}}, p99", _ms(kind, 99), _added(kind, 99), "", ""),
            (
                "proxy's x-compaction-overhead-ms p50, that history",
                _none,
                _proxied(lambda w, kind=kind: f"{percentile(w.overhead_ms[kind], 50):.2f} ms"),
                "",
                "",
            ),
            (
                "the same, first request of it (cold caches)",
                _none,
                _proxied(lambda w, kind=kind: f"{w.cold_overhead_ms[kind]:.2f} ms"),
                "",
                "",
            ),
        )
    ),
    *(
        row
        for kind in KINDS
        for row in (
            (f"{{{kind}}}, p50", _ms(kind, 50), _added(kind, 50, 3), "<= +3 ms", ""),
            (
                "proxy's x-compaction-overhead-ms p50, that turn",
                _none,
                _proxied(lambda w, kind=kind: _below(percentile(w.overhead_ms[kind], 50), 1)),
                "< 1 ms",
                "",
            ),
            (
                "the same, its first replayed turn (its state parsed)",
                _none,
                _proxied(lambda w, kind=kind: f"{w.cold_overhead_ms[kind]:.2f} ms"),
                "",
                "",
            ),
        )
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
    names = {
        kind: f"{max(way.tokens.get(kind, 0) for way in through):,}-token {what}"
        for kind, what in HISTORIES.items()
    }
    for kind, api in KINDS.items():
        sent = max(way.tokens.get(kind, 0) for way in through)
        forwarded = max(way.forwarded.get(kind, 0) for way in through)
        names[kind] = (
            f"compacted session's replayed turn ({api}, {sent:,} tokens sent, {forwarded:,}"
            " forwarded; direct: the forwarded body)"
        )
    head = ["figure", "direct", *(way.name for way in through), "target", "LiteLLM proxy"]
    lines = [
        f"machine: {machine()}",
        f"samples: {sizes.small} small, {sizes.large} of each history and {sizes.stream} streamed"
        " requests"
        f" each way, in turn; {sizes.rate_seconds:g} s per throughput figure",
        f"other processes' CPU meanwhile: {others:.2f} cores",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, of_direct, cell, target, litellm in ROWS:
        cells = [name.format(**names), of_direct(direct)]
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
    history = long_history(HISTORY_TOKENS)
    redis_url = args.redis_url if redis_reachable(args.redis_url) else None
    if redis_url is None:
        print(f"no Redis answers at {args.redis_url}: its run is skipped", file=sys.stderr)
    figures, others, histories = run(sizes, redis_url, history, args.compare)
    print(report(figures, others, sizes))
    took = time.perf_counter() - started
    sizes_kib = ", ".join(
        f"{HISTORIES[kind]} {len(body) / 1024:.0f} KiB" for kind, (_, body) in histories.items()
    )
    print(f"\nhistory bodies: {sizes_kib}; the run took {took:.0f} s")


if __name__ == "__main__":
    main()
