"""What bench/agent_clients.py measures of a run: the report (printed, and written as JSON) and
the request bodies kept as fixtures (tests/data/clients).

Forwarded requests are those the fake received; the main conversation's turns are the ones of
the client's main thread (Codex's `thread-id`, Claude Code's requests without
`x-claude-code-agent-id`) that offer the shell tool, summary requests of the proxy's own left
out.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from agent_model import (
    CLIENT_SUMMARY_PROMPTS,
    DONE_MARKER,
    INSTRUCTIONS_MARKER,
    Fact,
    messages_turn,
    responses_turn,
    strings,
)
from recorder import Exchange

from tests.fakes.base import Answered, RecordedRequest

# List prices in USD per million tokens. claude-opus-5-5: as Claude Code 2.1.332 bills it (the
# pricing tier of its model catalog, read on 2026-11-27). Codex's gpt-5.5: GPT-5's list prices
# (OpenAI, August 2025), as Codex CLI carries no prices; OpenAI bills no cache writes.
PRICES = {
    "claude": {"input": 4.00, "cache_read": 0.20, "cache_write_5m": 5.00, "cache_write_1h": 8.00},
    "codex": {"input": 1.25, "cache_read": 0.125, "cache_write_5m": 0.0, "cache_write_1h": 0.0},
}
OUTPUT_PRICES = {"claude": 20.00, "codex": 10.00}
API_PATHS = ("/v1/responses", "/v1/messages")
SHELLS = frozenset(("exec_command", "shell_command", "shell", "Bash"))
CLIENT_CONTEXT = {  # what each client sends as its own context, found in a forwarded request
    "codex": ("<environment_context>", INSTRUCTIONS_MARKER),
    "claude": ("# Environment", INSTRUCTIONS_MARKER),
}


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything one run recorded."""

    client: str
    model: str
    window: int
    iterations: int
    facts: list[Fact]
    exit_code: int | str
    seconds: float
    stdout: str
    stderr: str
    exchanges: list[Exchange]  # the client's requests, as it sent them
    forwarded: list[RecordedRequest]  # the requests the fake received
    answered: list[Answered]
    rejected: int
    summary_calls: int
    log: list[dict[str, Any]]  # the proxy's log events
    sessions: dict[str, Any]  # the admin API's sessions


def _body_of(request: RecordedRequest) -> dict[str, Any]:
    return request.json if isinstance(request.json, dict) else {}


def _tools(body: Mapping[str, Any]) -> set[str]:
    return {str(t.get("name")) for t in body.get("tools") or [] if isinstance(t, dict)}


def _conversation(client: str, headers: Mapping[str, str]) -> str:
    if client == "codex":
        return headers.get("thread-id") or headers.get("session-id") or ""
    return headers.get("x-claude-code-agent-id") or "main"


def main_turns(client: str, requests: Iterable[RecordedRequest]) -> list[RecordedRequest]:
    """The requests of the main conversation's tool loop, in order."""
    loop = [
        r
        for r in requests
        if r.path in API_PATHS
        and r.headers.get("x-compaction-summary") != "1"
        and SHELLS & _tools(_body_of(r))
    ]
    if not loop:
        return []
    main = _conversation(client, loop[0].headers)
    return [r for r in loop if _conversation(client, r.headers) == main]


def _conversation_items(body: Mapping[str, Any]) -> tuple[bytes, list[bytes]]:
    """(the fixed part: instructions or system, and tools; each item of the conversation),
    without cache breakpoints: Claude Code moves its own every turn, and the prompt cache
    does not key on them."""
    items = body.get("input") if "input" in body else body.get("messages")
    items = items if isinstance(items, list) else [items]
    fixed = [body.get("instructions"), body.get("system"), body.get("tools")]
    return orjson.dumps(_unmarked(fixed)), [orjson.dumps(_unmarked(item)) for item in items]


def _unmarked(value: Any) -> Any:
    """A JSON value without its `cache_control` fields."""
    if isinstance(value, list):
        return [_unmarked(item) for item in value]
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    return value


def prefix_stability(turns: Sequence[RecordedRequest]) -> float | None:
    """The share of turns whose forwarded body begins with the previous turn's: the same
    fixed part, and the previous conversation's items unchanged at its start."""
    if len(turns) < 2:
        return None
    stable = 0
    for before, after in itertools.pairwise(turns):
        fixed_before, items_before = _conversation_items(_body_of(before))
        fixed_after, items_after = _conversation_items(_body_of(after))
        if fixed_before == fixed_after and items_after[: len(items_before)] == items_before:
            stable += 1
    return round(stable / (len(turns) - 1), 3)


def bill(client: str, answered: Iterable[Answered]) -> dict[str, Any]:
    """Tokens and dollars at list prices: uncached input, cache reads, cache writes, output."""
    tokens = Counter[str]()
    for answer in answered:
        usage = answer.usage
        if "input_tokens_details" in usage:  # Responses: input_tokens counts the cached ones
            read = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
            tokens["input"] += int(usage["input_tokens"]) - read
            tokens["cache_read"] += read
        else:
            created = usage.get("cache_creation") or {}
            tokens["input"] += int(usage.get("input_tokens") or 0)
            tokens["cache_read"] += int(usage.get("cache_read_input_tokens") or 0)
            tokens["cache_write_5m"] += int(created.get("ephemeral_5m_input_tokens") or 0)
            tokens["cache_write_1h"] += int(created.get("ephemeral_1h_input_tokens") or 0)
        tokens["output"] += int(usage.get("output_tokens") or 0)
    prices = {**PRICES[client], "output": OUTPUT_PRICES[client]}
    dollars = {kind: round(tokens[kind] * price / 1e6, 4) for kind, price in prices.items()}
    return {
        "tokens": {kind: tokens[kind] for kind in prices},
        "usd": dollars,
        "usd_total": round(sum(dollars.values()), 4),
    }


def _facts(facts: Sequence[Fact], text: str) -> dict[str, Any]:
    visible = [f for f in facts if f.value in text]
    return {
        "planted": len(facts),
        "visible": len(visible),
        "verbatim": sum(f.line in text for f in facts),
        "missing": [f.step for f in facts if f.value not in text],
    }


def _reminders(body: Mapping[str, Any]) -> dict[str, int]:
    """Claude Code's `<system-reminder>` texts in a request's messages: all, and how many differ."""
    found = [t for t in strings(body.get("messages")) if t.lstrip().startswith("<system-reminder>")]
    return {"blocks": len(found), "distinct": len(set(found))}


def _repeated_systems(client: Mapping[str, Any], forwarded: Mapping[str, Any]) -> dict[str, int]:
    """Copies of the `system` messages inside `messages` that the client repeats word for
    word (Claude Code's), in its last request and in what was forwarded of it."""
    found = [
        " ".join(strings(m.get("content")))
        for m in client.get("messages") or []
        if isinstance(m, dict) and m.get("role") == "system"
    ]
    repeated = {text for text in found if found.count(text) > 1}
    sent = " ".join(strings(forwarded.get("messages")))
    return {"client": sum(map(found.count, repeated)), "forwarded": sum(map(sent.count, repeated))}


def _forwarded_rows(log: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The proxy's decision on each request it forwarded, from its log."""
    rows = []
    for event in log:
        if event.get("event") != "request forwarded":
            continue
        decisions = event.get("decisions") or []
        rows.append(
            {
                "session": str(event.get("session", ""))[:8],
                "status": event.get("status"),
                "action": event.get("action"),
                "tokens_before": event.get("tokens_before"),
                "tokens_after": event.get("tokens_after"),
                "layers": [d.get("layer") for d in decisions],
                "summary": next(
                    (d.get("detail") for d in decisions if d.get("layer") == "summarize"), None
                ),
            }
        )
    return rows


def report(run: Run) -> dict[str, Any]:
    turns = main_turns(run.client, run.forwarded)
    last = " ".join(strings(_body_of(turns[-1]))) if turns else ""
    rows = _forwarded_rows(run.log)
    compactions = [r for r in rows if r["action"] in ("compacted", "degraded")]
    layers = Counter(layer for r in rows for layer in r["layers"])
    client_turns = main_turns(run.client, (e.request for e in run.exchanges))
    agent = run.exchanges[0].request.headers.get("user-agent", "") if run.exchanges else ""
    final = run.stdout.rfind(DONE_MARKER)
    context = {
        marker: round(sum(marker in " ".join(strings(_body_of(t))) for t in turns) / len(turns), 3)
        for marker in CLIENT_CONTEXT[run.client]
        if turns
    }
    return {
        "client": run.client,
        "user_agent": agent,
        "model": run.model,
        "window": run.window,
        "iterations": run.iterations,
        "exit_code": run.exit_code,
        "seconds": round(run.seconds, 1),
        "final_answer": final >= 0,
        "facts_in_final_answer": _facts(run.facts, run.stdout[max(final, 0) :])["visible"]
        if final >= 0
        else 0,
        "client_requests": len(run.exchanges),
        "client_loop_turns": len(client_turns),
        "client_errors": sum(e.status >= 400 for e in run.exchanges),
        "forwarded_loop_turns": len(turns),
        "rejected_upstream": run.rejected,
        "actions": dict(Counter(r["action"] for r in rows)),
        "layers": dict(layers),
        "compactions": len(compactions),
        "trim_head_share": round(
            sum("trim_head" in r["layers"] for r in compactions) / len(compactions), 3
        )
        if compactions
        else None,
        "summaries": {
            "proxy_summary_calls": run.summary_calls,
            "compactions_with_llm_summary": sum(r["summary"] == "llm" for r in compactions),
            "compactions_with_digest": sum(
                str(r["summary"] or "").startswith("degraded") for r in compactions
            ),
        },
        "facts_in_last_request": _facts(run.facts, last),
        "client_context_share": context,
        "system_reminders_in_last_request": _reminders(_body_of(turns[-1]) if turns else {}),
        "repeated_system_messages_in_last_request": _repeated_systems(
            _body_of(client_turns[-1]) if client_turns else {},
            _body_of(turns[-1]) if turns else {},
        ),
        "prefix_stability": prefix_stability(turns),
        "client_prefix_stability": prefix_stability(client_turns),  # what the client sent
        "bill": bill(run.client, run.answered),
        "requests": rows,
        "sessions": run.sessions,
        "stdout_tail": run.stdout[-3000:],
        "stderr_tail": run.stderr[-2000:],
    }


def print_report(figures: Mapping[str, Any]) -> None:
    facts = figures["facts_in_last_request"]
    money = figures["bill"]
    print(
        f"\n== {figures['client']} ({figures['user_agent']}), {figures['model']} at a"
        f" {figures['window']:,}-token window, {figures['iterations']} iterations =="
    )
    print(
        f"exit code {figures['exit_code']}, {figures['seconds']} s; final answer reached:"
        f" {figures['final_answer']} (facts in it: {figures['facts_in_final_answer']})"
    )
    print(
        f"requests: {figures['client_requests']} from the client ({figures['client_loop_turns']}"
        f" in its loop), {figures['forwarded_loop_turns']} loop turns forwarded;"
        f" rejected upstream: {figures['rejected_upstream']}; errors the client saw:"
        f" {figures['client_errors']}"
    )
    print(f"actions: {figures['actions']}; layers: {figures['layers']}")
    print(
        f"compactions: {figures['compactions']}, trim_head in {figures['trim_head_share']};"
        f" summaries: {figures['summaries']}"
    )
    print(
        f"facts in the last forwarded request: {facts['visible']}/{facts['planted']}"
        f" ({facts['verbatim']} verbatim); missing: {facts['missing']}"
    )
    print(
        f"client context in forwarded loop turns: {figures['client_context_share']};"
        f" system reminders in the last: {figures['system_reminders_in_last_request']};"
        f" repeated system messages in the last (the client's, forwarded):"
        f" {figures['repeated_system_messages_in_last_request']}"
    )
    print(
        f"prefix stability: {figures['prefix_stability']} (of the client's own requests:"
        f" {figures['client_prefix_stability']})"
    )
    print(f"bill: {money['tokens']} -> ${money['usd_total']} {money['usd']}")
    for number, row in enumerate(figures["requests"], 1):
        tokens = f"{row['tokens_before']!s:>6} -> {row['tokens_after']!s:>6}"
        print(
            f"  {number:3d} {row['session']} {row['status']} {row['action']:<10} {tokens}"
            f" {','.join(row['layers'])}"
        )


def _headers(headers: Mapping[str, str], leave_out: Iterable[str] = ()) -> dict[str, str]:
    left_out = set(leave_out)
    return {str(k): v for k, v in headers.items() if k.lower() not in left_out}


def _request(request: RecordedRequest) -> dict[str, Any]:
    return {
        "method": request.method,
        "path": request.path,
        "query": request.query,
        "headers": _headers(request.headers),
        "body": request.json if request.json is not None else request.body.decode(errors="replace"),
    }


def save_traffic(run: Run, stem: Path) -> list[Path]:
    """Every request the client sent (with its answer's status and headers) and every request
    the fake received, a JSON object a line: `<stem>-<client>-client.jsonl`, `-forwarded.jsonl`."""
    client = Path(f"{stem}-{run.client}-client.jsonl")
    forwarded = Path(f"{stem}-{run.client}-forwarded.jsonl")
    client.write_bytes(
        b"".join(
            orjson.dumps(
                {**_request(e.request), "status": e.status, "answer_headers": _headers(e.headers)}
            )
            + b"\n"
            for e in run.exchanges
        )
    )
    forwarded.write_bytes(b"".join(orjson.dumps(_request(r)) + b"\n" for r in run.forwarded))
    return [client, forwarded]


def _fixture(run: Run, exchange: Exchange, what: str) -> bytes:
    request = exchange.request
    headers = _headers(request.headers, ("host", "content-length"))  # this run's, not the client's
    agent = request.headers.get("user-agent", run.client)
    return orjson.dumps(
        {
            "what": what,
            "recorded": f"{agent}, through bench/agent_clients.py (model {run.model})",
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "headers": headers,
            "body": request.json,
        },
        option=orjson.OPT_INDENT_2,
    )


def save_fixtures(run: Run, directory: Path) -> list[Path]:
    """The client's requests worth a test, as it sent them: its first and a mid-loop request,
    and for Claude Code a sub-agent's and its own compaction request when there were any."""
    directory.mkdir(parents=True, exist_ok=True)
    by_request = {id(e.request): e for e in run.exchanges}
    loop = [by_request[id(r)] for r in main_turns(run.client, (e.request for e in run.exchanges))]
    chosen: dict[str, tuple[Exchange, str]] = {}
    if loop:
        chosen["first"] = (loop[0], "the first request of the tool loop")
        chosen["mid-loop"] = (loop[len(loop) // 2], "a request half way through the tool loop")
    calls = [e for e in run.exchanges if e.request.path in API_PATHS]
    if run.client == "claude":
        subagent = [e for e in calls if "x-claude-code-agent-id" in e.request.headers]
        if subagent:
            chosen["subagent"] = (subagent[0], "a sub-agent's first request (the Agent tool)")
    own = [e for e in calls if _is_client_compaction(_body_of(e.request))]
    if own:
        chosen["compaction"] = (own[0], "the client's own compaction request")
    written = []
    for name, (exchange, what) in chosen.items():
        path = directory / f"{run.client}-{name}.json"
        path.write_bytes(_fixture(run, exchange, what) + b"\n")
        written.append(path)
    return written


def _is_client_compaction(body: Mapping[str, Any]) -> bool:
    turn = messages_turn(body) if "messages" in body else responses_turn(body)
    return any(prompt in turn.newest for prompt in CLIENT_SUMMARY_PROMPTS)
