"""Fact retention: how many of the facts said in a long session the last forwarded request
still shows, against dropping the oldest messages and LangChain's `trim_messages`.

    .venv/bin/python bench/retention.py      # about two minutes

A unique fact is planted in every user message (bench/planted.py): sessions of 60 turns from
two generators written apart (the digest was tuned on the first only; the second is for
reporting), chats and agent loops, and the recorded traces (tests/data) joined four at a time
with a fact added to each user message. Each session is replayed turn by turn through the
engine as the proxy applies it (bench/savings.py's `Proxy`, the default policy, the mechanical
digest alone: no LLM; with `--summarizer-url URL --summarizer-model NAME`, each row again
with that OpenAI-compatible endpoint's model writing the summaries, bench/real_summarizer.py),
with a quarter of the window reserved for the output; then a last
request asks about it all. Counted in that last request's view:

- proxy: the view the proxy forwards;
- drop-oldest: the oldest messages dropped until the rest has the proxy's view's token count
  (tool blocks whole): what the same tokens keep without compaction;
- langchain: `trim_messages(strategy="last", start_on="human", include_system=True)` at the
  prompt budget (which may use more tokens than the proxy's view).

A fact is kept when its key (a code, an amount, a name) is still in the view's text.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import planted
from common import load_traces
from compaction import MODEL, budget_for, conditions, default_policy
from real_summarizer import add_arguments, from_arguments
from savings import LangChain, Proxy

import policies
from policies.message import Message, visible_text
from proxy.models.tokens import REPLY_PRIMING, TokenCounter, counter_for
from proxy.tools.recordings import joined

WINDOWS = (4096, 8192, 16384)
TURNS = 60
LAST = {"role": "user", "content": "Before we go on: what do you still know of all this?"}


def shown(view: list[Message]) -> str:
    return " ".join(" ".join(visible_text(m).split()) for m in view)


def kept(view: list[Message], facts: list[str]) -> int:
    text = shown(view)
    return sum(fact in text for fact in facts)


def drop_oldest(messages: list[Message], tokens: int, counter: TokenCounter) -> list[Message]:
    """The newest messages (tool blocks whole) that fit in `tokens`, system messages kept."""
    system = [m for m in messages if policies.is_system(m)]
    chain = [m for m in messages if not policies.is_system(m)]
    while chain and counter.count([*system, *chain], fixed=REPLY_PRIMING) > tokens:
        chain.pop(0)
        while chain and chain[0]["role"] == "tool":
            chain.pop(0)
    return [*system, *chain]


async def last_view(method: Proxy, session: list[Message]) -> list[Message]:
    """The session replayed request by request; the view of its last request."""
    method.start()
    messages = [*session, LAST]
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and index:
            await method.view(messages[:index])
    view = await method.view(messages)
    assert view is not None
    return view


async def score(
    sessions: list[planted.Session],
    window: int,
    counter: TokenCounter,
    summarizer: policies.Summarizer | None = None,
) -> dict[str, float]:
    policy = default_policy()
    budget = budget_for(policy, window, window // 4)
    proxy = Proxy("proxy", policy, budget, counter, summarizer)
    langchain = LangChain(budget, counter)
    totals = {"facts": 0, "proxy": 0, "drop-oldest": 0, "langchain": 0, "tokens": 0}
    for messages, facts in sessions:
        view = await last_view(proxy, messages)
        tokens = counter.count(view, fixed=REPLY_PRIMING)
        trimmed = await langchain.view([*messages, LAST])
        totals["facts"] += len(facts)
        totals["proxy"] += kept(view, facts)
        totals["drop-oldest"] += kept(drop_oldest([*messages, LAST], tokens, counter), facts)
        totals["langchain"] += kept(trimmed or [], facts)
        totals["tokens"] += tokens
    return {
        **{k: 100 * v / totals["facts"] for k, v in totals.items() if k not in ("facts", "tokens")},
        "tokens": totals["tokens"] / len(sessions),
        "limit": budget.limit,
    }


def generated(make: Callable[..., planted.Session], agent: bool, count: int) -> list:
    return [make(TURNS, seed, agent=agent) for seed in range(count)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8, help="generated sessions per row")
    parser.add_argument("--only", choices=["tuning", "held-out", "traces"], action="append")
    add_arguments(parser)
    args = parser.parse_args()
    real = from_arguments(parser, args)
    async with contextlib.AsyncExitStack() as stack:
        summarizers: dict[str, policies.Summarizer | None] = {"": None}
        if real is not None:
            summarizers[f", {real.model}'s summaries"] = await stack.enter_async_context(
                real.summarizer()
            )
        await report(args, summarizers)


async def report(
    args: argparse.Namespace, summarizers: dict[str, policies.Summarizer | None]
) -> None:
    """The table; each row once per summarizer, labelled with it (the digest: no label)."""
    print(conditions())
    counter = counter_for(MODEL)
    traces = planted.traces(joined(load_traces(), 4))
    workloads = {
        "tuning": {
            "chat": generated(planted.tuning, False, args.sessions),
            "agent": generated(planted.tuning, True, args.sessions),
        },
        "held-out": {
            "chat": generated(planted.held_out, False, args.sessions),
            "agent": generated(planted.held_out, True, args.sessions),
        },
        "traces": {"4 per session": traces},
    }
    print(
        "\n| sessions | kind | window | proxy | drop-oldest | ratio | langchain |"
        " proxy's view / budget |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, kinds in workloads.items():
        if args.only and name not in args.only:
            continue
        for kind, sessions in kinds.items():
            for window in WINDOWS:
                for label, summarizer in summarizers.items():
                    started = time.perf_counter()
                    s = await score(sessions, window, counter, summarizer)
                    ratio = s["proxy"] / s["drop-oldest"] if s["drop-oldest"] else float("inf")
                    print(
                        f"| {name} | {kind}{label} | {window // 1024}k | {s['proxy']:.1f}% |"
                        f" {s['drop-oldest']:.1f}% | {ratio:.2f}x | {s['langchain']:.1f}% |"
                        f" {s['tokens']:.0f} / {s['limit']} |"
                        f"  ({time.perf_counter() - started:.0f} s)",
                        flush=True,
                    )


if __name__ == "__main__":
    asyncio.run(main())
