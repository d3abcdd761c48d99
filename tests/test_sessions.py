"""`Sessions`: the one place that reads and writes session state, over the memory store."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import pytest

from proxy.errors import StoreUnavailable
from proxy.observability.metrics import Metrics
from proxy.sessions.sessions import Lock, Sessions, derived_session_id, session_id, session_key
from proxy.sessions.state import SessionState
from proxy.sessions.store import MemoryStore
from tests.doubles import FailingStore

KEY = session_key("tenant", "session")


def sessions(store: MemoryStore | None = None, *, fail_open: bool = True) -> Sessions:
    return Sessions(store or MemoryStore(ttl_seconds=60), Metrics(), fail_open=fail_open)


def pending(text: str) -> Callable[[SessionState], SessionState]:
    return lambda state: dataclasses.replace(state, pending=text)


async def test_a_new_session_is_empty_at_version_0() -> None:
    loaded = await sessions().load(KEY)
    assert (loaded.state, loaded.version, loaded.available) == (SessionState(), 0, True)


async def test_updates_are_read_back_and_versioned() -> None:
    s = sessions()
    assert await s.update(KEY, pending("first"))
    assert await s.update(KEY, pending("second"))
    loaded = await s.load(KEY)
    assert (loaded.state.pending, loaded.version) == ("second", 2)


async def test_a_conflicting_update_is_applied_to_the_newer_state() -> None:
    s = sessions()
    stale = await s.load(KEY)
    await s.update(KEY, pending("meanwhile"))
    seen: list[str | None] = []

    def change(state: SessionState) -> SessionState:
        seen.append(state.pending)
        return dataclasses.replace(state, calibration=1.5)

    assert await s.update(KEY, change, loaded=stale)
    assert seen == [None, "meanwhile"]  # retried on the state that won
    loaded = await s.load(KEY)
    assert (loaded.state.pending, loaded.state.calibration) == ("meanwhile", 1.5)


async def test_a_writer_that_lost_its_lock_cannot_write() -> None:
    s = sessions()
    old = (await s.lock(KEY, 60)).token
    assert old is not None
    assert await s.lock(KEY, 60, wait=0.1) == Lock(None, busy=True)  # held
    await s.unlock(KEY, old)
    newer = (await s.lock(KEY, 60)).token
    assert newer is not None and newer > old
    assert not await s.update(KEY, pending("stale writer"), fence=old)
    assert await s.update(KEY, pending("holder"), fence=newer)


async def test_a_failing_store_serves_empty_state_and_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = sessions(FailingStore(ttl_seconds=60))
    with caplog.at_level(logging.WARNING, logger="compaction_proxy"):
        loaded = await s.load(KEY)
    assert (loaded.state, loaded.available) == (SessionState(), False)
    assert not await s.update(KEY, pending("x"))
    assert await s.lock(KEY, 1, wait=1) == Lock(None)  # the store failed: not busy
    assert s.metrics.store_errors.labels("get").value == 2
    assert s.metrics.store_errors.labels("lock").value == 1
    assert "serving fail-open" in caplog.text


async def test_a_failing_store_fails_closed_when_configured() -> None:
    s = sessions(FailingStore(ttl_seconds=60), fail_open=False)
    with pytest.raises(StoreUnavailable):
        await s.load(KEY)


async def test_a_corrupt_record_reads_as_empty_and_is_replaced() -> None:
    store = MemoryStore(ttl_seconds=60)
    await store.compare_and_set(KEY, 0, b"not a state")
    s = sessions(store)
    loaded = await s.load(KEY)
    assert (loaded.state, loaded.version) == (SessionState(), 1)
    assert await s.update(KEY, pending("fresh"))
    assert (await s.load(KEY)).state.pending == "fresh"


def test_the_session_id_comes_from_the_header_then_the_client_then_the_history() -> None:
    messages = [{"role": "system", "content": "today"}, {"role": "user", "content": "hi"}]
    assert session_id("header", "hint", messages) == "header"
    assert session_id(None, "hint", messages) == "hint"
    assert session_id(None, None, messages) == derived_session_id(messages)
    other_day = [{"role": "system", "content": "tomorrow"}, messages[1]]
    assert derived_session_id(other_day) == derived_session_id(messages)


def test_session_keys_separate_tenants_unambiguously() -> None:
    assert session_key("ab", "c") != session_key("a", "bc")
    assert session_key("t", "s" * 10_000 + "1") != session_key("t", "s" * 10_000 + "2")
