"""Anthropic prompt caching through the proxy: the share of prompt tokens read from the cache
over a Claude Code-like agent loop, with the proxy's own breakpoints (`cache_breakpoints`) and
without; and the proxy's own time on a long Messages request that it does not compact.

    .venv/bin/python bench/anthropic_cache.py            # about 15 s
    .venv/bin/python bench/anthropic_cache.py --iterations 80

The loop (tests/claude_loop.py) runs through the official `anthropic` SDK, the proxy (in this
process, on loopback) and the strict fake Anthropic API, which simulates the cache as the API
documents it: up to 4 breakpoints, a lookback of 20 blocks, 1024 tokens at least, prefixes
keyed by their exact blocks, thinking of earlier turns stripped from the prompt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anthropic  # noqa: E402
import httpx  # noqa: E402
import orjson  # noqa: E402
import yaml  # noqa: E402
from common import percentile, proxy  # noqa: E402  (bench/ is on the path)

from proxy.config import loads  # noqa: E402
from proxy.tokens import configure_offline_encodings  # noqa: E402
from tests.claude_loop import ANCHOR, MODEL, WINDOW, ClaudeLoop, cache_read_share  # noqa: E402
from tests.conversations import words  # noqa: E402
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
        "prompt": prompt,
    }


def overhead(turns: int, samples: int, breakpoints: bool) -> tuple[float, float, float, int, int]:
    """The proxy's own time before forwarding (`x-compaction-overhead-ms`) for a long tool-loop
    history that it does not compact, the proxy in a process of its own (`compaction-proxy
    serve`, as bench/overhead.py runs it): p50, p99 and the first request's, in ms; the
    history's messages and KiB."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for n in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{n}", "name": "read_file", "input": {"path": n}}
        said = {"type": "text", "text": f"Reading file {n}."}
        history.append({"role": "assistant", "content": [said, use]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": words(150, n)}
        history.append({"role": "user", "content": [result]})
    raw = orjson.dumps({"model": MODEL, "max_tokens": 1024, "system": "Hi.", "messages": history})
    with FakeAnthropic(windows={MODEL: 1_000_000}, record=False) as up:
        config = {
            "upstreams": {"claude": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
            "models": [{"match": MODEL, "context_window": 1_000_000}],
            "policies": {"default": {"cache_breakpoints": breakpoints}},
        }
        with proxy(yaml.safe_dump(config)) as server, httpx.Client(timeout=30) as http:
            headers = {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"}
            times = []
            for _ in range(samples):
                response = http.post(server.url + "/messages", content=raw, headers=headers)
                assert response.status_code == 200, response.text
                assert response.headers["x-compaction-action"] == "none"
                times.append(float(response.headers["x-compaction-overhead-ms"]))
    return (
        percentile(times, 50),
        percentile(times, 99),
        times[0],
        len(history),
        len(raw) // 1024,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=40)
    args = parser.parse_args()
    configure_offline_encodings()
    print(f"{args.iterations}-iteration tool loop at a {WINDOW}-token window, ~1300-token results")
    print("| client breakpoints | thinking | proxy breakpoints | read from cache | written |")
    print("|---|---|---|---|---|")
    for marks in (True, False):
        for thinking in (True, False):
            for breakpoints in (False, True):
                found = loop(
                    args.iterations, breakpoints=breakpoints, thinking=thinking, marks=marks
                )
                client = "system + last block" if marks else "none"
                on = "on" if breakpoints else "off"
                print(
                    f"| {client} | {'on' if thinking else 'off'} | {on} "
                    f"| {found['share']:.1%} | {found['written']:.1%} |"
                )
    print("\nproxy overhead (x-compaction-overhead-ms) on a long history it does not compact:")
    for breakpoints in (True, False):
        p50, p99, cold, messages, size = overhead(500, 200, breakpoints)
        print(
            f"  {messages} messages ({size} KiB), breakpoints {'on' if breakpoints else 'off'}: "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, first request {cold:.2f} ms"
        )


if __name__ == "__main__":
    main()
