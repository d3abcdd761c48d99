"""What an upstream of kind litellm costs, for each API a client may speak to it: the same
requests called directly through litellm (in this process) and through `compaction-proxy serve`
with `kind: litellm` upstreams, route by route: chat completions to the fake Anthropic Messages
API (`litellm.acompletion`), Anthropic Messages to the fake OpenAI API's chat completions
(`litellm.anthropic_messages`), the Responses API to the fake Anthropic
(`litellm.aresponses`); and the proxy's memory and cold start with such upstreams, beside the
same proxy with an OpenAI-compatible upstream only (which never imports litellm).

    .venv/bin/python bench/litellm_route.py [--quick]

Prints Markdown tables. Every server is its own process; requests alternate between the two
ways, so that a change in the machine's load shows in both alike. Takes about two minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
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

MODEL = "claude-small"  # on the fake Anthropic
LOCAL = "local-model"  # on the fake OpenAI-compatible server
WINDOW = 1_000_000  # nothing is ever compacted
KEY = "sk-ant-bench"
MESSAGES = [{"role": "user", "content": "Say hello."}]
MAX_TOKENS = 64
HEADERS = {
    "Authorization": "Bearer sk-bench",
    "Content-Type": "application/json",
    "anthropic-version": "2023-06-01",
}


def litellm_config(anthropic: str, local: str) -> str:
    return f"""
upstreams:
  claude:
    kind: litellm
    provider_model: anthropic/{{model}}
    base_url: "{anthropic}"
    api_key: {KEY}
  local:
    kind: litellm
    provider_model: openai/{{model}}
    base_url: "{local}"
    api_key: {KEY}
default_upstream: claude
models:
  - {{match: "{MODEL}", context_window: {WINDOW}}}
  - {{match: "{LOCAL}", upstream: local, context_window: {WINDOW}}}
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


@dataclasses.dataclass(frozen=True)
class Route:
    """One API to one provider: litellm's function and its arguments, the proxy's path and
    body."""

    name: str
    call: str  # litellm's function
    arguments: dict[str, Any]
    path: str
    body: dict[str, Any]


def routes(anthropic: Server, local: Server) -> list[Route]:
    return [
        Route(
            "chat completions → Anthropic",
            "acompletion",
            {"model": f"anthropic/{MODEL}", "api_base": anthropic.url, "messages": MESSAGES},
            "/chat/completions",
            {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS},
        ),
        Route(
            "Messages → chat-completions server",
            "anthropic_messages",
            {"model": f"openai/{LOCAL}", "api_base": local.url, "messages": MESSAGES},
            "/messages",
            {"model": LOCAL, "messages": MESSAGES, "max_tokens": MAX_TOKENS},
        ),
        Route(
            "Responses → Anthropic",
            "aresponses",
            {"model": f"anthropic/{MODEL}", "api_base": anthropic.url, "input": MESSAGES},
            "/responses",
            {"model": MODEL, "input": MESSAGES, "max_output_tokens": MAX_TOKENS, "store": False},
        ),
    ]


class Ways:
    """The two ways to the fakes, timed alike: seconds to the end, or to the first chunk."""

    def __init__(self, litellm: Any, through: Server) -> None:
        self.litellm = litellm
        self.through = through
        self.seconds: dict[str, list[float]] = {}

    async def direct(self, route: Route, session: aiohttp.ClientSession, stream: bool) -> float:
        started = time.perf_counter()
        cap = "max_output_tokens" if route.call == "aresponses" else "max_tokens"
        call = getattr(self.litellm, route.call)
        answer = await call(**route.arguments, **{cap: MAX_TOKENS}, api_key=KEY, stream=stream)
        if not stream:
            assert answer
            return time.perf_counter() - started
        first = await anext(answer)
        took = time.perf_counter() - started
        assert first
        async for _ in answer:
            pass
        return took

    async def proxied(self, route: Route, session: aiohttp.ClientSession, stream: bool) -> float:
        started = time.perf_counter()
        data = orjson.dumps({**route.body, "stream": True} if stream else route.body)
        url = self.through.url + route.path
        async with session.post(url, data=data, headers=HEADERS) as response:
            first = await response.content.readany()
            took = time.perf_counter() - started
            rest = await response.read()
        if response.status != 200 or not first:
            raise RuntimeError(f"the proxy answered {response.status}: {first + rest!r}")
        return took if stream else time.perf_counter() - started

    async def run(self, every: list[Route], count: int) -> None:
        async with aiohttp.ClientSession() as session:
            for route in every:
                for kind, stream in (("warm-up", False), ("small", False), ("ttfb", True)):
                    for i in range(count if kind != "warm-up" else 20):
                        pair = [("direct", self.direct), ("proxy", self.proxied)]
                        for name, call in pair if i % 2 else pair[::-1]:
                            took = await call(route, session, stream)
                            key = f"{route.name} {kind} {name}"
                            self.seconds.setdefault(key, []).append(took)


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

    # litellm's import and warm-up take the proxy seconds to start, tens on a busy machine.
    common.START_TIMEOUT = 120.0
    litellm = load_litellm()
    started = time.perf_counter()
    with (
        fake_anthropic({MODEL: WINDOW}) as anthropic,
        fake_upstream({"gpt-4o": WINDOW, LOCAL: WINDOW}) as fake,
    ):
        with proxy(openai_config(fake.url)) as plain:
            plain_first = first_chat(plain, "gpt-4o")
            plain_memory = memory_mb(plain.pid)
        with proxy(litellm_config(anthropic.url, fake.url)) as through:
            through_first = first_chat(through, MODEL)
            ways = Ways(litellm, through)
            every = routes(anthropic, fake)
            pids = [anthropic.pid, fake.pid, through.pid]
            ran, busy, ours = time.perf_counter(), busy_seconds(), _ours(pids)
            uvloop.run(ways.run(every, count))
            others = busy_seconds() - busy - (_ours(pids) - ours)
            others = max(0.0, others) / (time.perf_counter() - ran)
            memory = memory_mb(through.pid)
    s = ways.seconds

    def ms(key: str, q: float) -> str:
        return f"{percentile(s[key], q) * 1000:.2f} ms"

    def added(key: str, q: float) -> str:
        value = percentile(s[f"{key} proxy"], q) - percentile(s[f"{key} direct"], q)
        return f"{value * 1000:+.2f} ms"

    print(f"machine: {machine()}")
    print(f"samples: {count} of each kind each way, alternating, route after route")
    print(f"other processes' CPU meanwhile: {others:.2f} cores\n")
    print("| route | figure | litellm called directly | through the proxy | added |")
    print("|---|---|---|---|---|")
    for route in every:
        for kind, label in (("small", "small request"), ("ttfb", "streamed, first chunk")):
            for q in (50, 99):
                key = f"{route.name} {kind}"
                row = [route.name, f"{label}, p{q}", ms(f"{key} direct", q)]
                row += [ms(f"{key} proxy", q), added(key, q)]
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
