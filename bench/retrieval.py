"""The retrieval tool's costs: its prompt tokens on every request that carries it, the extra
latency of one hidden round, and the Redis bytes a session's kept originals take.

    .venv/bin/python bench/retrieval.py            # Redis at 127.0.0.1:6379, about 20 s

A 30-step agent loop at a 16k window (each step a 4 KB build log, the default layers, the
retrieval tool on) through the proxy over Redis in front of the fake OpenAI upstream; then 21
requests answered at once interleaved with 21 whose answer first calls the tool (the fake
answers in well under a millisecond, so the difference is the proxy's round: the tool answered
from Redis, the continued request written and sent, the answer read, the usage summed).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import tiktoken

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.config import Retrieval
from proxy.dialects.retrieval import TOOL_CALLS
from tests.fakes.base import Scripted
from tests.harness import harness

TOOL = Retrieval().tool_name
STEPS, PAIRS = 30, 21
WINDOW = 16_384


def build_log(step: int) -> str:
    rows = [f"[{i:04d}] INFO step {step} compiling module m{i} ok" for i in range(90)]
    rows[45] = f"ERROR E{step:02d}: test_checkout failed at line {step * 7}"
    return "\n".join(rows)


def tool_tokens() -> dict[str, int]:
    """Tokens of the tool's definition as each API is sent it (o200k_base, its JSON)."""
    encoding = tiktoken.get_encoding("o200k_base")
    settings = Retrieval()
    return {
        name: len(encoding.encode(orjson.dumps(calls.tool(TOOL, settings.description)).decode()))
        for name, calls in TOOL_CALLS.items()
    }


def model(_headers: Any, body: dict[str, Any]) -> Scripted | None:
    """Reads the first kept output back when asked to, then answers."""
    *_, asked, last = body["messages"]
    if last["role"] == "tool" and [
        c["function"]["name"] for c in asked.get("tool_calls") or []
    ] == [TOOL]:
        return Scripted(text="read")
    if last["role"] == "user" and last["content"].startswith("Read it back"):
        text = orjson.dumps(body["messages"]).decode()
        handle = text.split("handle=", 1)[1][:17]
        return Scripted(tool=TOOL, arguments={"handle": handle})
    return None


def main() -> None:
    print("tool definition, tokens (o200k_base):", tool_tokens())
    policy = {"retrieval": {"enabled": True}}
    with harness(
        policies={"default": policy}, models=[{"match": "gpt-4", "context_window": WINDOW}]
    ) as h:
        h.up.script = model
        client = h.openai()
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix builds."}]
        carrying, key = 0, ""
        for step in range(STEPS):
            call = {
                "id": f"c{step}",
                "type": "function",
                "function": {"name": "bash", "arguments": "{}"},
            }
            messages += [
                {"role": "user", "content": f"Step {step}: build."},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{step}", "content": build_log(step)},
            ]
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4", messages=messages, extra_headers={"X-Session-Id": "bench"}
            )
            messages.append(
                {"role": "assistant", "content": raw.parse().choices[0].message.content}
            )
            key = raw.headers["x-compaction-session"]
            carrying += "tools" in h.up.requests[-1].json
        prefix = f"{h.config.store.key_prefix}:{{{key}}}:orig"
        kept = h.redis.llen(f"{prefix}:order")
        stored = sum(
            h.redis.memory_usage(k) or 0 for k in (prefix, f"{prefix}:order", f"{prefix}:gone")
        )
        originals = sum(len(build_log(s).encode()) for s in range(STEPS))
        print(f"agent loop: {STEPS} steps, {carrying} requests carried the tool; kept: {kept}")
        encoding = tiktoken.get_encoding("o200k_base")
        each = statistics.mean(len(encoding.encode(build_log(s))) for s in range(STEPS))
        cost = carrying * tool_tokens()["chat"]
        print(f"the tool's tokens over the loop: {cost}; one kept output: {each:.0f} tokens")
        print(f"Redis bytes of the session's kept originals: {stored} (outputs: {originals} bytes)")

        timings: dict[str, list[float]] = {"direct": [], "round": []}
        for i in range(PAIRS):
            for kind, text in (("direct", "Go on."), ("round", "Read it back.")):
                ask = [*messages, {"role": "user", "content": f"{text} {i}"}]
                started = time.perf_counter()
                raw = client.chat.completions.with_raw_response.create(
                    model="gpt-4", messages=ask, extra_headers={"X-Session-Id": "bench"}
                )
                timings[kind].append(time.perf_counter() - started)
                assert raw.headers.get("x-compaction-retrievals", "0") == (
                    "1" if kind == "round" else "0"
                )
        direct, rounded = (statistics.median(timings[k]) * 1000 for k in ("direct", "round"))
        print(f"median of {PAIRS}, interleaved: direct {direct:.1f} ms, one round {rounded:.1f} ms")
        print(f"extra latency of one round: {rounded - direct:.1f} ms")
    with open("/proc/loadavg") as load:
        print("load average:", " ".join(load.read().split()[:3]))


if __name__ == "__main__":
    main()
