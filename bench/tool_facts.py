"""Facts planted in the tool results of the recorded traces: how many the last request of each
session still shows, with and without compress_tool_results (issue 25's second measure).

    .venv/bin/python bench/tool_facts.py [--windows 8192 16384]      # about a minute

The recorded traces (tests/data), joined four at a time as in bench/retention.py, with a fact
planted in every user message (bench/planted.py's `traces`) and in every tool result that is
a JSON object or array or text (`tool_facts`: a field with a unique seven-digit number,
inserted at a random place, or a line of text). Each session is replayed request by request
through the engine as the proxy applies it (bench/savings.py's `Proxy`: the plan replayed while
its prefix matches, a compaction at the compact level, the mechanical digest), with a quarter of
the window reserved for the output; then a last request asks about it all. Counted: the tool
facts and the user facts that last request's view still shows (their keys in its text), the
tokens forwarded over all the requests, and the requests refused.

- before: the default layers without compress_tool_results (the code before it);
- after: the default layers of config.yaml.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import planted
from common import load_traces
from compaction import MODEL, budget_for, conditions, default_policy
from retention import LAST, shown
from savings import Proxy
from tool_errors import without_compression

from policies.message import Message
from proxy.config import Policy
from proxy.models.tokens import REPLY_PRIMING, TokenCounter, counter_for
from proxy.tools.recordings import joined

WINDOWS = (8192, 16384)


@dataclass
class Facts:
    """What one replay kept, over all its sessions."""

    tool: int = 0
    tool_kept: int = 0
    user: int = 0
    user_kept: int = 0
    forwarded: int = 0  # tokens of every accepted request's view
    requests: int = 0
    refused: int = 0
    compactions: int = 0

    def row(self, name: str, window: int, baseline: Facts | None) -> str:
        ratio = "" if baseline is None else f" ({self.forwarded / baseline.forwarded:.3f}x)"
        return (
            f"| {name} | {window // 1024}k | {self.tool_kept} of {self.tool}"
            f" ({100 * self.tool_kept / self.tool:.1f}%) | {self.user_kept} of {self.user} |"
            f" {self.forwarded:,}{ratio} | {self.compactions} | {self.refused} of {self.requests} |"
        )


def request_ends(requests: list[Message]) -> list[int]:
    """Where a client's requests end: before each assistant message (the history it answers),
    but not after calls the history does not answer (a request no API takes), and at the end."""
    ends = [
        i
        for i, m in enumerate(requests)
        if m["role"] == "assistant" and i and not requests[i - 1].get("tool_calls")
    ]
    return [*ends, len(requests)]


def sessions() -> list[tuple[list[Message], list[str], list[str]]]:
    """Each session's messages, tool facts and user facts."""
    with_user = planted.traces(joined(load_traces(), 4))
    with_tool = planted.tool_facts(with_user)
    return [
        (messages, tool, user)
        for (messages, tool), (_, user) in zip(with_tool, with_user, strict=True)
    ]


async def replay(
    policy: Policy, window: int, counter: TokenCounter, planted_sessions: list
) -> Facts:
    budget = budget_for(policy, window, window // 4)
    proxy = Proxy("proxy", policy, budget, counter)
    facts = Facts()
    for messages, tool, user in planted_sessions:
        proxy.start()
        requests = [*messages, LAST]
        view: list[Message] | None = None
        for end in request_ends(requests):
            plan = proxy.plan
            view = await proxy.view(requests[:end])
            facts.requests += 1
            facts.compactions += proxy.plan != plan
            if view is None:
                facts.refused += 1
            else:
                facts.forwarded += counter.count(view, fixed=REPLY_PRIMING)
        text = shown(view or [])
        facts.tool += len(tool)
        facts.tool_kept += sum(key in text for key in tool)
        facts.user += len(user)
        facts.user_kept += sum(key in text for key in user)
    return facts


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS))
    args = parser.parse_args()
    print(conditions())
    counter = counter_for(MODEL)
    policy = default_policy()
    planted_sessions = sessions()
    print(
        "\n| layers | window | tool facts visible at the end | user facts |"
        " tokens forwarded (after / before) | compactions | refused |"
    )
    print("|---|---|---|---|---|---|---|")
    for window in args.windows:
        started = time.perf_counter()
        before = await replay(without_compression(policy), window, counter, planted_sessions)
        after = await replay(policy, window, counter, planted_sessions)
        print(before.row("before (no compress_tool_results)", window, None))
        print(after.row("after (config.yaml's default)", window, before))
        print(f"  ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    asyncio.run(main())
