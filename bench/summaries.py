"""LLM summaries under a summarizer whose latency varies: the share of compactions that got one,
and how long a compaction turn waits, with the bounded wait (`summarizer.request_wait_seconds`)
and without it.

    .venv/bin/python bench/summaries.py [--sessions 6] [--think 1.0] [--median 2.0]

The fake upstream (tests/fakes/openai) and the proxy run in this process, each in its own
thread (memory store, the default policy, gpt-4o at an 8k window), with summaries prepared
ahead of time as by default, and without (`prepare_at` at the compact level: every summary
is asked for on the request path). The fake's summaries take a
time drawn from a log-normal distribution (median `--median` seconds, sigma 0.9: a tenth take
over 3.2 times the median, one in a hundred over 8 times), the same draws for both runs. Each
session is a 60-turn chat (bench/planted.py's tuning generator) whose client waits `--think`
seconds between turns, as a person does; the sessions run side by side. Counted from the
proxy's metric `compaction_proxy_compaction_summaries_total`: a summary on the request path, a
summary prepared ahead of time, a digest whose late summary replaced it afterwards, a digest
for good; and the latency of every compaction turn.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import planted
from common import percentile
from compaction import conditions

from tests.conftest import config_for, metric
from tests.fakes.openai import FakeUpstream
from tests.servers import proxy_server

MODEL = "gpt-4o-8k"
TURNS = 60
RUNS = {  # name: (prepare_at, request_wait_seconds)
    "prepared ahead at 0.75, bounded wait 3 s (default)": (0.75, 3.0),
    "prepared ahead at 0.75, no bound (before)": (0.75, 1000.0),
    "not prepared ahead, bounded wait 3 s": (0.9, 3.0),
    "not prepared ahead, no bound (before)": (0.9, 1000.0),
}


class SlowSummaries:
    """The fake's summarizer: each summary takes the next drawn delay."""

    def __init__(self, median: float, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.median = median

    def __call__(self, body: dict[str, Any]) -> Any:
        delay = self.median * self.rng.lognormvariate(0, 0.9)

        async def later() -> str:
            await asyncio.sleep(delay)
            return "Summary: the user gave references and asked for changes; all noted."

        return later()


async def session(url: str, seed: int, think: float, waits: list[float]) -> None:
    messages, _ = planted.tuning(TURNS, seed)
    async with httpx.AsyncClient(timeout=300) as http:
        for index, message in enumerate(messages):
            if message["role"] != "assistant" or not index:
                continue
            started = time.perf_counter()
            response = await http.post(
                f"{url}/v1/chat/completions",
                json={"model": MODEL, "messages": messages[:index], "max_tokens": 2048},
                headers={"Authorization": "Bearer sk-bench", "X-Session-Id": f"s{seed}"},
            )
            took = time.perf_counter() - started
            response.raise_for_status()
            if response.headers["x-compaction-action"] in ("compacted", "degraded"):
                waits.append(took)
            await asyncio.sleep(think)


def run(
    prepare_at: float, wait: float, args: argparse.Namespace
) -> tuple[dict[str, float], list[float]]:
    with FakeUpstream(windows={MODEL: 8192}, summarizer=SlowSummaries(args.median)) as up:
        settings = {"request_wait_seconds": wait}
        config = config_for(
            up,
            models=[{"match": MODEL, "context_window": 8192}],
            policies={"default": {"prepare_at": prepare_at, "summarizer": settings}},
        )
        with proxy_server(config) as server:
            waits: list[float] = []

            async def sessions() -> None:
                await asyncio.gather(
                    *(session(server.url, s, args.think, waits) for s in range(args.sessions))
                )

            asyncio.run(sessions())
            proxy = server.server.config.app.state.proxy  # type: ignore[attr-defined]
            while proxy.prepared.working:  # the late summaries land
                time.sleep(0.1)
            with httpx.Client() as http:
                name = "compaction_proxy_compaction_summaries_total"
                kinds = ("llm", "prepared", "digest", "settled")
                counts = {k: metric(http, server, name, summary=k) for k in kinds}
    return counts, waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--think", type=float, default=1.0, help="seconds between turns")
    parser.add_argument("--median", type=float, default=2.0, help="median seconds a summary")
    args = parser.parse_args()
    print(conditions())
    print(
        f"{args.sessions} sessions of {TURNS} turns at 8k, {args.think:g} s between turns,"
        f" summaries taking {args.median:g} s (median)\n"
    )
    print(
        "| | compactions | LLM summary on the request path | prepared ahead |"
        " digest, replaced later | digest for good | compaction turn p50 / p90 / max s |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (prepare_at, wait) in RUNS.items():
        counts, waits = run(prepare_at, wait, args)
        total = counts["llm"] + counts["prepared"] + counts["digest"]

        def share(n: float, total: float = total) -> str:
            return f"{100 * n / total:.0f}%" if total else "-"

        latency = " / ".join(f"{percentile(waits, q):.2f}" for q in (50, 90, 100))
        print(
            f"| {name} | {total:.0f} | {share(counts['llm'])} | {share(counts['prepared'])} |"
            f" {share(counts['settled'])} | {share(counts['digest'] - counts['settled'])} |"
            f" {latency} |"
        )


if __name__ == "__main__":
    main()
