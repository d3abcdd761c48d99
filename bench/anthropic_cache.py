"""Anthropic prompt caching through the proxy: the share of prompt tokens read from the cache
over a Claude Code-like agent loop, with the proxy's own breakpoints (`cache_breakpoints`) and
without; and what the Messages dialect costs a request that it does not compact.

    .venv/bin/python bench/anthropic_cache.py            # about 15 s
    .venv/bin/python bench/anthropic_cache.py --iterations 80

The loop (tests/claude_loop.py) runs through the official `anthropic` SDK, the proxy (in this
process, on loopback) and the strict fake Anthropic API, which simulates the cache as the API
documents it: up to 4 breakpoints, a lookback of 20 blocks, 1024 tokens at least, prefixes
keyed by their exact blocks, thinking of earlier turns stripped from the prompt.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anthropic  # noqa: E402
import orjson  # noqa: E402
import yaml  # noqa: E402

import policies  # noqa: E402
from proxy.config import loads  # noqa: E402
from proxy.dialects.messages import Messages  # noqa: E402
from proxy.tokens import configure_offline_encodings  # noqa: E402
from tests.claude_loop import ANCHOR, MODEL, WINDOW, ClaudeLoop, cache_read_share  # noqa: E402
from tests.fake_anthropic import FakeAnthropic  # noqa: E402
from tests.servers import proxy_server  # noqa: E402


def loop(iterations: int, *, breakpoints: bool, thinking: bool, marks: bool) -> dict[str, Any]:
    with FakeAnthropic(windows={MODEL: WINDOW}) as up:
        config = {
            "upstreams": {"claude": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
            "models": [{"match": MODEL, "context_window": WINDOW}],
            "policies": {"default": {"cache_breakpoints": breakpoints, "anchors": [ANCHOR]}},
        }
        with proxy_server(loads(yaml.safe_dump(config))) as proxy:
            client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-bench", max_retries=0)
            runner = ClaudeLoop(client, "bench", thinking=thinking, marks=marks)
            turns = runner.run(iterations)
    prompt = sum(t.prompt for t in turns)
    return {
        "share": cache_read_share(turns),
        "written": sum(t.cache_creation for t in turns) / prompt,
        "compactions": sum(t.action in ("compacted", "degraded") for t in turns),
        "prompt": prompt,
    }


def render_cost(turns: int, samples: int) -> tuple[float, float, int]:
    """Parse and render (with breakpoints) of a long tool-loop history: p50 ms, p99 ms, size."""
    loop_history: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for n in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{n}", "name": "read_file", "input": {"path": n}}
        loop_history.append(
            {"role": "assistant", "content": [{"type": "text", "text": "On it."}, use]}
        )
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "x " * 600}
        loop_history.append({"role": "user", "content": [result]})
    body = {"model": MODEL, "max_tokens": 1024, "system": "Be brief.", "messages": loop_history}
    raw = orjson.dumps(body)
    dialect = Messages()
    timings = []
    for _ in range(samples):
        start = time.perf_counter()
        parsed = dialect.parse(raw)
        dialect.render(parsed, policies.render_entries(parsed.messages, policies.Plan()), True)
        timings.append((time.perf_counter() - start) * 1000)
    timings.sort()
    return statistics.median(timings), timings[int(len(timings) * 0.99) - 1], len(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=40)
    args = parser.parse_args()
    configure_offline_encodings()
    print(f"{args.iterations}-iteration tool loop at a {WINDOW}-token window, ~1300-token results")
    print(
        "| client breakpoints | thinking | proxy breakpoints | read from cache | written | compactions |"
    )
    print("|---|---|---|---|---|---|")
    for marks in (True, False):
        for thinking in (True, False):
            for breakpoints in (False, True):
                found = loop(
                    args.iterations, breakpoints=breakpoints, thinking=thinking, marks=marks
                )
                client = "system + last block" if marks else "none"
                print(
                    f"| {client} | {'on' if thinking else 'off'} | {'on' if breakpoints else 'off'} "
                    f"| {found['share']:.1%} | {found['written']:.1%} | {found['compactions']} |"
                )
    p50, p99, size = render_cost(500, 200)
    print(
        f"\nparse + render with breakpoints, 1,001 messages ({size / 1024:.0f} KiB): "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    )


if __name__ == "__main__":
    main()
