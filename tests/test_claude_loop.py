"""A 40-iteration Claude Code-like agent loop through the proxy at a 16k window, with thinking
enabled and big tool results: nothing rejected, the anchors visible at the end, and the share
of prompt tokens read from the upstream's cache with the proxy's breakpoints and without."""

from __future__ import annotations

import re
from collections.abc import Iterator

import anthropic
import orjson
import pytest
import yaml

from proxy.config import loads
from tests.claude_loop import ANCHOR, MODEL, WINDOW, ClaudeLoop, Turn, cache_read_share
from tests.fake_anthropic import FakeAnthropic
from tests.servers import proxy_server

ITERATIONS = 40


def run_loop(breakpoints: bool) -> tuple[list[Turn], list[bytes]]:
    """The loop's turns and the bodies of the Messages requests the upstream received."""
    with FakeAnthropic(windows={MODEL: WINDOW}) as up:
        config = {
            "upstreams": {"claude": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
            "models": [{"match": MODEL, "context_window": WINDOW}],
            "policies": {"default": {"cache_breakpoints": breakpoints, "anchors": [ANCHOR]}},
        }
        with proxy_server(loads(yaml.safe_dump(config))) as proxy:
            client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-loop", max_retries=0)
            turns = ClaudeLoop(client, "loop-session").run(ITERATIONS)
        sent = [
            r.body
            for r in up.requests
            if r.path == "/v1/messages" and r.headers.get("x-compaction-summary") != "1"
        ]
    return turns, sent


@pytest.fixture(scope="module")
def loops() -> Iterator[dict[bool, tuple[list[Turn], list[bytes]]]]:
    yield {on: run_loop(on) for on in (True, False)}


@pytest.mark.parametrize("breakpoints", [True, False])
def test_the_loop_runs_without_a_rejected_request(
    loops: dict[bool, tuple[list[Turn], list[bytes]]], breakpoints: bool
) -> None:
    turns, sent = loops[breakpoints]
    assert len(turns) == ITERATIONS  # the SDK raises on any error
    assert len(sent) == ITERATIONS  # and none needed a retry: the upstream rejected nothing
    assert {t.action for t in turns} >= {"none", "compacted", "replayed"}
    assert max(t.prompt for t in turns) <= WINDOW
    last = sent[-1].decode()
    wanted = {f"FILE-{n:03d}" for n in range(ITERATIONS)}  # the task's and every result's
    assert wanted <= set(re.findall(ANCHOR, last))
    assert orjson.loads(sent[-1])["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_the_proxys_breakpoints_read_more_of_the_prompt_from_the_cache(
    loops: dict[bool, tuple[list[Turn], list[bytes]]],
) -> None:
    on, off = (cache_read_share(loops[b][0]) for b in (True, False))
    print(f"\ncache-read share of prompt tokens: breakpoints on {on:.1%}, off {off:.1%}")
    assert on > off + 0.2
