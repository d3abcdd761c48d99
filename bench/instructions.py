"""Instructions the proxy's process runs per small request, counted by valgrind's callgrind:
a figure that does not move with the machine's load, as overhead.py's times do.

    .venv/bin/python bench/instructions.py [--compare REV] [--requests 200] [--streamed] [--redis]
    .venv/bin/python bench/instructions.py --replayed [--compare REV] [--requests 30]

Each way is `compaction-proxy serve` under `valgrind --tool=callgrind --instr-atstart=no` in
front of the fake upstream (in-memory store, the admin API on): 100 small requests to warm up,
then instrumentation on for `--requests` more, 4 at a time over keep-alive connections, and
the count of instructions read from callgrind's dump, divided by the requests. The ways: this
code (the dashboard's bookkeeping of every turn on, as with the admin API it is by default),
this code with `admin.dashboard.enabled: false`, and with --compare, REV's code.
`--streamed`: the small request streamed instead (overhead.py's time-to-first-byte case, its
events 1 ms apart); `--redis`: the Redis store instead of the in-memory one.

`--replayed`: per replayed turn of a compacted session instead (overhead.py's case, each
API, the Redis store), one turn at a time: each API's session compacted and 5 turns replayed,
then `--requests` turns counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import ROOT, fake_upstream, free_port, serve
from overhead import (
    HEADERS,
    SMALL,
    STREAM,
    STREAM_HEADERS,
    checkout,
    own_keys,
    proxy_config,
    sealed_reasoning,
)
from replayed_turns import Replayed, cases, compact

WARM_UP = 100
CONCURRENCY = 4
ADMIN = "admin: {token: bench-admin-token}"
NO_DASHBOARD = "admin: {token: bench-admin-token, dashboard: {enabled: false}}"


@contextlib.contextmanager
def counted(config_yaml: str, profile: Path, tree: Path = ROOT) -> Iterator[common.Server]:
    """The proxy of `tree` under callgrind, counting nothing until told to."""
    port = free_port()
    config = profile.with_suffix(".yaml")
    config.write_text(config_yaml)
    args = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={profile}",
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
    ]
    common.START_TIMEOUT = 600.0  # the interpreter starts 50 times slower under valgrind
    with serve(args, "callgrind", port, "/healthz", tree) as server:
        yield server


async def send(url: str, count: int, streamed: bool = False) -> None:
    path, body = STREAM if streamed else SMALL
    headers = STREAM_HEADERS if streamed else HEADERS
    async with aiohttp.ClientSession() as session:

        async def worker(share: int) -> None:
            for _ in range(share):
                async with session.post(url + path, data=body, headers=headers) as response:
                    assert response.status == 200, await response.text()
                    await response.read()

        await asyncio.gather(*(worker(count // CONCURRENCY) for _ in range(CONCURRENCY)))


async def replay(url: str, case: Replayed, turns: int, first: bool = False) -> None:
    """`turns` replayed turns of `case`'s session, one at a time; `first`: compact it first."""
    async with aiohttp.ClientSession() as session:
        if first:
            await compact(session, url, case)
        for _ in range(turns):
            async with session.post(url + case.path, data=case.sent, headers=case.headers) as r:
                await r.read()
                assert r.status == 200 and r.headers["x-compaction-action"] == "replayed"


def per_request(
    server: common.Server,
    profile: Path,
    requests: int,
    case: Replayed | None = None,
    streamed: bool = False,
) -> float:
    """Millions of instructions per request, of `requests` counted after the warm-up: small
    requests (`streamed` or not), or `case`'s replayed turns."""
    if case is None:
        asyncio.run(send(server.url, WARM_UP, streamed))
    else:
        asyncio.run(replay(server.url, case, 5, first=True))
    pid = str(server.pid)
    # On from here, the counts zeroed: toggling it off between two cases, callgrind's next
    # total wraps around below zero.
    for command in ("--instr=on", "--zero"):
        subprocess.run(["callgrind_control", command, pid], check=True, capture_output=True)
    if case is None:
        asyncio.run(send(server.url, requests, streamed))
    else:
        asyncio.run(replay(server.url, case, requests))
    subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
    dumps = sorted(profile.parent.glob(profile.name + "*"), key=lambda p: p.stat().st_mtime)
    total = re.search(rb"^(?:summary|totals): (\d+)", dumps[-1].read_bytes(), re.M)
    assert total is not None, dumps[-1]
    return int(total[1]) / requests / 1e6


def replayed(compare: str | None, requests: int, redis_url: str) -> None:
    """Instructions per replayed turn of a compacted session, each API, this code and REV's."""
    history = common.long_history(100_000)
    windows = {"gpt-4o": 1_000_000, "gpt-4o-32k": 1_000_000}
    with (
        fake_upstream(windows) as upstream,
        common.fake_anthropic(windows) as anthropic,
        contextlib.ExitStack() as stack,
    ):
        items = common.as_responses_items(history, sealed_reasoning(upstream.url))
        ways = [("this code", ROOT)]
        if compare:
            ways.append((compare, stack.enter_context(checkout(compare))))
        print(
            "| code | "
            + " | ".join(f"replayed turn, {api}" for api in ("chat", "responses", "messages"))
            + " |"
        )
        print("|---|---|---|---|")
        for name, tree in ways:
            prefix = f"cpbench-{os.urandom(4).hex()}"
            config = proxy_config(upstream.url, redis_url, prefix, anthropic.url + "/v1")
            figures = []
            with own_keys(redis_url, prefix), tempfile.TemporaryDirectory() as folder:
                profile = Path(folder) / "callgrind.out"
                with counted(config, profile, tree) as server:
                    for case in cases(history, items, HEADERS).values():
                        figures.append(per_request(server, profile, requests, case))
            print(f"| {name} | " + " | ".join(f"{f:.2f} M" for f in figures) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", help="also count this revision's code")
    parser.add_argument("--requests", type=int, help="counted (default: 200, replayed 30)")
    parser.add_argument("--replayed", action="store_true", help="replayed compacted turns")
    parser.add_argument("--streamed", action="store_true", help="small streamed requests")
    parser.add_argument("--redis", action="store_true", help="the Redis store (--redis-url)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    if args.replayed:
        replayed(args.compare, args.requests or 30, args.redis_url)
        return
    with fake_upstream({"gpt-4o": 1_000_000}) as upstream, contextlib.ExitStack() as stack:
        prefix = f"cpbench-{os.urandom(4).hex()}"
        if args.redis:
            stack.enter_context(own_keys(args.redis_url, prefix))
        store = args.redis_url if args.redis else "memory://"
        config = proxy_config(upstream.url, store, prefix)
        ways = [("this code, the dashboard's bookkeeping on", config, ROOT)]
        off = config.replace(ADMIN, NO_DASHBOARD)
        ways.append(("this code, admin.dashboard.enabled: false", off, ROOT))
        if args.compare:
            ways.append((f"{args.compare}", config, stack.enter_context(checkout(args.compare))))
        kind = "small streamed request" if args.streamed else "small request"
        print(f"| code | instructions per {kind}, {store.split(':')[0]} store |\n|---|---|")
        for name, yaml_text, tree in ways:
            with tempfile.TemporaryDirectory() as folder:
                profile = Path(folder) / "callgrind.out"
                with counted(yaml_text, profile, tree) as server:
                    figure = per_request(server, profile, args.requests or 200, None, args.streamed)
            print(f"| {name} | {figure:.3f} M |", flush=True)


if __name__ == "__main__":
    main()
