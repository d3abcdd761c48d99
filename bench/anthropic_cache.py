"""Anthropic prompt caching through the proxy: the share of prompt tokens read from the cache
over a Claude Code-like agent loop, with the proxy's own breakpoints (`cache_breakpoints`) and
without; and the proxy's own time on a long Messages request that it does not compact, beside
a chat completion of the same size.

    .venv/bin/python bench/anthropic_cache.py            # about 15 s
    .venv/bin/python bench/anthropic_cache.py --iterations 80

The loop (tests/claude_loop.py) runs through the official `anthropic` SDK, the proxy (in this
process, on loopback) and the strict fake Anthropic API, which simulates the cache as the API
documents it: up to 4 breakpoints, a lookback of 20 blocks, 1024 tokens at least, prefixes
keyed by their exact blocks, thinking of earlier turns stripped from the prompt.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402
import yaml  # noqa: E402
from common import long_history, percentile, proxy  # noqa: E402  (bench/ is on the path)

from proxy.models.tokens import configure_offline_encodings  # noqa: E402
from tests.claude_loop import MODEL, WINDOW, cache_read_share, run_loop  # noqa: E402
from tests.conversations import words  # noqa: E402
from tests.fakes.anthropic import FakeAnthropic  # noqa: E402
from tests.fakes.openai import FakeUpstream  # noqa: E402


def loop(iterations: int, *, breakpoints: bool, thinking: bool, marks: bool) -> dict[str, Any]:
    turns, _ = run_loop(iterations, breakpoints=breakpoints, thinking=thinking, marks=marks)
    prompt = sum(t.prompt for t in turns)
    return {
        "share": cache_read_share(turns),
        "written": sum(t.cache_creation for t in turns) / prompt,
    }


def tool_loop_history(turns: int) -> bytes:
    """A Messages request of a long tool loop: `turns` calls, each with a ~200-token result."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for n in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{n}", "name": "read_file", "input": {"path": n}}
        said = {"type": "text", "text": f"Reading file {n}."}
        history.append({"role": "assistant", "content": [said, use]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": words(150, n)}
        history.append({"role": "user", "content": [result]})
    return orjson.dumps({"model": MODEL, "max_tokens": 1024, "system": "Hi.", "messages": history})


def overhead(samples: int) -> list[tuple[str, list[float]]]:
    """The proxy's own time before forwarding (`x-compaction-overhead-ms`) on long histories it
    does not compact, each proxy a `compaction-proxy serve` process of its own (as
    bench/overhead.py runs it), requests taking turns between them so that the machine's load
    shows in every row alike: a 1,001-message Messages tool loop with the proxy's breakpoints
    and without, and, for reference, the recorded traces' 1,052-message chat history."""
    messages = tool_loop_history(500)
    chat = orjson.dumps({"model": "gpt-4o", "messages": long_history(100_000)})
    big = 1_000_000
    with (
        FakeAnthropic(windows={MODEL: big}, record=False) as claude,
        FakeUpstream(windows={"gpt-4o": big}, record=False) as openai,
        contextlib.ExitStack() as stack,
    ):
        servers = []
        for breakpoints in (True, False):
            config = {
                "upstreams": {"claude": {"base_url": claude.base_url + "/v1", "kind": "anthropic"}},
                "models": [{"match": MODEL, "context_window": big}],
                "policies": {"default": {"cache_breakpoints": breakpoints}},
            }
            server = stack.enter_context(proxy(yaml.safe_dump(config)))
            headers = {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"}
            on = "on" if breakpoints else "off"
            servers.append(
                (f"Messages, breakpoints {on}", server.url + "/messages", messages, headers)
            )
        config = {
            "upstreams": {"openai": {"base_url": openai.base_url}},
            "models": [{"match": "gpt-4o", "context_window": big}],
        }
        server = stack.enter_context(proxy(yaml.safe_dump(config)))
        headers = {"authorization": "Bearer sk-bench", "content-type": "application/json"}
        servers.append(("chat completions", server.url + "/chat/completions", chat, headers))
        times: list[list[float]] = [[] for _ in servers]
        http = stack.enter_context(httpx.Client(timeout=30))
        for _ in range(samples):
            for (_, url, body, headers), found in zip(servers, times, strict=True):
                response = http.post(url, content=body, headers=headers)
                assert response.status_code == 200, response.text
                assert response.headers["x-compaction-action"] == "none"
                found.append(float(response.headers["x-compaction-overhead-ms"]))
    return [(name, found) for (name, *_), found in zip(servers, times, strict=True)]


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
    print("\nproxy overhead (x-compaction-overhead-ms) on long histories it does not compact:")
    print("| request | p50 | p99 | first |")
    print("|---|---|---|---|")
    for name, found in overhead(200):
        p50, p99 = percentile(found, 50), percentile(found, 99)
        print(f"| {name} | {p50:.2f} ms | {p99:.2f} ms | {found[0]:.2f} ms |")


if __name__ == "__main__":
    main()
