"""Memory at volume: what a long agent session keeps in Redis, the proxy's RSS with 10k and
100k sessions in its memory store, and the bound of the per-message memos.

    .venv/bin/python bench/memory.py [--quick]

1. Redis bytes per session. `compaction-proxy serve` on a Redis of the script's own, gpt-4o at
   a 128k window, the fake upstream (its own process) answering summaries of up to
   SUMMARY_TOKENS tokens, as a model does. The recorded traces joined into one ~200k-token
   agent session are sent as a client sends them, the whole history every turn (every
   fifth turn, to save time: the state depends on the compactions, not on every turn). Then
   `MEMORY USAGE` of the session's keys: its state (the plans, the summary prepared ahead,
   decisions, memory candidates, calibration), its fence, and its lock while held.
2. RSS with N sessions in the memory store. A process builds the proxy as `serve` does
   (create_app, tokenizer loaded), fills its memos to their bound (token counts, digests, chat's
   messages read), then stores N copies (each its own bytes) of that session's state, with a
   calibration each: VmRSS at each step.
3. The memos. Requests of K sessions of ~1,000 messages each (none compacted), in turn, through
   `Compactor.prepare`: the memos' hit rate and the time per request once every session was
   seen, for K around the memos' bound.
4. The per-process ledgers (prompt-cache figures not yet written, calibration, exact counts),
   each bounded by `store.max_sessions`: bytes per session (tracemalloc), its key included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import free_port, long_history, machine, memory_mb, percentile, proxy, serve
from compaction import LARGE_MODEL, request_of
from compaction import proxy_config as unbounded_config

from proxy.compaction.exact_count import Counted
from proxy.config import loads
from proxy.dialects import Usage
from proxy.dialects.openai.chat import Chat
from proxy.memo import content_keys
from proxy.models.calibration import Calibration, Counting
from proxy.observability.metrics import Metrics
from proxy.server.app import Proxy, create_app
from proxy.sessions.cache_usage import CacheLedger
from proxy.sessions.sessions import session_key
from proxy.sessions.store import MemoryStore, RedisStore
from proxy.upstream.client import UpstreamClient
from tests.conversations import words
from tests.fakes.openai import FakeUpstream
from tests.redis_servers import redis_server

MODEL = "gpt-4o"
WINDOW = 128_000
SESSION_TOKENS = 200_000
SUMMARY_TOKENS = 2_000
EVERY = 5  # one request every EVERY assistant turns
PREFIX = "cpbench"
# What the ledgers' ratios are learnt for, one object each (as `Limits` holds it).
EXACT, ESTIMATED = Counting(f"o200k_base:{MODEL}", True), Counting(f"estimate:{MODEL}", False)


# -- 1. Redis bytes per session ---------------------------------------------------------------


def summary_of_size(body: dict[str, Any]) -> str:
    """A summary as long as a model would write: SUMMARY_TOKENS, or the cap it was given."""
    cap = body.get("max_completion_tokens") or body.get("max_tokens") or SUMMARY_TOKENS
    return words(int(min(cap, SUMMARY_TOKENS) / 1.4), 7)


def serve_fake(port: int) -> None:
    with FakeUpstream(summarizer=summary_of_size, record=False, port=port, windows={MODEL: 10**6}):
        threading.Event().wait()


@contextlib.contextmanager
def sized_fake() -> Iterator[str]:
    port = free_port()
    args = [sys.executable, __file__, "--serve-fake", str(port)]
    with serve(args, "fake", port, "/v1/models") as server:
        yield server.url


def session_config(redis_url: str, fake: str) -> str:
    return f"""
store: {{url: "{redis_url}", key_prefix: {PREFIX}}}
upstreams:
  fake: {{base_url: "{fake}"}}
models:
  - {{match: "{MODEL}", context_window: {WINDOW}}}
"""


def turns(messages: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """What a client sends before every EVERY-th assistant message, then the whole session."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i in assistant[EVERY - 1 :: EVERY]:
        yield messages[:i]
    yield messages


def session_bytes(redis_url: str) -> tuple[dict[str, int], bytes, int]:
    """Replay the session; (key sizes, its state's bytes, requests sent)."""
    messages = long_history(SESSION_TOKENS, MODEL)
    headers = {"Authorization": "Bearer sk-bench", "X-Session-Id": "long-agent-session"}
    sent = 0
    with sized_fake() as fake, proxy(session_config(redis_url, fake)) as server:
        with httpx.Client(timeout=120) as http:
            for prefix in turns(messages):
                body = orjson.dumps({"model": MODEL, "messages": prefix})
                response = http.post(
                    f"{server.url}/chat/completions", content=body, headers=headers
                )
                response.raise_for_status()
                key = response.headers["x-compaction-session"]
                sent += 1
        time.sleep(1)  # a summary being prepared ahead of time lands
    tagged = f"{PREFIX}:{{{key}}}"
    with redis.Redis.from_url(redis_url) as client:
        sizes = {
            "state": int(client.memory_usage(f"{tagged}:state", samples=0)),
            "fence": int(client.memory_usage(f"{tagged}:fence", samples=0)),
        }
        data = client.hget(f"{tagged}:state", "d")
    store = RedisStore(redis_url, ttl_seconds=60, key_prefix=PREFIX)

    async def held_lock() -> int:
        token = await store.acquire_lock(key, 30)
        assert token is not None
        with redis.Redis.from_url(redis_url) as client:
            size = int(client.memory_usage(f"{tagged}:lock", samples=0))
        await store.release_lock(key, token)
        await store.close()
        return size

    sizes["lock (while held)"] = asyncio.run(held_lock())
    assert isinstance(data, bytes)
    return sizes, data, sent


def parts(state: bytes) -> dict[str, int]:
    """Serialised bytes of each part of a session's state."""
    fields = orjson.loads(state)
    return {name: len(orjson.dumps(value)) for name, value in fields.items()}


# -- 2. RSS with N sessions in the memory store -----------------------------------------------


def child(state_file: str, counts: list[int]) -> None:
    """In its own process: VmRSS of the proxy as `serve` builds it, then with its memos full,
    then with each count of sessions stored; printed as JSON."""
    state = Path(state_file).read_bytes()
    config = loads(
        f"""
store: {{url: "memory://", max_sessions: {max(counts)}}}
upstreams:
  fake: {{base_url: "http://127.0.0.1:{free_port()}/v1"}}
"""
    )
    app = create_app(config)
    proxy: Proxy = app.state.proxy
    proxy.limits.warm_up()
    figures: dict[str, float] = {}

    def rss(name: str) -> None:
        gc.collect()
        figures[name] = memory_mb(os.getpid())["VmRSS"]

    rss("started")
    # The memos at their bound: distinct messages of the traces' kinds.
    counter = proxy.limits.limits(MODEL).counter
    base = long_history(100_000, MODEL)
    size = counter.cache_info().maxsize
    messages = [_tagged(base[i % len(base)], i) for i in range(size)]
    keys = content_keys(messages)
    counter.counts(messages, keys)
    proxy.compactor.histories.digests(messages, keys)
    # Chat's memo of the messages it read, by their bytes, at its bound.
    chat = next(handler.dialect for handler in proxy.handlers if isinstance(handler.dialect, Chat))
    bound, fed = chat.known.memo.max_bytes or 0, 0
    while fed < 2 * bound:  # both generations full of distinct messages
        body = orjson.dumps({"model": MODEL, "messages": [_tagged(m, fed) for m in base]})
        chat.parse(body)
        fed += len(body)
    rss("memos full")
    store = proxy.store
    assert isinstance(store, MemoryStore)

    async def fill(start: int, end: int) -> None:
        for i in range(start, end):
            key = session_key("bench", str(i))
            await store.compare_and_set(key, 0, bytearray(state))
            proxy.calibration.observe(key, EXACT, 1050, 1000)

    done = 0
    for count in counts:
        asyncio.run(fill(done, count))
        done = count
        rss(f"{count} sessions")
    print(json.dumps(figures))


def _tagged(message: dict[str, Any], i: object) -> dict[str, Any]:
    """`message` made distinct (another memo entry) by a number in its text."""
    content = message.get("content")
    return {**message, "content": f"{i}: {content if isinstance(content, str) else ''}"}


def rss_with_sessions(state: bytes, counts: list[int]) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".state") as file:
        file.write(state)
        file.flush()
        args = [sys.executable, __file__, "--child", file.name, *map(str, counts)]
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.splitlines()[-1]))


# -- 3. The memos and the replay path ---------------------------------------------------------


async def memo_knee(actives: list[int], rounds: int) -> list[tuple[int, int, float, float]]:
    """(sessions, messages, hit rate, p50 ms of Compactor.prepare) for each number of sessions
    talking at once, in turn."""
    base = long_history(100_000, MODEL)
    results = []
    for active in actives:
        config = unbounded_config()
        metrics = Metrics()
        proxy = Proxy(config, MemoryStore(ttl_seconds=3600), UpstreamClient(metrics), metrics)
        counter = proxy.limits.limits(LARGE_MODEL).counter
        sessions = [
            request_of(
                config,
                LARGE_MODEL,
                Chat(),
                {"messages": [_tagged(m, f"{active}.{s}") for m in base]},
            )
            for s in range(active)
        ]
        for chat in sessions:  # every session seen once
            await proxy.compactor.prepare(chat)
        before = counter.cache_info()
        took = []
        for _ in range(rounds):
            for chat in sessions:
                started = time.perf_counter()
                await proxy.compactor.prepare(chat)
                took.append(time.perf_counter() - started)
        after = counter.cache_info()
        hits = (after.hits - before.hits) / max(
            1, after.hits + after.misses - before.hits - before.misses
        )
        results.append((active, active * len(base), hits, percentile(took, 50) * 1000))
        await proxy.prepared.close()
        await proxy.client.close()
    return results


def ledger_bytes(count: int) -> dict[str, float]:
    """Bytes per session of each per-process ledger holding `count` sessions, each with its
    own key (held by the ledger once the request is gone) and figures past the small ints."""

    def per_session(fill: Callable[[list[str]], object]) -> float:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = fill([session_key("t", f"ledger-{i}") for i in range(count)])
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del kept
        return (after - before) / count

    def cache(keys: list[str]) -> CacheLedger:
        ledger = CacheLedger(count)
        for i, key in enumerate(keys):
            for _ in range(2):
                ledger.observe(key, Usage(50_000 + i, 40_000 + i, 1_000 + i))
        return ledger

    def calibration(keys: list[str]) -> Calibration:
        ratios = Calibration(count)
        for key in keys:
            ratios.observe(key, ESTIMATED, 1_234, 1_000)
        return ratios

    def counted(keys: list[str]) -> dict[str, Counted]:
        # As ExactCounts keeps them: the model as parsed (its own string), two hashes.
        return {
            key: Counted("".join(MODEL), key.upper(), 400 + i, key[::-1], 150_000 + i, 160_000 + i)
            for i, key in enumerate(keys)
        }

    return {
        "CacheLedger": per_session(cache),
        "Calibration": per_session(calibration),
        "ExactCounts": per_session(counted),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--serve-fake", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake)
        return
    if args.child:
        child(args.child[0], [int(n) for n in args.child[1:]])
        return
    started = time.perf_counter()
    print(f"machine: {machine()}\n")
    port = free_port()
    with redis_server(port):
        sizes, state, sent = session_bytes(f"redis://127.0.0.1:{port}/0")
    print(
        f"1. A long agent session in Redis ({sent} requests, summaries of up to "
        f"{SUMMARY_TOKENS} tokens, gpt-4o at {WINDOW:,} tokens):\n"
    )
    print("| key | MEMORY USAGE |\n|---|---|")
    for name, size in sizes.items():
        print(f"| {name} | {size:,} B |")
    print(f"| total | {sum(sizes.values()):,} B |\n")
    print(f"the state's record ({len(state):,} B serialised):\n")
    print("| part | bytes |\n|---|---|")
    for name, size in parts(state).items():
        print(f"| {name} | {size:,} |")
    counts = [1_000, 10_000] if args.quick else [10_000, 100_000]
    figures = rss_with_sessions(state, counts)
    print("\n2. The proxy's RSS with sessions of that state in the memory store:\n")
    print("| | VmRSS | per session |\n|---|---|---|")
    previous, stored = figures["memos full"], 0
    for name, value in figures.items():
        per = ""
        if name.endswith("sessions"):
            count = int(name.split()[0])
            per = f"{(value - previous) * 2**20 / (count - stored) / 1024:.1f} KiB"
            previous, stored = value, count
        print(f"| {name} | {value:,.0f} MB | {per} |")
    actives = [8, 16, 24, 32, 48, 64] if not args.quick else [8, 32, 64]
    print("\n3. Sessions talking at once, each ~1,000 messages, in turn (not compacted):\n")
    print("| sessions | distinct messages | memo hit rate | Compactor.prepare p50 |")
    print("|---|---|---|---|")
    for active, distinct, hits, p50 in asyncio.run(memo_knee(actives, 2 if args.quick else 3)):
        print(f"| {active} | {distinct:,} | {hits:.1%} | {p50:.1f} ms |")
    print("\n4. The per-process ledgers, bytes per session (its key included):\n")
    print("| ledger | bytes per session | at store.max_sessions 10,000 |\n|---|---|---|")
    for name, size in ledger_bytes(10_000).items():
        print(f"| {name} | {size:,.0f} B | {size * 10_000 / 2**20:.1f} MiB |")
    print(f"\nthe run took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
