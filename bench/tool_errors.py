"""Errors hidden in tool output: how many a long agent loop still shows at its end, with and
without compress_tool_results (issue 25's measure).

    .venv/bin/python bench/tool_errors.py      # about a minute

A 45-step agent loop at a 16k window (a quarter reserved for the output): each step's tool
output is 1.5k-4k tokens, alternately a JSON array of records and a build/test log, and
hides one error with a key of its own (a record whose status is `error`, an `ERROR` line);
every nine steps the user adds a fact of their own. Each request is made as a client makes it
(the history up to the newest tool output) and goes through the engine as the proxy applies it
(bench/savings.py's `Proxy`: the plan replayed while its prefix matches, a compaction at the
compact level), with a summarizer that ignores tool output (it keeps what the user said,
nothing else). Counted: requests refused (the view does not fit), compactions, and in the last
request's view the errors and the user facts still visible (their keys in its text); and the
turns that replay a plan: how many outputs they compressed (none:
the plan holds each output's compressed text) and their median time.

- before: the default layers without compress_tool_results (the code before it);
- after: the default layers of config.yaml.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compaction import MODEL, budget_for, conditions, default_policy
from retention import shown
from savings import Proxy

import policies
from policies.message import Message, content_text
from proxy.config import Policy
from proxy.models.tokens import counter_for

STEPS = 45
# The layer's module (the package's attribute of that name is the layer's function).
compress_layer = importlib.import_module("policies.layers.compress_tool_results")
WINDOW = 16_384


def records(rng: random.Random, key: str, tokens: int) -> str:
    rows = [
        {
            "id": 1000 + i,
            "sku": f"SKU-{rng.randrange(10**5):05d}",
            "status": "ok",
            "qty": rng.randrange(500),
            "warehouse": rng.choice(["north", "south", "east"]),
        }
        for i in range(max(3, tokens // 28))
    ]
    bad = rng.randrange(len(rows))
    rows[bad] = {**rows[bad], "status": "error", "error": f"{key}: stock sync failed"}
    return json.dumps(rows, indent=2)


def build_log(rng: random.Random, key: str, tokens: int) -> str:
    lines = [
        f"[{i:04d}] INFO compiling module pkg/mod_{rng.randrange(999)}.py ({rng.random():.2f}s)"
        for i in range(max(3, tokens // 17))
    ]
    lines[rng.randrange(len(lines))] = f"ERROR {key}: test_checkout failed: expected 200, got 500"
    return "\n".join(lines)


def loop(seed: int = 0) -> tuple[list[Message], list[str], list[str]]:
    """The whole session, its errors' keys and its user facts' keys."""
    rng = random.Random(seed)
    messages: list[Message] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Make the inventory sync pass. Ticket FACT-7100."},
    ]
    errors, facts = [], ["FACT-7100"]
    for step in range(STEPS):
        if step and step % 9 == 0:
            fact = f"FACT-{7100 + step}"
            facts.append(fact)
            messages.append({"role": "assistant", "content": f"Step {step}: still working."})
            messages.append({"role": "user", "content": f"Also keep {fact} in the changelog."})
        key = f"E{step:02d}-{rng.randrange(10**4):04d}"
        errors.append(key)
        name = "query_db" if step % 2 else "run_tests"
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps({"step": step})},
        }
        tokens = 1500 + (step * 997) % 2500
        output = records(rng, key, tokens) if step % 2 else build_log(rng, key, tokens)
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return messages, errors, facts


def ignoring_tools(counter: policies.Counter) -> policies.Summarizer:
    """A summarizer that keeps what the user said and ignores every tool output."""

    async def summarize(request: policies.SummaryRequest) -> str:
        said = [content_text(m.get("content")) for m in request.evicted if m["role"] == "user"]
        previous = request.previous.shown if request.previous is not None else ""
        return counter.head(
            " ".join([previous, *said]).strip() or "Work went on.", request.max_tokens
        )

    return summarize


def without_compression(policy: Policy) -> Policy:
    layers = tuple(s for s in policy.compaction.layers if s.name != "compress_tool_results")
    return dataclasses.replace(
        policy, compaction=dataclasses.replace(policy.compaction, layers=layers)
    )


class Compressions:
    """Counts the outputs compress_tool_results compresses (its `compress` wrapped)."""

    def __init__(self) -> None:
        self.calls = 0
        self.wrapped = compress_layer.compress

    def __enter__(self) -> Compressions:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return self.wrapped(*args, **kwargs)

        compress_layer.compress = counted
        return self

    def __exit__(self, *exc: object) -> None:
        compress_layer.compress = self.wrapped


async def run(name: str, policy: Policy) -> str:
    counter = counter_for(MODEL)
    budget = budget_for(policy, WINDOW, WINDOW // 4)
    proxy = Proxy(name, policy, budget, counter, summarizer=ignoring_tools(counter))
    session, errors, facts = loop()
    refused = compactions = 0
    replayed: list[float] = []  # seconds of each turn that replayed a plan
    replay_compressions = 0
    view: list[Message] | None = None
    with Compressions() as compressions:
        for end in range(1, len(session) + 1):
            if session[end - 1]["role"] != "tool":
                continue
            before, calls = proxy.plan, compressions.calls
            started = time.perf_counter()
            view = await proxy.view(session[:end])
            took = time.perf_counter() - started
            refused += view is None
            compactions += proxy.plan != before
            if proxy.plan == before and before.edits:
                replayed.append(took)
                replay_compressions += compressions.calls - calls
    assert view is not None
    text = shown(view)
    return (
        f"| {name} | {STEPS} | {refused} | {compactions} |"
        f" {sum(e in text for e in errors)} of {len(errors)} |"
        f" {sum(f in text for f in facts)} of {len(facts)} |"
        f" {counter.count(view)} / {budget.limit} |"
        f" {len(replayed)}: {replay_compressions} compressed,"
        f" {1000 * statistics.median(replayed) if replayed else 0:.2f} ms |"
    )


async def main() -> None:
    print(conditions())
    policy = default_policy()
    started = time.perf_counter()
    print(
        "\n| layers | steps | refused | compactions | errors visible at the end |"
        " user facts | last view / limit (tokens) |"
        " turns replaying a plan: outputs compressed, p50 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(await run("before (no compress_tool_results)", without_compression(policy)))
    print(await run("after (config.yaml's default)", policy))
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    asyncio.run(main())
