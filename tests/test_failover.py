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
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conversations import view_problems
from tests.harness import MODEL, SESSION_HEADER, Conversation, Harness, harness, header_text
from tests.redis_servers import (
    Cluster,
    Sentinels,
    cut_replication,
    redis_cluster,
    redis_sentinels,
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
    with redis_cluster() if kind == "cluster" else redis_sentinels() as servers:
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


@pytest.mark.parametrize("kind", ["cluster", "sentinel"])
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
            print(
                f"\n{kind}: master killed; failed over in {failover:.2f} s, "
                f"the proxy's store answering again {time.monotonic() - killed:.2f} s after the kill"
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
