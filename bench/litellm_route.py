"""What an upstream of kind litellm costs: the same requests to the fake Anthropic Messages API
called directly through litellm (in this process) and through `compaction-proxy serve` with a
`kind: litellm` upstream; and the proxy's memory and cold start with that upstream, beside the
same proxy with an OpenAI-compatible upstream only (which never imports litellm).

    .venv/bin/python bench/litellm_route.py [--quick]

Prints a Markdown table. Every server is its own process; requests alternate between the two
ways, so that a change in the machine's load shows in both alike. Takes about a minute.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    Server,
    busy_seconds,
    cpu_seconds,
    fake_anthropic,
    fake_upstream,
    machine,
    memory_mb,
    percentile,
    proxy,
)

MODEL = "claude-small"
WINDOW = 1_000_000  # nothing is ever compacted
KEY = "sk-ant-bench"
MESSAGES = [{"role": "user", "content": "Say hello."}]
MAX_TOKENS = 64
HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}


def litellm_config(anthropic: str) -> str:
    return f"""
upstreams:
  claude:
    kind: litellm
    provider_model: anthropic/{{model}}
    base_url: "{anthropic}"
    api_key: {KEY}
models:
  - {{match: "{MODEL}", context_window: {WINDOW}}}
"""


def openai_config(upstream: str) -> str:
    return f"""
upstreams:
  fake: {{base_url: "{upstream}"}}
models:
  - {{match: "gpt-4o", context_window: {WINDOW}}}
"""


def body(model: str, stream: bool) -> bytes:
    fields: dict[str, Any] = {"model": model, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    return orjson.dumps({**fields, "stream": True} if stream else fields)


class Ways:
    """The two ways to the fake, timed alike: seconds to the end, or to the first chunk."""

    def __init__(self, litellm: Any, anthropic: Server, through: Server) -> None:
        self.litellm = litellm
        self.anthropic = anthropic
        self.url = f"{through.url}/chat/completions"
        self.seconds: dict[str, list[float]] = {}

    async def direct(self, session: aiohttp.ClientSession, stream: bool) -> float:
        started = time.perf_counter()
        answer = await self.litellm.acompletion(
            model=f"anthropic/{MODEL}",
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            api_base=self.anthropic.url,
            api_key=KEY,
            stream=stream,
        )
        if not stream:
            assert answer.choices[0].message.content
            return time.perf_counter() - started
        first = await anext(answer)
        took = time.perf_counter() - started
        assert first.choices
        async for _ in answer:
            pass
        return took

    async def proxied(self, session: aiohttp.ClientSession, stream: bool) -> float:
        started = time.perf_counter()
        async with session.post(self.url, data=body(MODEL, stream), headers=HEADERS) as response:
            first = await response.content.readany()
            took = time.perf_counter() - started
            rest = await response.read()
        if response.status != 200 or not first:
            raise RuntimeError(f"the proxy answered {response.status}: {first + rest!r}")
        return took if stream else time.perf_counter() - started

    async def run(self, count: int) -> None:
        async with aiohttp.ClientSession() as session:
            for kind, stream in (("warm-up", False), ("small", False), ("ttfb", True)):
                for i in range(count if kind != "warm-up" else 20):
                    pair = [("direct", self.direct), ("proxy", self.proxied)]
                    for name, call in pair if i % 2 else pair[::-1]:
                        took = await call(session, stream)
                        self.seconds.setdefault(f"{kind} {name}", []).append(took)


def first_chat(server: Server, model: str) -> float:
    """Seconds from spawning `server` to its first chat completion answered."""
    import urllib.request

    request = urllib.request.Request(f"{server.url}/chat/completions", body(model, False), HEADERS)
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return time.perf_counter() - server.spawned


def _ours(pids: list[int]) -> float:
    return cpu_seconds() + sum(cpu_seconds(pid) for pid in pids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the samples")
    count = 30 if parser.parse_args().quick else 300
    from proxy.upstream.litellm_setup import load_litellm  # set up as the proxy sets it up

    litellm = load_litellm()
    started = time.perf_counter()
    with fake_anthropic({MODEL: WINDOW}) as anthropic, fake_upstream({"gpt-4o": WINDOW}) as fake:
        with proxy(openai_config(fake.url)) as plain:
            plain_first = first_chat(plain, "gpt-4o")
            plain_memory = memory_mb(plain.pid)
        with proxy(litellm_config(anthropic.url)) as through:
            through_first = first_chat(through, MODEL)
            ways = Ways(litellm, anthropic, through)
            pids = [anthropic.pid, through.pid]
            ran, busy, ours = time.perf_counter(), busy_seconds(), _ours(pids)
            uvloop.run(ways.run(count))
            others = busy_seconds() - busy - (_ours(pids) - ours)
            others = max(0.0, others) / (time.perf_counter() - ran)
            memory = memory_mb(through.pid)
    s = ways.seconds

    def ms(key: str, q: float) -> str:
        return f"{percentile(s[key], q) * 1000:.2f} ms"

    def added(kind: str, q: float) -> str:
        value = percentile(s[f"{kind} proxy"], q) - percentile(s[f"{kind} direct"], q)
        return f"{value * 1000:+.2f} ms"

    print(f"machine: {machine()}")
    print(f"samples: {count} of each kind each way, alternating")
    print(f"other processes' CPU meanwhile: {others:.2f} cores\n")
    print("| figure | litellm called directly | through the proxy (kind litellm) | added |")
    print("|---|---|---|---|")
    for kind, label in (("small", "small request"), ("ttfb", "streaming, time to first chunk")):
        for q in (50, 99):
            row = [
                f"{label}, p{q}",
                ms(f"{kind} direct", q),
                ms(f"{kind} proxy", q),
                added(kind, q),
            ]
            print("| " + " | ".join(row) + " |")
    print("\n| figure | proxy, kind litellm | proxy, OpenAI-compatible upstream only |")
    print("|---|---|---|")
    print(
        f"| RSS after the run (peak) | {memory['VmRSS']:.0f} MB ({memory['VmHWM']:.0f}) | "
        f"{plain_memory['VmRSS']:.0f} MB ({plain_memory['VmHWM']:.0f}), after one request |"
    )
    print(
        f"| cold start: spawn to first /healthz 200 | {through.started_in:.2f} s | "
        f"{plain.started_in:.2f} s |"
    )
    print(
        f"| spawn to first chat completion answered | {through_first:.2f} s | {plain_first:.2f} s |"
    )
    print(f"\nthe run took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
