"""compaction-proxy beside Headroom (`headroom-ai`), each a proxy in front of the same fake
upstream, on issue 25's two workloads; the figures of each side by side.

    .venv/bin/python bench/versus_headroom.py                  # about 15 minutes
    .venv/bin/python bench/versus_headroom.py --sessions 8     # fewer trace sessions

Headroom runs from its own virtualenv, `.headroom-venv` at the repository's root (git-ignored):

    python3 -m venv .headroom-venv && .headroom-venv/bin/pip install 'headroom-ai[proxy]==0.42.0'

Without it (or `--headroom PATH` to its `headroom` command) its rows are skipped, said so. It is
run offline: `headroom proxy --mode token` (prior turns may be rewritten: its strongest
compression), `--disable-kompress` (Kompress is a model that would be downloaded from a hub:
the only mode that needs one), `--no-cache --no-rate-limit --no-subscription-tracking`, its
telemetry and beacon off, litellm's cost map the local one, HOME a temporary directory.

The upstream is the test suite's strict fake (tests/fakes/openai) in this process, with the
model's window: a request over it gets the API's 400 `context_length_exceeded` (rejected). Its
summarizer hook (the proxy's summaries go to the request's upstream) keeps what the user said and
drops every tool output and assistant turn: no summary keeps a tool's fact or error.

- **tool loop** (bench/tool_errors.py's session: 45 steps at a 16k window, JSON and log outputs
  hiding one error each, five user facts; `max_tokens` 4,096): the client sends the history up
  to each tool output and stops at its first rejected request, as an agent dies on it. Counted:
  steps finished, rejected requests, errors and user facts visible in the last request the
  upstream answered.
- **traces** (bench/tool_facts.py's sessions: the recorded traces four to a session, a fact
  planted in each user message and each tool result; 16k, `max_tokens` 4,096): every request of
  each session and a last question, rejected ones counted and the session going on. Counted:
  tool and user facts visible in each session's last answered request, rejected requests.

For both: tokens forwarded (the fake's count of every answered request, summaries apart), and the
latency each proxy adds: the first ten requests of the tool loop (all within the window), sent
direct and through each proxy in turn, three rounds; the median of each request's time through
the proxy less its time direct.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import tool_errors
import tool_facts
from common import ROOT, Server, free_port, proxy, serve
from compaction import MODEL, conditions
from retention import LAST, shown

from tests.fakes.openai import FakeUpstream, count_prompt_tokens

WINDOW = 16_384
MAX_TOKENS = 4096
HEADROOM = ROOT / ".headroom-venv/bin/headroom"
LAYERS_OFF = "[clear_tool_results, truncate_tool_fields, drop_tool_blocks, summarize, trim_head]"
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("run_tests", "query_db")
]


def users_only(body: dict[str, Any]) -> str:
    """The fake's summarizer: the lines of what users said (and of a previous summary), none of
    a tool's output or an assistant's turn."""
    prompt = body["messages"][-1]["content"]
    kept, skipping = [], False
    for line in prompt.split("\n"):
        if line.startswith("["):
            skipping = not line.startswith("[user")
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


@dataclass
class Run:
    """One proxy's figures on one workload."""

    requests: int = 0
    rejected: int = 0
    forwarded: int = 0
    found: dict[str, list[int]] = field(default_factory=dict)  # kind: [visible, planted]

    def count(self, kind: str, keys: list[str], text: str) -> None:
        seen = self.found.setdefault(kind, [0, 0])
        seen[0] += sum(key in text for key in keys)
        seen[1] += len(keys)

    def said(self, kind: str) -> str:
        visible, planted = self.found.get(kind, [0, 0])
        return f"{visible} of {planted} ({100 * visible / max(1, planted):.1f}%)"


class Client:
    """Chat requests to one base URL, each timed; the upstream's copy of the last one read."""

    def __init__(self, base_url: str, upstream: FakeUpstream) -> None:
        self.api = openai.OpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)
        self.upstream = upstream

    def send(self, messages: list[dict[str, Any]], session: str) -> float | None:
        """Seconds the request took; None when it was rejected."""
        started = time.perf_counter()
        try:
            self.api.chat.completions.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                max_tokens=MAX_TOKENS,
                extra_headers={"x-session-id": session},
            )
        except openai.BadRequestError:
            return None
        return time.perf_counter() - started

    def forwarded(self) -> dict[str, Any]:
        """The body of the last request the upstream got that was no summary request."""
        for request in reversed(self.upstream.requests):
            if "x-compaction-summary" not in request.headers:
                return request.json  # type: ignore[no-any-return]
        raise RuntimeError("the upstream got no request")


def tool_loop(client: Client, name: str) -> tuple[Run, int]:
    session, errors, facts = tool_errors.loop()
    run, steps = Run(), 0
    for end in range(1, len(session) + 1):
        if session[end - 1]["role"] != "tool":
            continue
        run.requests += 1
        if client.send(session[:end], f"loop-{name}") is None:
            run.rejected += 1
            break
        steps += 1
        body = client.forwarded()
        run.forwarded += count_prompt_tokens(body)
        last = shown(body["messages"])
    run.count("errors", errors, last)
    run.count("user facts", facts, last)
    return run, steps


def traces(client: Client, name: str, sessions: list) -> Run:
    run = Run()
    for index, (messages, tool, user) in enumerate(sessions):
        requests = [*messages, LAST]
        last = ""
        for end in tool_facts.request_ends(requests):
            run.requests += 1
            if client.send(requests[:end], f"traces-{name}-{index}") is None:
                run.rejected += 1
                continue
            body = client.forwarded()
            run.forwarded += count_prompt_tokens(body)
            last = shown(body["messages"])
        run.count("tool facts", tool, last)
        run.count("user facts", user, last)
    return run


def added_latency(clients: dict[str, Client], upstream: FakeUpstream) -> dict[str, float]:
    """Median ms each proxy adds to the tool loop's first ten requests (against direct)."""
    session = tool_errors.loop()[0]
    ends = [end for end in range(1, len(session) + 1) if session[end - 1]["role"] == "tool"][:10]
    direct = Client(upstream.base_url, upstream)
    added: dict[str, list[float]] = {name: [] for name in clients}
    for round_ in range(3):
        for end in ends:
            alone = direct.send(session[:end], "direct")
            for name, client in clients.items():
                took = client.send(session[:end], f"latency-{name}-{round_}")
                if alone is not None and took is not None:
                    added[name].append(took - alone)
    return {name: 1000 * statistics.median(times) for name, times in added.items() if times}


@contextlib.contextmanager
def headroom(command: Path, upstream: str) -> Iterator[Server]:
    port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="bench-headroom-") as home,
        mock.patch.dict(  # its environment, for the process it starts; restored after
            os.environ,
            HOME=home,
            OPENAI_TARGET_API_URL=upstream,
            HEADROOM_BEACON="off",
            HEADROOM_TELEMETRY="off",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        ),
    ):
        common.START_TIMEOUT = 120.0  # it loads litellm, magika and its compressors first
        args = [str(command), "proxy", "--port", str(port), "--mode", "token"]
        args += ["--disable-kompress", "--no-cache", "--no-rate-limit"]
        args += ["--no-subscription-tracking", "--no-http2"]
        with serve(args, "headroom", port, "/livez", cwd=Path(home)) as server:
            yield server


def ours(
    upstream: str, layers: str | None, tree: Path | None = None
) -> contextlib.AbstractContextManager[Server]:
    policy = f"policies: {{default: {{layers: {layers}}}}}\n" if layers else ""
    return proxy(
        f"""
upstreams:
  fake: {{base_url: "{upstream}"}}
models:
  - {{match: "{MODEL}", context_window: {WINDOW}}}
{policy}""",
        tree,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headroom", type=Path, default=HEADROOM, help="its `headroom` command")
    parser.add_argument("--sessions", type=int, help="trace sessions (default: all 25)")
    parser.add_argument(
        "--before", type=Path, help="a checkout of the proxy to run beside this one (git archive)"
    )
    args = parser.parse_args()
    print(conditions())
    sessions = tool_facts.sessions()[: args.sessions]
    with (
        FakeUpstream(windows={MODEL: WINDOW}, summarizer=users_only) as upstream,
        contextlib.ExitStack() as stack,
    ):
        servers = {
            "compaction-proxy": stack.enter_context(ours(upstream.base_url, None)),
            "compaction-proxy, no compress_tool_results": stack.enter_context(
                ours(upstream.base_url, LAYERS_OFF)
            ),
        }
        if args.before:
            servers[f"compaction-proxy of {args.before}"] = stack.enter_context(
                ours(upstream.base_url, None, args.before)
            )
        if args.headroom.exists():
            servers["Headroom 0.42 (token mode)"] = stack.enter_context(
                headroom(args.headroom, upstream.base_url)
            )
        else:
            print(f"\nHeadroom is not installed at {args.headroom}: its rows are skipped.")
        clients = {name: Client(server.url, upstream) for name, server in servers.items()}
        latency = added_latency(clients, upstream)
        print(
            "\n| proxy | tool loop: steps | errors visible | user facts | rejected |"
            " tokens forwarded | traces: tool facts visible | user facts | rejected |"
            " tokens forwarded | added latency p50 |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, client in clients.items():
            started = time.perf_counter()
            loop, steps = tool_loop(client, name)
            upstream.reset()
            trace = traces(client, name, sessions)
            upstream.reset()
            print(
                f"| {name} | {steps} of {tool_errors.STEPS} | {loop.said('errors')} |"
                f" {loop.said('user facts')} | {loop.rejected} of {loop.requests} |"
                f" {loop.forwarded:,} | {trace.said('tool facts')} |"
                f" {trace.said('user facts')} | {trace.rejected} of {trace.requests} |"
                f" {trace.forwarded:,} | +{latency.get(name, float('nan')):.2f} ms |"
                f"  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
