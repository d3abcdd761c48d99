"""The stateful test harness: `harness()` starts a strict fake upstream and proxies in front of
it on a Redis key prefix of the test's own (its keys are deleted after), and a `Conversation`
resends its whole history every turn, as clients do.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import redis

from policies import Budget
from policies.plan import DIGEST_HEADING, SUMMARY_HEADING
from proxy.config import Config
from proxy.sessions.state import Prepared, SessionState
from tests.conftest import config_for, merged, metric
from tests.conversations import words
from tests.fakes.base import SummaryResult
from tests.fakes.openai import FakeUpstream
from tests.redis_servers import inspector
from tests.servers import ServerThread, proxy_server

REDIS_URL = "redis://127.0.0.1:6379/0"
MODEL = "gpt-4"  # counted exactly (cl100k_base), as the fake counts it
WINDOW = 4096  # the proxy's window for MODEL (the fake's is 8192, so it never rejects)
ADMIN_TOKEN = "admin-token-of-the-tests"
# The admin API without the dashboard, whose turns are written by themselves: for the tests of
# what else writes the store, and when.
NO_DASHBOARD = {"token": ADMIN_TOKEN, "dashboard": {"enabled": False}}
SESSION_HEADER = "X-Session-Id"

Message = dict[str, Any]


class Summaries:
    """The fake upstream's summarizer hook: records each summary request, answers by `answer`
    (called with the 1-based number of the request)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.answer: Callable[[int], SummaryResult] = lambda n: f"SUMMARY-{n}: goals and facts."

    def __call__(self, body: dict[str, Any]) -> SummaryResult:
        self.bodies.append(body)
        return self.answer(len(self.bodies))

    @property
    def prompts(self) -> list[str]:
        """The user prompt of each summary request: previous summary and new messages."""
        return [str(body["messages"][-1]["content"]) for body in self.bodies]


def said(turn: int, size: int = 100) -> str:
    """The user's message of one turn: unique text of `size` words (~1.3 tokens a word)."""
    return f"Turn {turn}: {words(size, turn)}"


def history(rounds: int, variant: str = "", size: int = 100) -> list[Message]:
    """A chat of `rounds` answered rounds and a new question; `variant` edits the first one."""
    messages: list[Message] = [{"role": "system", "content": "You are a terse assistant."}]
    for turn in range(rounds):
        text = said(turn, size) + (variant if turn == 0 else "")
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
    return [*messages, {"role": "user", "content": said(rounds, size)}]


@dataclasses.dataclass
class Harness:
    up: FakeUpstream
    summaries: Summaries
    config: Config
    servers: list[ServerThread]
    redis: redis.Redis | redis.RedisCluster
    stack: contextlib.ExitStack  # closes what the harness hands out when it ends

    @property
    def url(self) -> str:
        return self.servers[0].url

    def openai(self, server: int = 0, api_key: str = "sk-test") -> openai.OpenAI:
        """The SDK pointed at one of the proxies; closed with the harness."""
        url = self.servers[server].url + "/v1"
        client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0)
        return self.stack.enter_context(client)

    def conversation(
        self, session: str = "s1", *, server: int = 0, api_key: str = "sk-test", **kwargs: Any
    ) -> Conversation:
        return Conversation(self.openai(server, api_key), session, **kwargs)

    def budget(self, model: str = MODEL) -> Budget:
        """The budget the proxy computes for `model` (no max_tokens, no calibration)."""
        app = self.servers[0].server.config.app
        limits = app.state.proxy.limits.limits(model)
        policy = self.config.policies[self.config.default_policy]
        return policy.compaction.budget(limits.window, limits.max_output, None)

    def state_key(self, key: str) -> str:
        return f"{self.config.store.key_prefix}:{{{key}}}:state"

    def record(self, key: str) -> tuple[int, SessionState] | None:
        """The session's record as stored in Redis: (version, state), None when absent."""
        version, data = self.redis.hmget(self.state_key(key), ["v", "d"])
        if version is None:
            return None
        return int(version), SessionState.from_bytes(data)

    def version(self, key: str) -> int:
        found = self.record(key)
        return found[0] if found else 0

    def state(self, key: str) -> SessionState:
        found = self.record(key)
        return found[1] if found else SessionState()

    def forwarded(self) -> list[list[Message]]:
        """The messages of every chat request that reached the upstream (not summaries)."""
        return [
            r.json["messages"]
            for r in self.up.requests
            if r.path == "/v1/chat/completions" and r.headers.get("x-compaction-summary") != "1"
        ]

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        return httpx.request(method, self.url + path, headers=headers, **kwargs)

    def metric(self, name: str, **labels: str) -> float:
        """The first proxy's /metrics samples of `name` with these labels, summed (`metric`)."""
        with httpx.Client() as http:
            return metric(http, self.servers[0], name, **labels)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)


@contextlib.contextmanager
def harness(*, replicas: int = 1, redis_url: str = REDIS_URL, **sections: Any) -> Iterator[Harness]:
    """A fresh fake upstream and `replicas` proxies sharing a Redis key prefix of their own;
    `sections` are merged into the config."""
    prefix = f"cptest:{os.urandom(6).hex()}"
    summaries = Summaries()
    client = inspector(redis_url)
    # A store timeout of seconds, not the default half second: the servers and their clients
    # share a loaded machine's cores with the rest of the suite, and an event loop that lags
    # past the timeout would fail a call to a healthy store (a dead one still fails at once).
    defaults = {
        "store": {"url": redis_url, "key_prefix": prefix, "timeout_seconds": 3},
        "models": [{"match": MODEL, "context_window": WINDOW}],
        "admin": {"token": ADMIN_TOKEN},
    }
    with contextlib.ExitStack() as stack:
        stack.callback(client.close)
        stack.callback(_delete_keys, client, prefix)
        up = stack.enter_context(
            FakeUpstream(windows={MODEL: 8192, "small-8k": 8192}, summarizer=summaries)
        )
        config = config_for(up, **merged(defaults, sections))
        servers = [stack.enter_context(proxy_server(config)) for _ in range(replicas)]
        yield Harness(up, summaries, config, servers, client, stack)


def _delete_keys(client: redis.Redis | redis.RedisCluster, prefix: str) -> None:
    with contextlib.suppress(redis.ConnectionError):
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)


class Conversation:
    """A chat as a client holds it: the whole history is resent every turn."""

    def __init__(
        self, client: openai.OpenAI, session: str, *, model: str = MODEL, rounds: int = 0
    ) -> None:
        """`rounds`: start with that many rounds of `history` already said."""
        self.client = client
        self.session = session
        self.model = model
        self.messages = history(rounds)[:-1]
        self.turns = rounds
        self.key = ""
        self.usage: list[int] = []  # the upstream's prompt tokens, turn by turn

    def say(self, text: str | None = None, **kwargs: Any) -> httpx.Headers:
        """Send the next user message (new text of `said` by default); keep the reply."""
        self.messages.append({"role": "user", "content": text or said(self.turns)})
        self.turns += 1
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=self.messages,
            extra_headers={SESSION_HEADER: self.session},
            **kwargs,
        )
        completion = raw.parse()
        self.messages.append(
            {"role": "assistant", "content": completion.choices[0].message.content}
        )
        self.usage.append(completion.usage.prompt_tokens if completion.usage else 0)
        self.key = raw.headers["x-compaction-session"]
        assert raw.headers["x-compaction-store"] == "ok"
        return raw.headers

    def skip(self, rounds: int) -> None:
        """Rounds said elsewhere: the next turn resends them all at once."""
        for turn in range(self.turns, self.turns + rounds):
            self.messages += [
                {"role": "user", "content": said(turn)},
                {"role": "assistant", "content": "Noted."},
            ]
        self.turns += rounds

    def until(self, action: str, limit: int = 60) -> httpx.Headers:
        """Say new things until the proxy answers with `action`."""
        for _ in range(limit):
            headers = self.say()
            if headers["x-compaction-action"] == action:
                return headers
        raise AssertionError(f"no {action!r} in {limit} turns")

    def fork(self) -> Conversation:
        """Another client holding a copy of this history, in the same session."""
        other = copy.copy(self)
        other.messages = copy.deepcopy(self.messages)
        return other


def grow_to_prepare(h: Harness, chat: Conversation) -> None:
    """Say new things until the proxy starts preparing a summary (in the background)."""
    prepare = h.budget(chat.model).prepare_tokens
    for _ in range(30):
        if int(chat.say()["x-compaction-tokens-after"]) >= prepare:
            return
    raise AssertionError("the prepare level was not reached")


def prepare_ahead(h: Harness, chat: Conversation, limit: int = 30) -> Prepared:
    """Say new things until the proxy prepares a summary ahead of time; that summary."""
    prepare = h.budget(chat.model).prepare_tokens
    for _ in range(limit):
        headers = chat.say()
        assert headers["x-compaction-action"] in ("none", "replayed")
        if int(headers["x-compaction-tokens-after"]) >= prepare:
            h.wait_for(lambda: h.state(chat.key).prepared is not None)
            prepared = h.state(chat.key).prepared
            assert prepared is not None
            return prepared
    raise AssertionError(f"nothing prepared in {limit} turns")


def header_text(view: list[Message]) -> str:
    """The summary message of a forwarded view (the first after the system messages)."""
    first = next(m for m in view if m["role"] != "system")
    content = first["content"]
    assert isinstance(content, str) and content.startswith((SUMMARY_HEADING, DIGEST_HEADING))
    return content
