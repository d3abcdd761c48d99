"""A compacted session's replayed turn, for bench/overhead.py, in each API.

The client sends the whole long history (bench/common.py's `long_history`) for a model the
proxy serves at a 32k window: the session's first request is compacted, and every later one
replays the stored plan (`x-compaction-action: replayed`). What the proxy forwards is what a
direct request is measured with: the session's plan, read from the admin API, applied to the
history by the proxy's own dialect code, as its request path does (`ClientRequest.body`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from common import as_messages_body

import policies
from proxy.compaction.turn import ClientRequest
from proxy.config import loads
from proxy.dialects import Dialect
from proxy.dialects.anthropic.messages import Messages
from proxy.dialects.openai.chat import Chat
from proxy.dialects.openai.responses import Responses

MODEL = "gpt-4o-32k"  # the proxy's name of gpt-4o at a 32k window: compacted
WINDOW = 32_000
ADMIN_TOKEN = "bench-admin-token"
DIALECTS: dict[str, Dialect] = {"chat": Chat(), "responses": Responses(), "messages": Messages()}
# The figures' kinds, by API.
KINDS = {f"replayed-{api}": api for api in DIALECTS}
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "sk-bench"}


@dataclass
class Replayed:
    """One API's case: what the client sends, and what the proxy forwards (once known)."""

    api: str
    path: str  # below /v1
    sent: bytes
    headers: dict[str, str]
    forwarded: bytes = b""


def cases(
    history: list[dict[str, Any]], items: list[dict[str, Any]], headers: dict[str, str]
) -> dict[str, Replayed]:
    """Each API's case: the chat history, the same as Responses `items`, and as a Claude
    Code-like Messages request."""
    bodies = {
        "chat": ("/chat/completions", {"messages": history}),
        "responses": ("/responses", {"instructions": "You are Codex.", "input": items}),
        "messages": ("/messages", {**as_messages_body(history), "max_tokens": 4096}),
    }
    found = {}
    for kind, api in KINDS.items():
        path, body = bodies[api]
        fields = {"store": False} if api == "responses" else {}
        sent = orjson.dumps({"model": MODEL, **body, **fields})
        extra = ANTHROPIC_HEADERS if api == "messages" else {}
        own = {**headers, **extra, "X-Session-Id": f"bench-{kind}"}
        found[kind] = Replayed(api, path, sent, own)
    return found


def models_yaml() -> str:
    """The proxy config's lines for MODEL (under `models:`)."""
    return f'  - {{match: "{MODEL}", context_window: {WINDOW}}}\n'


async def compact(
    session: aiohttp.ClientSession, proxy: str, case: Replayed
) -> tuple[float, int, int]:
    """The session's first turn (compacted) and its second (replayed), through `proxy`:
    the second's x-compaction-overhead-ms (its state parsed for the first time), and the
    tokens it was sent and forwarded."""
    actions = []
    overhead, tokens = 0.0, (0, 0)
    for _ in range(2):
        async with session.post(proxy + case.path, data=case.sent, headers=case.headers) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{proxy} answered {r.status} to the {case.api} history")
            actions.append(r.headers.get("x-compaction-action"))
            overhead = float(r.headers["x-compaction-overhead-ms"])
            key = r.headers["x-compaction-session"]
            before, after = (
                r.headers["x-compaction-tokens-before"],
                r.headers["x-compaction-tokens-after"],
            )
            tokens = (int(before), int(after))
    if actions[0] not in ("compacted", "degraded") or actions[1] != "replayed":
        raise RuntimeError(f"the proxy did {actions} to the {case.api} history")
    if not case.forwarded:
        case.forwarded = await _forwarded(session, proxy, case, key)
    return overhead, *tokens


async def _forwarded(session: aiohttp.ClientSession, proxy: str, case: Replayed, key: str) -> bytes:
    origin = proxy.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with session.get(f"{origin}/admin/sessions/{key}", headers=headers) as r:
        state = orjson.loads(await r.read())
    plan = policies.Plan.from_dict(state["branches"][0]["plan"])
    config = loads(
        "upstreams: {fake: {base_url: 'http://127.0.0.1:9/v1'},"
        " claude: {base_url: 'http://127.0.0.1:9/v1', kind: anthropic}}\n"
        "default_upstream: {chat: fake, responses: fake, messages: claude}\n"
    )
    dialect = DIALECTS[case.api]
    policy, upstream = config.route(dialect.name, MODEL, None)
    request = ClientRequest(
        dialect=dialect,
        parsed=dialect.parse(case.sent),
        tenant="bench",
        session="bench",
        policy=policy,
        upstream=upstream,
        credentials=(),
    )
    role = policy.compaction.summary_role
    return request.body(policies.render_entries(request.messages, plan, summary_role=role))
