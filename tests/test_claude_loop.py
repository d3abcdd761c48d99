"""A 40-iteration Claude Code-like agent loop through the proxy at a 16k window, with thinking
enabled and big tool results: nothing rejected, the anchors visible at the end, and the share
of prompt tokens read from the upstream's cache with the proxy's breakpoints and without."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson
import pytest

from tests.claude_loop import ANCHOR, TASK, WINDOW, Turn, cache_read_share, run_loop

ITERATIONS = 40


@pytest.fixture(scope="module")
def loops() -> Iterator[dict[bool, tuple[list[Turn], list[bytes]]]]:
    yield {on: run_loop(ITERATIONS, breakpoints=on) for on in (True, False)}


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


def test_the_loop_s_rounds_are_summarised_after_its_task_with_thinking_kept() -> None:
    layers = [{"summarize": {}}, {"trim_head": {}}]
    turns, sent = run_loop(16, breakpoints=True, layers=layers)
    bodies = [orjson.loads(body) for body in sent]
    summarised = [b for b in bodies if "[Summary of the earlier conversation" in str(b)]
    assert summarised, " ".join(t.action for t in turns)
    for body in summarised:
        messages = body["messages"]
        # The task verbatim first, the summary next, then whole rounds: every tool_use
        # answered, every assistant turn's thinking block first, as it came.
        assert messages[0]["content"] == [{"type": "text", "text": TASK}]
        assert "[Summary of the earlier conversation" in str(messages[1])
        for message in messages[2:]:
            if message["role"] == "assistant":
                assert message["content"][0]["type"] == "thinking"
        used = [b["id"] for m in messages for b in m["content"] if b["type"] == "tool_use"]
        answered = [
            b["tool_use_id"]
            for m in messages
            if isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "tool_result"
        ]
        assert used == answered
