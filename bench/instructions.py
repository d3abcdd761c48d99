"""Instructions the proxy's process runs per small request, counted by valgrind's callgrind:
a figure that does not move with the machine's load, as overhead.py's times do.

    .venv/bin/python bench/instructions.py [--compare REV] [--requests 200]

Each way is `compaction-proxy serve` under `valgrind --tool=callgrind --instr-atstart=no` in
front of the fake upstream (in-memory store, the admin API on): 100 small requests to warm up,
then instrumentation on for `--requests` more, 4 at a time over keep-alive connections, and
the count of instructions read from callgrind's dump, divided by the requests. The ways: this
code (the dashboard's bookkeeping of every turn on, as with the admin API it is by default),
this code with `admin.dashboard.enabled: false`, and with --compare, REV's code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from overhead import HEADERS, SMALL, checkout, proxy_config

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


async def send(url: str, count: int) -> None:
    path, body = SMALL
    async with aiohttp.ClientSession() as session:

        async def worker(share: int) -> None:
            for _ in range(share):
                async with session.post(url + path, data=body, headers=HEADERS) as response:
                    assert response.status == 200, await response.text()
                    await response.read()

        await asyncio.gather(*(worker(count // CONCURRENCY) for _ in range(CONCURRENCY)))


def per_request(server: common.Server, profile: Path, requests: int) -> float:
    """Millions of instructions per request, of `requests` counted after the warm-up."""
    asyncio.run(send(server.url, WARM_UP))
    pid = str(server.pid)
    subprocess.run(["callgrind_control", "--instr=on", pid], check=True, capture_output=True)
    asyncio.run(send(server.url, requests))
    subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
    dumps = sorted(profile.parent.glob(profile.name + "*"), key=lambda p: p.stat().st_mtime)
    total = re.search(rb"^(?:summary|totals): (\d+)", dumps[-1].read_bytes(), re.M)
    assert total is not None, dumps[-1]
    return int(total[1]) / requests / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", help="also count this revision's code")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    with fake_upstream({"gpt-4o": 1_000_000}) as upstream, contextlib.ExitStack() as stack:
        config = proxy_config(upstream.url, "memory://", "cpbench")
        ways = [("this code, the dashboard's bookkeeping on", config, ROOT)]
        off = config.replace(ADMIN, NO_DASHBOARD)
        ways.append(("this code, admin.dashboard.enabled: false", off, ROOT))
        if args.compare:
            ways.append((f"{args.compare}", config, stack.enter_context(checkout(args.compare))))
        print("| code | instructions per small request |\n|---|---|")
        for name, yaml_text, tree in ways:
            with tempfile.TemporaryDirectory() as folder:
                profile = Path(folder) / "callgrind.out"
                with counted(yaml_text, profile, tree) as server:
                    figure = per_request(server, profile, args.requests)
            print(f"| {name} | {figure:.3f} M |", flush=True)


if __name__ == "__main__":
    main()
