"""`serve --workers N`: requests/s and CPU time per request with 1 and 2 workers, each in front
of the same fake upstream, with the Redis store (which more than one worker needs).

    .venv/bin/python bench/workers.py [--redis-url redis://127.0.0.1:6379/0] [--rounds 3]
                                      [--seconds 3]

Each round loads the fake upstream direct, then each proxy in turn, with overhead.py's load:
16 concurrent clients sending small chat completions back to back over keep-alive
connections (the bench's own process), for `--seconds`. CPU time per request is the user +
system time of the proxy's processes over the run (`/proc/PID/stat`; the parent's, which only
waits, included), divided by the requests, and each worker's share of the requests by its own
CPU time. Prints a Markdown table of the medians over the rounds, and the load.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Server, busy_seconds, cpu_seconds, fake_upstream, machine, proxy
from overhead import MODEL, WINDOW, Client, Figures, own_keys, proxy_config, redis_reachable

WORKERS = (1, 2)


def workers_of(parent: int) -> list[int]:
    """The worker processes of `serve --workers N` (multiprocessing's spawned interpreters);
    none for one, which serves in the process itself."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def served_requests(worker: int) -> float:
    """The requests worker `worker` (a pid) has answered, asked of its own Unix socket as its
    siblings ask (proxy/observability/worker_metrics.py), found by its inode."""
    inodes = set()
    for fd in Path(f"/proc/{worker}/fd").iterdir():
        with contextlib.suppress(OSError):
            if (target := os.readlink(fd)).startswith("socket:["):
                inodes.add(target[8:-1])
    path = next(
        fields[7]
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]
        if len(fields := line.split()) == 8 and fields[6] in inodes and "-worker-" in fields[7]
    )
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect("\0" + path.removeprefix("@"))  # an abstract socket's name
        data = b"".join(iter(lambda: sock.recv(65536), b""))
    families = {name: samples for name, _, _, samples in orjson.loads(data)}
    return sum(
        value for name, _, value in families["compaction_proxy_requests"] if name.endswith("_total")
    )


@contextlib.contextmanager
def served(upstream: str, redis_url: str, workers: int) -> Iterator[Server]:
    prefix = f"cpbench-{os.urandom(4).hex()}"
    config = proxy_config(upstream, redis_url, prefix).replace(
        "port: 8080}", f"port: 8080, workers: {workers}}}"
    )
    with own_keys(redis_url, prefix), proxy(config) as server:
        yield server


async def load(
    way: Figures, seconds: float, pids: list[int], workers: list[int]
) -> tuple[float, float, list[tuple[float, float]]]:
    """Requests/s at overhead.py's load; the CPU seconds `pids` spent meanwhile per request;
    and of each of `workers`, its share of the requests and its CPU seconds per request it
    answered."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        client = Client(session)
        await client._load(way, min(0.5, seconds / 4))  # warm the connection pools
        before = [cpu_seconds(pid) for pid in pids]
        answered = [served_requests(pid) for pid in workers]
        done, took = await client._load(way, seconds)
        spent = [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
        answered = [served_requests(pid) - a for pid, a in zip(workers, answered, strict=True)]
    pairs = zip(workers, answered, strict=True)
    each = [(n / done, spent[pids.index(pid)] / max(n, 1)) for pid, n in pairs]
    return done / took, sum(spent) / done, each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    if not redis_reachable(args.redis_url):
        sys.exit(f"no Redis answers at {args.redis_url}: more than one worker needs it")
    rates: dict[str, list[float]] = {"direct": [], **{str(n): [] for n in WORKERS}}
    cpu: dict[str, list[float]] = {str(n): [] for n in WORKERS}
    shares: dict[str, list[list[tuple[float, float]]]] = {str(n): [] for n in WORKERS}
    with fake_upstream({MODEL: WINDOW}) as upstream, contextlib.ExitStack() as stack:
        servers = {
            str(n): stack.enter_context(served(upstream.url, args.redis_url, n)) for n in WORKERS
        }
        started, busy = time.perf_counter(), busy_seconds()
        for _ in range(args.rounds):
            direct = Figures("direct", upstream.url)
            rates["direct"].append(uvloop.run(load(direct, args.seconds, [], []))[0])
            for name, server in servers.items():
                workers = workers_of(server.pid)
                way = Figures(f"{name} workers", server.url, proxied=True)
                pids = [server.pid, *workers]
                rate, spent, each = uvloop.run(load(way, args.seconds, pids, workers))
                rates[name].append(rate)
                cpu[name].append(spent)
                shares[name].append(each)
        load_average = os.getloadavg()
        busy = (busy_seconds() - busy) / (time.perf_counter() - started)
    print(f"machine: {machine()}")
    print(f"load average at the end: {load_average[0]:.2f}; cores busy over the run: {busy:.2f}")
    print(f"rounds: {args.rounds} of {args.seconds:g} s each way; medians\n")
    print("| | direct | 1 worker | 2 workers |\n|---|---|---|---|")
    median = statistics.median
    print(
        "| requests/s, 16 clients, small | "
        + " | ".join(f"{median(rates[k]):,.0f}" for k in ("direct", "1", "2"))
        + " |"
    )
    print(
        "| CPU per request, all processes | - | "
        + " | ".join(f"{median(cpu[k]) * 1e6:.0f} us" for k in ("1", "2"))
        + " |"
    )
    cells = []
    for name in ("1", "2"):
        if not shares[name][0]:  # one worker: the process itself, counted above
            cells.append("(the process itself)")
            continue
        each = [
            (median(r[i][0] for r in shares[name]), median(r[i][1] for r in shares[name]))
            for i in range(len(shares[name][0]))
        ]
        cells.append(
            ", ".join(f"{us * 1e6:.0f} us ({share:.0%} of requests)" for share, us in each)
        )
    print("| CPU per request it answered, each worker | - | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
