"""Sessions on a Redis Cluster and behind Sentinels, through a failover: real servers of the
tests' own (tests/redis_servers.py), proxies sharing them, the real openai SDK.

Redis replicates asynchronously, so a failover may lose the newest acknowledged writes. What
the proxy promises: requests are served all along (fail-open while the master is gone), a
session may lose its newest plan and compact again, but it never gets a mixed or foreign
plan, and a summary made before the failover cannot overwrite the one made after it: the
compare-and-set rejects the stale write (its fencing token is older).

Run with `pytest -s` to see the measured failover times.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import math
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import openai
import orjson
import pytest

from proxy.observability.metrics import Metrics
from proxy.sessions.sessions import Sessions, session_key
from proxy.sessions.store import RedisStore
from tests.conversations import view_problems
from tests.harness import (
    MODEL,
    SESSION_HEADER,
    Conversation,
    Harness,
    harness,
    header_text,
    said,
)
from tests.redis_servers import (
    Cluster,
    Sentinels,
    cut_replication,
    free_port,
    redis_cluster,
    redis_sentinels,
    redis_server,
    replicated,
    wait_for,
)


class Gate:
    """The fake upstream's summarizer: `SUMMARY-n`, except the one call it is told to hold,
    which waits until the gate is opened."""

    def __init__(self) -> None:
        self.calls = 0
        self.armed = False
        self.held = threading.Event()
        self.opened = threading.Event()

    async def __call__(self, body: dict[str, Any]) -> str:
        self.calls += 1
        number = self.calls
        if self.armed:
            self.armed = False
            self.held.set()
            while not self.opened.is_set():
                await asyncio.sleep(0.01)
        return f"SUMMARY-{number}: what the conversation said."


@contextlib.contextmanager
def topology(kind: str) -> Iterator[Cluster | Sentinels]:
    with redis_cluster(node_timeout_ms=500) if kind == "cluster" else redis_sentinels() as servers:
        yield servers


def ready(h: Harness, server: int) -> bool:
    return httpx.get(h.servers[server].url + "/readyz").status_code == 200


def post(h: Harness, server: int, chat: Conversation) -> httpx.Response:
    """The conversation's next turn through replica `server`, whatever the store says."""
    messages = [*chat.messages, {"role": "user", "content": f"Turn {chat.turns}: go on."}]
    response = httpx.post(
        h.servers[server].url + "/v1/chat/completions",
        json={"model": MODEL, "messages": messages},
        headers={SESSION_HEADER: chat.session, "Authorization": "Bearer sk-test"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response


def summary_of(h: Harness, key: str) -> str:
    """The summary of the session's (one) stored plan."""
    record = h.record(key)
    assert record is not None
    (branch,) = record[1].branches
    assert branch.plan.summary is not None
    return branch.plan.summary.text


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("cluster", marks=pytest.mark.cluster),
        pytest.param("sentinel", marks=pytest.mark.sentinel),
    ],
)
def test_a_failover_loses_the_newest_plan_and_rejects_the_stale_summary(kind: str) -> None:
    # No summary prepared ahead of time: the only writes are the compactions'.
    policy = {"default": {"prepare_at": 0.9}}
    with (
        topology(kind) as servers,
        harness(replicas=2, redis_url=servers.url, policies=policy) as h,
    ):
        gate = Gate()
        h.up.summarizer = gate
        chat = h.conversation("s1", server=0)
        chat.until("compacted")
        key = chat.key
        primary, replica = servers.shard(h.state_key(key))
        replicated(primary, replica)
        assert h.version(key) == 1
        # The replica gets nothing more: the next plan is acknowledged by the master alone.
        cut_replication(primary, replica)
        chat.until("compacted")
        assert h.version(key) == 2
        newest = summary_of(h, key)

        # A compaction in flight on replica 0: it read version 2, holds the lock, and its
        # summary is being written when the master dies.
        stale = chat.fork()
        stale.skip(8)
        fresh = stale.fork()  # the same turn, sent again to replica 1 after the failover
        fresh.client = h.conversation("s1", server=1).client
        gate.armed = True
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(stale.say)
            assert gate.held.wait(10)
            killed = time.monotonic()
            primary.kill()
            replica.thaw()
            # Served all along, from the request alone.
            during = post(h, 1, fresh)
            assert during.headers["x-compaction-store"] == "unavailable"
            failover = wait_for(servers.healthy, 30)
            recovered = wait_for(lambda: ready(h, 1), 10)
            back = time.monotonic() - killed
            print(
                f"\n{kind}: master killed; failed over in {failover:.2f} s, "
                f"the proxy's store answering again {back:.2f} s after the kill"
            )

            # The newest plan is lost with the master: the session compacts again.
            assert h.version(key) == 1
            headers = fresh.say()  # to replica 1; asserts x-compaction-store: ok
            assert headers["x-compaction-action"] == "compacted"
            assert h.version(key) == 2
            again = summary_of(h, key)
            assert again != newest

            # The summary made before the failover arrives last: its write is rejected.
            wait_for(lambda: ready(h, 0), 10)
            gate.opened.set()
            stale_headers = in_flight.result(30)
        assert recovered < 10
        assert stale_headers["x-compaction-action"] == "compacted"
        assert h.version(key) == 2
        assert summary_of(h, key) == again
        sent = stale.messages[:-1]
        views = [v for v in h.forwarded() if v[-1] == sent[-1]]
        assert len(views) == 2  # the turn after the failover, then the stale one
        assert [view_problems(sent, view) for view in views] == [[], []]
        # The session goes on with the plan made after the failover, on either replica.
        fresh.client = stale.client
        assert fresh.say()["x-compaction-action"] == "replayed"
        assert again in header_text(h.forwarded()[-1])


# -- three replicas, 200 sessions, a master killed under load ---------------------------------

SESSIONS = 200
TAG = re.compile(r"\[S\d{3}\]")
# Short messages in a small window: every turn costs little, and the first one compacts.
WORDS, WINDOW, ROUNDS = 12, 1024, 12


async def tagged_summary(body: dict[str, Any]) -> str:
    """A summary naming every session whose text the summarizer was shown (one, always)."""
    tags = sorted(set(TAG.findall(orjson.dumps(body).decode())))
    return f"Summary of {' '.join(tags)}: goals and facts."


@dataclasses.dataclass
class Turn:
    started: float
    ended: float
    store: str
    action: str


@dataclasses.dataclass
class Session:
    """One client's conversation, every message marked with its tag."""

    tag: str
    client: openai.AsyncOpenAI
    messages: list[dict[str, Any]]
    turns: list[Turn] = dataclasses.field(default_factory=list)
    key: str = ""
    sent: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)

    async def say(self) -> Turn:
        number = len(self.messages) // 2
        self.messages.append({"role": "user", "content": f"{self.tag} {said(number, WORDS)}"})
        self.sent[self.messages[-1]["content"]] = list(self.messages)
        started = time.monotonic()
        raw = await self.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=self.messages, extra_headers={SESSION_HEADER: self.tag}
        )
        reply = raw.parse().choices[0].message.content
        self.messages.append({"role": "assistant", "content": reply})
        self.key = raw.headers["x-compaction-session"]
        turn = Turn(
            started,
            time.monotonic(),
            raw.headers["x-compaction-store"],
            raw.headers["x-compaction-action"],
        )
        self.turns.append(turn)
        return turn


def opening(tag: str, rounds: int) -> list[dict[str, Any]]:
    """A conversation just over the compaction level, every message tagged."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for number in range(rounds):
        messages.append({"role": "user", "content": f"{tag} {said(number, WORDS)}"})
        messages.append({"role": "assistant", "content": f"{tag} Noted."})
    return messages


@pytest.mark.cluster
async def test_three_replicas_serve_200_sessions_through_a_master_failover() -> None:
    # One process holds the three proxies, the fake upstream and the 200 clients: its event
    # loops lag, hence the harness's store timeout of seconds.
    sections: dict[str, Any] = {"models": [{"match": MODEL, "context_window": WINDOW}]}
    with (
        redis_cluster(node_timeout_ms=500) as cluster,
        harness(replicas=3, redis_url=cluster.url, **sections) as h,
    ):
        h.up.summarizer = tagged_summary
        # A connection per request: with servers and clients in one process, the loops lag by
        # seconds, and a kept-alive connection that uvicorn closed after 5 s idle by its own
        # clock may look fresh to the client and be picked for a request.
        limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=0)
        clients = [
            openai.AsyncOpenAI(
                base_url=s.url + "/v1",
                api_key="sk-test",
                max_retries=0,
                http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=60),
            )
            for s in h.servers
        ]
        sessions = [
            Session(f"[S{i:03d}]", clients[i % 3], opening(f"[S{i:03d}]", ROUNDS))
            for i in range(SESSIONS)
        ]
        # Every session compacts, and its plan is stored.
        assert {t.action for t in await asyncio.gather(*(s.say() for s in sessions))} == {
            "compacted"
        }
        killed = recovered = math.inf

        async def talk(session: Session) -> None:
            while not session.turns or session.turns[-1].started < recovered:
                await session.say()

        talking = asyncio.gather(*(talk(s) for s in sessions))
        await asyncio.sleep(0.1)
        primary, _ = cluster.shard(h.state_key(sessions[0].key))
        killed = time.monotonic()
        primary.kill()
        failover = await asyncio.to_thread(wait_for, cluster.healthy, 30)
        await asyncio.gather(
            *(asyncio.to_thread(wait_for, functools.partial(ready, h, s), 10) for s in range(3))
        )
        recovered = time.monotonic()
        await talking
        for client in clients:
            await client.close()

        turns = [t for s in sessions for t in s.turns[1:]]
        unavailable = [t for t in turns if t.store == "unavailable"]
        span = (
            f"from {min(t.started for t in unavailable) - killed:+.2f} s to "
            f"{max(t.ended for t in unavailable) - killed:+.2f} s after the kill"
            if unavailable
            else "none"
        )
        print(
            f"\n{len(turns)} turns of {SESSIONS} sessions on 3 replicas around the kill of a "
            f"master: the cluster failed over in {failover:.2f} s; {len(unavailable)} turns "
            f"served without the store (fail-open): {span}; every replica's store answering "
            f"again {recovered - killed:.2f} s after it"
        )
        # Served all along; without the store only while the master was gone. (Whether any
        # turn sees the store unavailable depends on timing: the cluster client's own retries
        # may outlast the failover on a loaded machine.)
        assert all(t.store == "ok" for s in sessions for t in s.turns if t.ended < killed)
        assert all(t.store == "ok" for t in turns if t.started > recovered)
        # Every view went upstream whole and of one session: its own messages, its own plan.
        by_tag = {s.tag: s for s in sessions}
        for view in h.forwarded():
            (tag,) = set(TAG.findall(orjson.dumps(view).decode()))
            sent = by_tag[tag].sent[view[-1]["content"]]
            assert view_problems(sent, view) == []
        for body in (r.json for r in h.up.requests if r.headers.get("x-compaction-summary")):
            assert len(set(TAG.findall(orjson.dumps(body).decode()))) == 1
        # What the store holds after the failover: each session's own plans only.
        for session in sessions:
            record = h.record(session.key)
            assert record is not None
            for branch in record[1].branches:
                summary = branch.plan.summary
                assert summary is None or set(TAG.findall(summary.text)) == {session.tag}


async def test_a_lock_the_store_did_not_release_is_released_once_it_answers() -> None:
    port = free_port()
    with redis_server(port) as server:
        store = RedisStore(
            f"redis://127.0.0.1:{port}/0", ttl_seconds=60, timeout_seconds=0.2, backoff_seconds=0.2
        )
        sessions = Sessions(store, Metrics())
        key = session_key("tenant", "session")
        try:
            token = (await sessions.lock(key, 60)).token
            assert token is not None
            server.send_signal(signal.SIGSTOP)  # hung: the release times out
            await sessions.unlock(key, token)
            server.send_signal(signal.SIGCONT)
            started = time.monotonic()
            while (other := (await sessions.lock(key, 60)).token) is None:
                assert time.monotonic() - started < 5, "the lock was left to its 60 s TTL"
                await asyncio.sleep(0.05)
            assert other > token
        finally:
            server.send_signal(signal.SIGCONT)
            await sessions.close()
            await store.close()
