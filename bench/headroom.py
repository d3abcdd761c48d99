"""The compaction gap: how far below `compact_at` a compaction goes, from the growth per turn it
sees (`headroom_turns`, `target_floor`), and what that does to the stability of the forwarded
prefix (providers' prompt caches) and to the content kept.

    .venv/bin/python bench/headroom.py      # about a minute

Sessions are replayed turn by turn through the engine as the proxy applies it (bench/savings.py's
`Proxy`: the plan replayed while its prefix matches, a compaction at the compact level), with
the mechanical digest, the default policy and a quarter of the window reserved for the output:

- agent loop: tests/test_long_sessions.py's 45 tool iterations with 1.5k-4k-token results, at 16k;
- traces: the recorded conversations (tests/data) joined four at a time, at 8k and at 16k;
- dialogue: tests/test_long_sessions.py's 150 turns of about 450 tokens, at 32k.

For each setting: compactions; stable, the share of turns whose forwarded view starts with the
previous turn's (from the first compaction on); and, on the turns over the budget, tokens
forwarded / sent and content kept, the share of the characters of the history's lines (every
role, tool results too) that the view shows verbatim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_traces
from compaction import MODEL, budget_for, conditions, default_policy
from savings import Proxy, body

import policies
from policies.message import Message, visible_text
from proxy.config import Policy
from proxy.models.tokens import counter_for
from proxy.tools.recordings import joined
from tests.fakes.openai import count_prompt_tokens
from tests.test_long_sessions import agent_loop, dialogue

SETTINGS = {  # name: (headroom_turns, target_floor)
    "before (no headroom)": (0, 0.5),
    "headroom 3, floor 0.5 (the default before)": (3, 0.5),
    "headroom 4, floor 0.25 (default)": (4, 0.25),
    "headroom 3, floor 0.4": (3, 0.4),
    "headroom 3, floor 0.6": (3, 0.6),
    "headroom 2, floor 0.5": (2, 0.5),
}


@dataclass
class Tally:
    turns: int = 0
    compactions: int = 0
    pairs: int = 0
    stable: int = 0
    over: int = 0
    sent: int = 0
    forwarded: int = 0
    chars: int = 0
    chars_kept: int = 0


def lines_of(messages: list[Message]) -> dict[str, int]:
    """The history's lines (every role), whitespace-normalised, by their length."""
    found: dict[str, int] = {}
    for message in messages:
        if policies.is_system(message):
            continue
        for line in visible_text(message).splitlines():
            line = " ".join(line.split())
            if len(line) >= 8:
                found[line] = len(line)
    return found


def requests(session: list[Message]) -> Iterator[list[Message]]:
    for index, message in enumerate(session):
        if message["role"] == "assistant" and index:
            yield session[:index]


async def replay(method: Proxy, sessions: list[list[Message]], limit: int) -> Tally:
    tally = Tally()
    for session in sessions:
        method.start()
        previous: list[Message] | None = None
        compacted = False
        for messages in requests(session):
            before = method.plan
            view = await method.view(messages)
            assert view is not None
            tally.turns += 1
            if method.plan != before:
                tally.compactions += 1
                compacted = True
            if compacted and previous is not None:
                tally.pairs += 1
                tally.stable += view[: len(previous)] == previous
            sent = count_prompt_tokens(body(messages))
            if sent > limit:
                tally.over += 1
                tally.sent += sent
                tally.forwarded += count_prompt_tokens(body(view))
                shown = " ".join(" ".join(visible_text(m).split()) for m in view)
                lines = lines_of(messages)
                tally.chars += sum(lines.values())
                tally.chars_kept += sum(n for line, n in lines.items() if line in shown)
            previous = view
    return tally


def variant(policy: Policy, headroom: int, floor: float) -> Policy:
    compaction = dataclasses.replace(policy.compaction, headroom_turns=headroom, target_floor=floor)
    return dataclasses.replace(policy, compaction=compaction)


def share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


async def main() -> None:
    print(conditions())
    policy = default_policy()
    counter = counter_for(MODEL)
    traces = load_traces()
    workloads = {
        "agent loop, 45 iterations, 16k": ([agent_loop(45)], 16_384),
        "traces, 4 per session, 8k": (joined(traces, 4), 8_192),
        "traces, 4 per session, 16k": (joined(traces, 4), 16_384),
        "dialogue, 150 turns, 32k": ([dialogue(150, 200, 250)], 32_768),
    }
    for title, (sessions, window) in workloads.items():
        started = time.perf_counter()
        rows = []
        for name, (headroom, floor) in SETTINGS.items():
            chosen = variant(policy, headroom, floor)
            budget = budget_for(chosen, window, window // 4)
            tally = await replay(Proxy(name, chosen, budget, counter), sessions, budget.limit)
            rows.append(
                f"| {name} | {tally.compactions} | {share(tally.stable, tally.pairs)} |"
                f" {share(tally.forwarded, tally.sent)} | {share(tally.chars_kept, tally.chars)} |"
            )
        print(
            f"\n{title}: {tally.turns} turns, {tally.over} over the budget"
            f" ({time.perf_counter() - started:.0f} s)\n"
        )
        print("| setting | compactions | stable | tokens forwarded / sent | content kept |")
        print("|---|---|---|---|---|")
        print("\n".join(rows))


if __name__ == "__main__":
    asyncio.run(main())
