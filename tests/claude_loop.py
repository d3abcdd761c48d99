"""A Claude Code-like agent loop through the official `anthropic` SDK, for tests and benchmarks.

Like Claude Code it resends the whole history every turn, with thinking enabled, a tools list,
a system prompt marked as a cache breakpoint and a breakpoint on the last block of the last
message (moved every turn); every answer is a tool call (the fake's `tool-call` behaviour)
answered by a big tool result naming a file (`FILE-<nnn>`, an anchor).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import anthropic
import yaml

from proxy.config import loads
from tests.conversations import words
from tests.fakes.anthropic import FakeAnthropic
from tests.servers import proxy_server

MODEL = "claude-loop"
WINDOW = 16_384
MAX_TOKENS = 2048
THINKING = {"type": "enabled", "budget_tokens": 1024}
ANCHOR = r"FILE-\d{3}"  # fixed width: no anchor is a prefix of another
MARK = {"type": "ephemeral"}
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "The file's path."}},
            "required": ["path"],
        },
    }
]
SYSTEM_TEXT = "You are an agent that reads files to answer questions. " + words(900, 7)
TASK = "Read every file you need and tell me what FILE-000 does."


@dataclasses.dataclass
class Turn:
    """One request of the loop, as the client saw it."""

    action: str  # the proxy's x-compaction-action
    input_tokens: int
    cache_read: int
    cache_creation: int

    @property
    def prompt(self) -> int:
        return self.input_tokens + self.cache_read + self.cache_creation


@dataclasses.dataclass
class ClaudeLoop:
    client: anthropic.Anthropic
    session: str
    result_words: int = 900  # a tool result of about 1300 tokens
    stream_every: int = 2  # every second request is streamed
    thinking: bool = True
    marks: bool = True  # Claude Code's breakpoints: the system prompt and the last block
    history: list[dict[str, Any]] = dataclasses.field(
        default_factory=lambda: [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    )
    turns: list[Turn] = dataclasses.field(default_factory=list)

    def run(self, iterations: int) -> list[Turn]:
        for _ in range(iterations):
            self.step()
        return self.turns

    def request(self) -> dict[str, Any]:
        """The next request's fields, with Claude Code's breakpoints: system and last block."""
        last = dict(self.history[-1])
        system: dict[str, Any] = {"type": "text", "text": SYSTEM_TEXT}
        if self.marks:
            last["content"] = [
                *last["content"][:-1],
                {**last["content"][-1], "cache_control": MARK},
            ]
            system["cache_control"] = MARK
        fields = {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "tools": TOOLS,
            "system": [system],
            "messages": [*self.history[:-1], last],
            "extra_headers": {
                "x-fake-behavior": "tool-call",
                "X-Claude-Code-Session-Id": self.session,
            },
        }
        if self.thinking:
            fields["thinking"] = THINKING
        return fields

    def step(self) -> Turn:
        fields = self.request()
        if len(self.turns) % self.stream_every:
            with self.client.messages.stream(**fields) as stream:
                message = stream.get_final_message()
                action = stream.response.headers["x-compaction-action"]
        else:
            raw = self.client.messages.with_raw_response.create(**fields)
            message, action = raw.parse(), raw.headers["x-compaction-action"]
        content = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
        self.history.append({"role": "assistant", "content": content})
        number = len(self.turns) + 1
        results = [
            {
                "type": "tool_result",
                "tool_use_id": block["id"],
                "content": f"FILE-{number:03d}: {words(self.result_words, number)}",
            }
            for block in content
            if block["type"] == "tool_use"
        ]
        self.history.append({"role": "user", "content": results})
        usage = message.usage
        turn = Turn(
            action,
            usage.input_tokens,
            usage.cache_read_input_tokens or 0,
            usage.cache_creation_input_tokens or 0,
        )
        self.turns.append(turn)
        return turn


def cache_read_share(turns: list[Turn]) -> float:
    """The share of prompt tokens the upstream read from its cache."""
    prompt = sum(t.prompt for t in turns)
    return sum(t.cache_read for t in turns) / prompt if prompt else 0.0


def run_loop(
    iterations: int,
    *,
    breakpoints: bool,
    thinking: bool = True,
    marks: bool = True,
    **policy: Any,
) -> tuple[list[Turn], list[bytes]]:
    """The loop through a proxy (policy `cache_breakpoints` as given, the anchors watched,
    and `policy`'s other keys) in front of a fake Anthropic API with the loop's window: its
    turns, and the bodies of the Messages requests the fake received (summaries left out)."""
    with FakeAnthropic(windows={MODEL: WINDOW}) as up:
        settings = {"cache_breakpoints": breakpoints, "anchors": [ANCHOR], **policy}
        config = {
            "upstreams": {"claude": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
            "models": [{"match": MODEL, "context_window": WINDOW}],
            "policies": {"default": settings},
        }
        with (
            proxy_server(loads(yaml.safe_dump(config))) as proxy,
            anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-loop", max_retries=0) as client,
        ):
            loop = ClaudeLoop(client, "loop-session", thinking=thinking, marks=marks)
            turns = loop.run(iterations)
        sent = [
            r.body
            for r in up.requests
            if r.path == "/v1/messages" and r.headers.get("x-compaction-summary") != "1"
        ]
    return turns, sent
