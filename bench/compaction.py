"""Compaction speed: the default policy's pipeline over a ~200k-token conversation, cold and warm,
and what a request that is not compacted costs the proxy before it is forwarded.

    .venv/bin/python bench/compaction.py [--runs 100]

Compaction: `policies.compact` with the policy of the shipped config.yaml, the mechanical digest
(no LLM) and the proxy's token counter for gpt-4o at its 128k window; cold is a counter with an
empty cache (every message tokenised), warm the same counter again (counts cached: the steady
state of a session, target <= 20 ms). Not compacted: `Compactor.prepare` of the proxy for a
128k-token request, as chat completions and as a Codex-like Responses input, on the memory
store, with its parts timed apart. Prints p50/p99/min in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import tiktoken

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    as_messages_body,
    as_responses_items,
    free_port,
    long_history,
    machine,
    percentile,
)

import policies
from proxy.compaction.turn import ClientRequest
from proxy.config import Config, Policy, load, loads
from proxy.dialects import Dialect, Parsed
from proxy.dialects.anthropic.messages import Messages
from proxy.dialects.openai.chat import Chat
from proxy.dialects.openai.responses import Responses
from proxy.dialects.raw_items import KnownBodies
from proxy.memo import content_keys
from proxy.models.catalog import ModelCatalog
from proxy.models.tokens import TokenCounter, counter_for
from proxy.observability.metrics import Metrics
from proxy.server.app import Proxy
from proxy.sessions.state import SessionState
from proxy.sessions.store import MemoryStore
from proxy.upstream.client import UpstreamClient

MODEL = "gpt-4o"
COMPACT_TOKENS = 200_000
REQUEST_TOKENS = 128_000
WARM_TARGET_MS = 20.0
# MODEL at a window where 128k tokens stay under every level: only counted and forwarded.
LARGE_MODEL = "bench-gpt-4o-1m"
LARGE_WINDOW = 1_000_000


def conditions() -> str:
    """The machine, and how busy it was: other processes' load moves every figure here."""
    return f"{machine()}; load average {os.getloadavg()[0]:.1f} at the start"


def fresh_counter() -> TokenCounter:
    """The proxy's counter for MODEL with an empty cache (counter_for's is shared and warm)."""
    return TokenCounter(tiktoken.get_encoding(counter_for(MODEL).name))


def default_policy() -> Policy:
    """The `default` policy of the shipped config.yaml."""
    return load().policies["default"]


def budget_for(policy: Policy, window: int, max_tokens: int | None = None) -> policies.Budget:
    """The budget the proxy gives a request for MODEL at `window` (compaction/compactor.py)."""
    max_output = ModelCatalog().lookup(MODEL).max_output_tokens
    return policy.compaction.budget(window, max_output, max_tokens)


def ms(samples: list[float]) -> str:
    """p50, p99 and min in ms: the min is what the code costs when nothing else runs."""
    return " ".join(f"{percentile(samples, q) * 1000:8.2f}" for q in (50, 99, 0))


async def timed(call: Callable[[], Any], runs: int) -> list[float]:
    """Seconds each of `runs` calls took (awaiting those that return an awaitable)."""
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        result = call()
        if inspect.isawaitable(result):
            await result
        samples.append(time.perf_counter() - started)
    return samples


# -- compaction ---------------------------------------------------------------------------------


async def bench_compaction(runs: int) -> list[str]:
    messages = long_history(COMPACT_TOKENS, MODEL)
    policy = default_policy()
    budget = budget_for(policy, ModelCatalog().lookup(MODEL).context_window or 128_000)

    def compact(counter: TokenCounter) -> Awaitable[policies.Compaction]:
        return policies.compact(
            messages,
            policies.Plan(),
            budget=budget,
            policy=policy.compaction,
            counter=counter,
            fixed_tokens=counter.fixed({}),
        )

    cold_runs = max(3, runs // 4)
    cold = []
    for _ in range(cold_runs):
        fresh = fresh_counter()
        started = time.perf_counter()
        await compact(fresh)
        cold.append(time.perf_counter() - started)
    counter = fresh_counter()
    result = await compact(counter)
    warm = await timed(lambda: compact(counter), runs)
    if not result.fits or result.tokens_after > budget.target_tokens:
        raise RuntimeError(f"the compaction did not reach the target: {result.tokens_after}")
    layers = ", ".join(f"{d.layer} {d.tokens_before}->{d.tokens_after}" for d in result.decisions)
    warm_p50 = percentile(warm, 50) * 1000
    verdict = "ok" if warm_p50 <= WARM_TARGET_MS else "OVER TARGET"
    return [
        f"compaction of {len(messages)} messages, {result.tokens_before} tokens -> "
        f"{result.tokens_after} (window {budget.window}, target {budget.target_tokens}; "
        f"{len(result.decisions)} decisions: {layers})",
        f"{'':34} {'p50 ms':>8} {'p99 ms':>8} {'min ms':>8}  runs",
        f"{'cold (empty count cache)':34} {ms(cold)}  {cold_runs}",
        f"{'warm (counts cached)':34} {ms(warm)}  {runs}   target p50 <= "
        f"{WARM_TARGET_MS:g} ms: {verdict}",
    ]


# -- the path of a request that is not compacted ----------------------------------------------


def proxy_config() -> Config:
    """The shipped defaults; LARGE_MODEL is MODEL with a 1M window, where 128k is not compacted."""
    return loads(
        f"""
default_upstream: {{chat: nowhere, responses: nowhere, messages: claude}}
upstreams:
  nowhere: {{base_url: "http://127.0.0.1:{free_port()}/v1"}}
  claude: {{base_url: "http://127.0.0.1:{free_port()}/v1", kind: anthropic}}
models:
  - {{match: "{LARGE_MODEL}", context_window: {LARGE_WINDOW}, encoding: o200k_base}}
"""
    )


def request_of(config: Config, model: str, dialect: Dialect, body: dict[str, Any]) -> ClientRequest:
    policy, upstream = config.route(dialect.name, model, None)
    return ClientRequest(
        dialect=dialect,
        parsed=dialect.parse(orjson.dumps({"model": model, **body})),
        tenant="bench",
        session=f"{dialect.name}-{model}",
        policy=policy,
        upstream=upstream,
        credentials=(),
    )


async def bench_request(runs: int, dialect: Dialect) -> list[str]:
    """`dialect`'s request of the long history: chat messages, Codex-like Responses items or
    a Claude Code-like Messages request."""
    messages = long_history(REQUEST_TOKENS, MODEL)
    field = dialect.conversation_param
    if dialect.name == "chat":
        body: dict[str, Any] = {field: messages}
    elif dialect.name == "responses":
        body = {field: as_responses_items(messages), "instructions": "Codex."}
    else:
        body = as_messages_body(messages)
    items = body[field]
    store = MemoryStore(ttl_seconds=3600)
    config = proxy_config()
    metrics = Metrics()
    proxy = Proxy(config, store, UpstreamClient(metrics), metrics)
    compactor = proxy.compactor
    raw = orjson.dumps({"model": MODEL, **body})
    # The next turns: the history grows by a user message each.
    asked: list[dict[str, Any]] = []
    bodies = []
    for turn in range(runs):
        asked.append(_asking(turn))
        bodies.append(orjson.dumps({"model": MODEL, **body, field: [*items, *asked]}))
    turns = iter(bodies)
    plain = request_of(config, LARGE_MODEL, dialect, body)  # under every level: forwarded as is
    replay = request_of(config, MODEL, dialect, body)  # over MODEL's compact level: a plan
    canonical = replay.messages
    keys = replay.parsed.keys or content_keys(canonical)
    counter = proxy.limits.limits(MODEL).counter

    async def prepare(request: ClientRequest, *actions: str) -> None:
        forward = await compactor.prepare(request)
        if forward.action not in actions:
            raise RuntimeError(f"expected {actions}, the proxy did {forward.action}")

    async def get() -> None:
        record = await store.get(replay.key)
        assert record is not None
        SessionState.from_bytes(record.data)

    async def replayed_turn() -> None:
        parsed = dialect.parse(raw)
        await prepare(dataclasses.replace(replay, parsed=parsed), "replayed")

    # The first turn of the replayed session compacts it (its summarizer is unreachable: the
    # digest stands in) and stores the plan; later turns only apply it.
    await prepare(replay, "compacted", "degraded")
    await prepare(plain, "none")  # counts cached, as after the session's first request
    await prepare(replay, "replayed")
    entries = await compactor.view(replay)
    assert entries is not None
    count = len(replay.parsed.items)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("JSON parse alone (orjson.loads)", lambda: orjson.loads(raw)),
        ("parse", lambda: dialect.parse(raw)),
        ("parse, a new user message each turn", lambda: dialect.parse(next(turns))),
    ]
    if isinstance(dialect, Chat | Responses | Messages):
        split = dialect

        def by_items() -> Parsed:
            split.known.bodies = KnownBodies()  # the body unknown, its items known
            return split.parse(raw)

        steps.append(("parse, only the items known", by_items))
        steps.append(("parse, whole body (as before)", lambda: split.parse_whole(raw)))
    if replay.parsed.keys is None:
        steps.append(("content keys (one dumps+hash each)", lambda: content_keys(canonical)))
    steps += [
        ("chain (memoised digests)", lambda: compactor.histories.digests(canonical, keys)),
        ("counts (cached)", lambda: counter.counts(canonical, keys)),
        ("store get + parse", get),
        ("render the replayed view", lambda: dialect.render(replay.parsed, entries)),
        ("Compactor.prepare, action none", lambda: prepare(plain, "none")),
        ("Compactor.prepare, action replayed", lambda: prepare(replay, "replayed")),
        ("parse + prepare, replayed", replayed_turn),
    ]
    lines = [
        f"{dialect.name}: a request of {count} items ({len(canonical)} messages), "
        f"{counter.count(canonical)} tokens, not compacted (memory store):",
        f"{'':36} {'p50 ms':>8} {'p99 ms':>8} {'min ms':>8}",
    ]
    for name, step in steps:
        lines.append(f"{name:36} {ms(await timed(step, runs))}")
    await proxy.prepared.close()
    await proxy.client.close()
    return lines


def _asking(turn: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Go on with step {turn}."}


async def main() -> None:
    # The replayed session's summarizer is unreachable on purpose: no warning about it.
    logging.getLogger("compaction_proxy").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="timed runs per figure")
    args = parser.parse_args()
    print(conditions())
    for line in await bench_compaction(args.runs):
        print(line)
    for dialect in (Chat(), Responses(), Messages()):
        print()
        for line in await bench_request(args.runs, dialect):
            print(line)


if __name__ == "__main__":
    asyncio.run(main())
