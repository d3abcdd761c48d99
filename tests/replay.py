"""Replaying conversations through the running proxy turn by turn, as a real client does, and
measuring what the strict fake upstream received.

    with replay_servers(anchors=[ANCHOR]) as (up, client):
        turns = replay(client, up, messages, model="gpt-4o-8k")

Each `Turn` holds what the client sent, what it got back and the chat requests the upstream
received for it (the summarizer's requests, marked `x-compaction-summary: 1`, left out).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai

from policies import Message, Policy, tool_pair_problems
from policies.message import visible_text
from proxy.tools import recordings
from proxy.tools.replay import stable
from tests.conftest import config_for
from tests.conversations import load_traces
from tests.fakes.base import Summarizer
from tests.fakes.openai import (
    ApiError,
    FakeUpstream,
    check_window,
    count_prompt,
    digest,
    is_summary_request,
    text_of,
    validate_chat,
)
from tests.servers import proxy_server

# Model names that both token counters (the proxy's and the fake's) map to o200k_base.
WINDOWS = {"gpt-4o-4k": 4096, "gpt-4o-8k": 8192, "gpt-4o-16k": 16384, "gpt-4o-32k": 32768}
MAX_TOKENS = 256  # every replayed request asks for it, so the proxy reserves exactly this
SAFETY_MARGIN = Policy().safety_margin_tokens
CHAT_PATH = "/v1/chat/completions"
JOIN = 4  # traces a long session: 4 tau-bench conversations make ~20-40k tokens


@dataclass(frozen=True)
class Turn:
    """One request of a replay: what the client sent and got, what the upstream received."""

    sent: list[Message]
    status: int
    headers: Mapping[str, str]
    error: Any  # the OpenAI error body the client got, None on success
    forwarded: list[dict[str, Any]]  # bodies of the chat requests forwarded for this turn
    reply: str  # the assistant text the client read (streamed or not)

    @property
    def action(self) -> str | None:
        return self.headers.get("x-compaction-action")

    @property
    def view(self) -> list[Message] | None:
        """The messages the upstream answered, None when the turn was refused."""
        return self.forwarded[-1]["messages"] if self.forwarded and self.status == 200 else None

    @property
    def tokens_before(self) -> int:
        return int(self.headers["x-compaction-tokens-before"])

    @property
    def tokens_after(self) -> int:
        return int(self.headers["x-compaction-tokens-after"])

    @property
    def refused(self) -> bool:
        """Refused by the proxy itself with its clear 400, without calling the upstream."""
        code = self.error.get("code") if isinstance(self.error, dict) else None
        return self.status == 400 and code == "context_length_exceeded" and not self.forwarded


def small_summary(body: dict[str, Any]) -> str:
    """The fake summarizer: deterministic, small, within its max_tokens (a third of them in
    words), and it keeps no anchor."""
    prompt = "\n".join(text_of(m.get("content")) for m in body["messages"])
    words = f"The user and the assistant went on with the task, summary {digest(prompt)}.".split()
    return " ".join(words[: max(1, body["max_tokens"] // 3)])


def joined(size: int, start: int = 0, stop: int | None = None) -> list[list[Message]]:
    """The recorded traces [start, stop) joined `size` at a time into long sessions."""
    return recordings.joined([messages for _, messages in load_traces()[start:stop]], size)


@contextlib.contextmanager
def replay_servers(
    *, summarizer: Summarizer = small_summary, **policy: Any
) -> Iterator[tuple[FakeUpstream, openai.OpenAI]]:
    """The strict fake upstream, the proxy in front of it (memory store, `policy` merged into
    the default policy) and the sync openai SDK pointed at the proxy."""
    with FakeUpstream(windows=WINDOWS, summarizer=summarizer) as up:
        models = [{"match": name, "context_window": w} for name, w in WINDOWS.items()]
        config = config_for(up, models=models, policies={"default": policy})
        with (
            proxy_server(config) as server,
            openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0) as client,
        ):
            yield up, client


def send(
    client: openai.OpenAI,
    up: FakeUpstream,
    history: list[Message],
    *,
    session: str,
    model: str,
    stream: bool = False,
) -> Turn:
    """One request through the SDK, with what the upstream received for it.

    The history goes in `extra_body`: the SDK's typed transform of `messages` (the identity on
    plain dicts) costs ~0.4 ms a message, which would triple the replays' time; the SDK still
    builds, sends and parses the request and maps errors as it always does.
    """
    seen = len(up.requests)
    reply, error, status = "", None, 200
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[],
            extra_body={"messages": history},
            max_tokens=MAX_TOKENS,
            stream=stream,
            extra_headers={"X-Session-Id": session},
        )
        headers = raw.headers
        answer = raw.parse()
        if isinstance(answer, openai.Stream):
            reply = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
        else:
            reply = answer.choices[0].message.content or ""
    except openai.APIStatusError as exc:
        headers, error, status = exc.response.headers, exc.body, exc.status_code
    forwarded = [
        r.json
        for r in up.requests[seen:]
        if r.path == CHAT_PATH and not is_summary_request(r.headers, r.json)
    ]
    return Turn(history, status, headers, error, forwarded, reply)


def replay(
    client: openai.OpenAI,
    up: FakeUpstream,
    messages: Sequence[Message],
    *,
    model: str,
    stream: bool = False,
) -> list[Turn]:
    """Every request a client makes of `messages` (the history up to each assistant message),
    in a session of its own."""
    session = f"replay-{uuid.uuid4().hex}"
    return [
        send(client, up, history, session=session, model=model, stream=stream)
        for history in recordings.client_requests(messages)
    ]


def budget_limit(model: str) -> int:
    """The tokens the proxy's budget allows the prompt of a replayed request."""
    return WINDOWS[model] - MAX_TOKENS - SAFETY_MARGIN


def upstream_rejection(body: dict[str, Any]) -> str | None:
    """What the strict upstream says against `body`: a malformed request or an overflow."""
    try:
        validate_chat(body)
        check_window(body, WINDOWS[body["model"]])
    except ApiError as exc:
        return str(exc)
    return None


def broken_pairs(turns: Sequence[Turn]) -> list[str]:
    return [p for t in turns for body in t.forwarded for p in tool_pair_problems(body["messages"])]


def prompt_tokens(messages: list[Message], model: str) -> int:
    """The prompt tokens of `messages` as the upstream counts them."""
    return sum(count_prompt({"model": model, "messages": messages}))


@dataclass(frozen=True)
class Stability:
    """Of the consecutive pairs of served turns, how many keep the earlier view as a prefix;
    `trimming` counts only pairs whose later turn was rewritten (not forwarded as sent)."""

    stable: int
    pairs: int
    trimming_stable: int
    trimming_pairs: int

    @property
    def share(self) -> float:
        return self.stable / self.pairs if self.pairs else 1.0

    @property
    def trimming_share(self) -> float:
        return self.trimming_stable / self.trimming_pairs if self.trimming_pairs else 1.0


def stability(
    sessions: Sequence[Sequence[tuple[Sequence[Any], Sequence[Any] | None]]],
) -> Stability:
    """The stability of sessions given as (sent, forwarded) per turn, None when refused."""
    counts = [0, 0, 0, 0]
    for turns in sessions:
        for (_, before), (sent, after) in itertools.pairwise(turns):
            if before is None or after is None:
                continue
            kept = stable(before, after)
            trimming = after != sent
            counts[0] += kept
            counts[1] += 1
            counts[2] += kept and trimming
            counts[3] += trimming
    return Stability(*counts)


def lost_anchors(sent: Sequence[Message], view: Sequence[Message], pattern: str) -> list[str]:
    """The anchors (matches of `pattern`) that `sent` shows and `view` does not."""
    shown = "\n".join(visible_text(m) for m in view)
    found = re.findall(pattern, "\n".join(visible_text(m) for m in sent))
    return [a for a in dict.fromkeys(found) if a not in shown]


@functools.cache
def traces_replay(
    model: str, join: int, start: int = 0, stop: int | None = None
) -> list[list[Turn]]:
    """The sessions of the traces [start, stop) joined `join` at a time, replayed through the
    proxy at `model`'s window (cached: the 8k replay serves the replay and long-session tests)."""
    with replay_servers() as (up, client):
        sessions = []
        for messages in joined(join, start, stop):
            sessions.append(replay(client, up, messages, model=model))
            up.reset()  # the turns hold what they need of the recorded requests
    return sessions
