"""Stateful sessions through `compaction-proxy serve` with the Redis store: what a replayed turn
of a 100k-token session adds, and what a compaction turn costs with and without a summary made
ahead of time.

    .venv/bin/python bench/sessions.py [--redis-url redis://127.0.0.1:6379/0] [--delay 1.0]

The fake upstream runs as its own process with a summarizer that takes `--delay` seconds, as a
real LLM would. The proxy serves MODEL at a 32k window:

- replayed: the recorded traces joined into a ~100k-token history; its first request is
  compacted (and summarised), the later ones replay the stored plan. Their latency is set
  against the same forwarded body sent straight to the fake, and against the client's whole
  history sent straight to it (which a real 32k model would refuse).
- compaction turn: a dialogue (the traces' user and assistant text) just over the compact
  level. Not prepared: a new session's first request, which waits for the summarizer.
  Prepared: the session was first sent the dialogue between the prepare and compact levels,
  and the proxy's summary made in the background was waited for (admin API).

Every key is written under a fresh prefix and deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    Server,
    free_port,
    load_traces,
    long_history,
    percentile,
    proxy,
    serve,
)
from compaction import MODEL, budget_for, conditions, default_policy

import policies
from proxy.models.tokens import counter_for
from tests.fakes.openai import FakeUpstream

WINDOW = 32_000
HISTORY_TOKENS = 100_000
HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
PREPARED_TIMEOUT = 20.0
WARM_UP = 3  # request rounds before the samples: connections and caches warm


@contextlib.contextmanager
def fake_upstream(delay: float) -> Iterator[Server]:
    """This script's `--serve-fake` mode in its own process: the fake whose summaries take
    `delay` seconds (the fake upstream's command line has no summary delay)."""
    port = free_port()
    args = [sys.executable, __file__, "--serve-fake", str(port), "--delay", str(delay)]
    with serve(args, "fake", port, "/v1/models") as server:
        yield server


def serve_fake(port: int, delay: float) -> None:
    with FakeUpstream(summary_delay=delay, record=False, port=port):
        threading.Event().wait()


def proxy_config(upstream: str, redis_url: str, prefix: str, admin: str) -> str:
    return f"""
store: {{url: "{redis_url}", key_prefix: "{prefix}"}}
upstreams:
  fake: {{base_url: "{upstream}"}}
models:
  - {{match: "{MODEL}", context_window: {WINDOW}}}
admin: {{token: "{admin}"}}
"""


def dialogue() -> list[dict[str, Any]]:
    """The traces' user and assistant text, joined: a conversation only a summary can shorten."""
    messages: list[dict[str, Any]] = []
    for conversation in load_traces():
        for message in conversation:
            role = message["role"]
            if role == "system" and not messages:
                messages.append(message)
            elif role == "user" or (role == "assistant" and not message.get("tool_calls")):
                messages.append({"role": role, "content": message["content"]})
    return messages


def prefix_of(messages: list[dict[str, Any]], tokens: int) -> list[dict[str, Any]]:
    """The shortest prefix ending with a user message that holds at least `tokens` tokens."""
    counter = counter_for(MODEL)
    total = 3
    for index, message in enumerate(messages):
        total += counter.message(message)
        if total >= tokens and message["role"] == "user":
            return messages[: index + 1]
    raise ValueError(f"the dialogue holds fewer than {tokens} tokens")


def chat(messages: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": messages})


@dataclass
class Figures:
    direct_view: list[float] = field(default_factory=list)
    direct_whole: list[float] = field(default_factory=list)
    through: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)
    forwarded: int = 0
    sent: int = 0
    dialogue_tokens: tuple[int, int] = (0, 0)  # the prepare-level and the compact-level turn
    not_prepared: list[float] = field(default_factory=list)
    prepared: list[float] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)


class Client:
    def __init__(self, session: aiohttp.ClientSession, fake: str, proxy: str, admin: str):
        self.http = session
        self.fake = fake
        self.proxy = proxy
        self.admin = admin
        self.origin = proxy.removesuffix("/v1")

    async def post(self, base: str, body: bytes, session: str) -> tuple[float, dict[str, str]]:
        """Seconds for one chat completion, and the response headers."""
        headers = {**HEADERS, "X-Session-Id": session}
        started = time.perf_counter()
        async with self.http.post(f"{base}/chat/completions", data=body, headers=headers) as r:
            await r.read()
        took = time.perf_counter() - started
        if r.status != 200:
            raise RuntimeError(f"{base} answered {r.status}")
        return took, dict(r.headers)

    async def state(self, key: str) -> dict[str, Any]:
        """The session as the admin API shows it (empty while nothing is stored)."""
        headers = {"Authorization": f"Bearer {self.admin}"}
        async with self.http.get(f"{self.origin}/admin/sessions/{key}", headers=headers) as r:
            if r.status not in (200, 404):
                raise RuntimeError(f"admin API answered {r.status}")
            state: dict[str, Any] = orjson.loads(await r.read()) if r.status == 200 else {}
        return state


def expect(headers: dict[str, str], action: str) -> None:
    done = headers.get("x-compaction-action")
    if done != action:
        raise RuntimeError(f"the proxy did {done!r}, the benchmark expected {action!r}")


async def replayed(client: Client, history: list[dict[str, Any]], runs: int, f: Figures) -> None:
    """Turns of a long session after its compaction: the stored plan applies every time."""
    body = chat(history)
    session = "replay-" + secrets.token_hex(4)
    _, headers = await client.post(client.proxy, body, session)  # compacts, with a summary
    expect(headers, "compacted")
    _, headers = await client.post(client.proxy, body, session)
    expect(headers, "replayed")
    f.sent = int(headers["x-compaction-tokens-before"])
    f.forwarded = int(headers["x-compaction-tokens-after"])
    # What the proxy forwards: the plan it stored, applied to the history.
    branch = (await client.state(headers["x-compaction-session"]))["branches"][0]
    view = policies.render(history, policies.Plan.from_dict(branch["plan"]))
    kinds = {  # where to, what, and the samples
        "through": (client.proxy, body, f.through),
        "view": (client.fake, chat(view), f.direct_view),
        "whole": (client.fake, body, f.direct_whole),
    }
    for i in range(WARM_UP + runs):  # alternate the order, so that drift cancels out
        for kind in list(kinds) if i % 2 else reversed(kinds):
            base, data, samples = kinds[kind]
            took, headers = await client.post(base, data, session)
            if kind == "through":
                expect(headers, "replayed")
            if i >= WARM_UP:
                samples.append(took)
                if kind == "through":
                    f.overhead_ms.append(float(headers["x-compaction-overhead-ms"]))


async def compaction_turns(
    client: Client,
    prepare: list[dict[str, Any]],
    compact: list[dict[str, Any]],
    runs: int,
    f: Figures,
) -> None:
    """The first compaction of a session, with and without a summary prepared ahead of time."""
    for _ in range(runs):
        took, headers = await client.post(
            client.proxy, chat(compact), "cold-" + secrets.token_hex(4)
        )
        expect(headers, "compacted")
        f.not_prepared.append(took)

        session = "ahead-" + secrets.token_hex(4)
        _, headers = await client.post(client.proxy, chat(prepare), session)
        expect(headers, "none")
        started = time.perf_counter()
        while not (await client.state(headers["x-compaction-session"])).get("prepared"):
            if time.perf_counter() - started > PREPARED_TIMEOUT:
                raise RuntimeError("no summary was prepared ahead of time")
            await asyncio.sleep(0.02)
        f.waited.append(time.perf_counter() - started)
        took, headers = await client.post(client.proxy, chat(compact), session)
        expect(headers, "compacted")
        f.prepared.append(took)


def delete_keys(url: str, prefix: str) -> int:
    """Remove every key the proxy wrote under this run's own prefix."""
    with redis.Redis.from_url(url) as store:
        keys = list(store.scan_iter(match=f"{prefix}:*", count=1000))
        return int(store.delete(*keys)) if keys else 0


def ms(samples: list[float], q: float) -> str:
    return f"{percentile(samples, q) * 1000:.1f}"


def report(f: Figures, delay: float) -> list[str]:
    prepare_tokens, compact_tokens = f.dialogue_tokens
    added = [percentile(f.through, q) - percentile(f.direct_view, q) for q in (50, 99)]
    return [
        f"replayed turn: the client sends {f.sent:,} tokens, the proxy forwards {f.forwarded:,}"
        f" ({len(f.through)} requests each way)",
        "",
        "| | p50 ms | p99 ms |",
        "|---|---|---|",
        f"| through the proxy (Redis store) | {ms(f.through, 50)} | {ms(f.through, 99)} |",
        f"| direct, the forwarded body | {ms(f.direct_view, 50)} | {ms(f.direct_view, 99)} |",
        f"| added by the proxy | {added[0] * 1000:+.1f} | {added[1] * 1000:+.1f} |",
        f"| x-compaction-overhead-ms | {percentile(f.overhead_ms, 50):.1f} |"
        f" {percentile(f.overhead_ms, 99):.1f} |",
        f"| direct, the whole history (no proxy) | {ms(f.direct_whole, 50)} |"
        f" {ms(f.direct_whole, 99)} |",
        "",
        f"compaction turn, dialogue of {compact_tokens:,} tokens, summarizer taking {delay:g} s"
        f" ({len(f.prepared)} sessions each):",
        "",
        "| | p50 ms | max ms |",
        "|---|---|---|",
        f"| summary not prepared | {ms(f.not_prepared, 50)} | {ms(f.not_prepared, 100)} |",
        f"| summary prepared ahead of time | {ms(f.prepared, 50)} | {ms(f.prepared, 100)} |",
        f"| (wait for it after the {prepare_tokens:,}-token turn) | {ms(f.waited, 50)} |"
        f" {ms(f.waited, 100)} |",
    ]


async def measure(fake: str, through: str, admin: str, runs: int, sessions: int) -> Figures:
    figures = Figures()
    budget = budget_for(default_policy(), WINDOW)
    talk = dialogue()
    prepare = prefix_of(talk, (budget.prepare_tokens + budget.compact_tokens) // 2)
    compact = prefix_of(talk, budget.compact_tokens + (budget.limit - budget.compact_tokens) // 2)
    counter = counter_for(MODEL)
    figures.dialogue_tokens = (counter.count(prepare, fixed=3), counter.count(compact, fixed=3))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        client = Client(http, fake, through, admin)
        await replayed(client, long_history(HISTORY_TOKENS, MODEL), runs, figures)
        await compaction_turns(client, prepare, compact, sessions, figures)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds per summary")
    parser.add_argument("--runs", type=int, default=100, help="replayed turns each way")
    parser.add_argument("--sessions", type=int, default=5, help="compaction turns each way")
    parser.add_argument("--serve-fake", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake, args.delay)
        return
    prefix = "cpbench-" + secrets.token_hex(6)
    admin = secrets.token_hex(16)
    print(conditions())
    try:
        with (
            fake_upstream(args.delay) as fake,
            proxy(proxy_config(fake.url, args.redis_url, prefix, admin)) as server,
        ):
            figures = asyncio.run(measure(fake.url, server.url, admin, args.runs, args.sessions))
    finally:
        deleted = delete_keys(args.redis_url, prefix)
    print(f"{deleted} Redis keys of the run deleted (prefix {prefix})")
    print("\n".join(report(figures, args.delay)))


if __name__ == "__main__":
    main()
