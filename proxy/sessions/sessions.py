"""Sessions: which conversation a request belongs to, and its state in the store.

A session is one conversation of one tenant. Its id comes from the configured header, else
from where the client's own API names it (a body field or header: see each dialect), else it
is derived from the first user message. Its store key is a hash of tenant and id, so raw
client input never reaches the store and one tenant can never address another's state.

`Sessions` is the one place that reads and writes session state: reads that fail open,
compare-and-set updates (re-read on conflict) with fencing, and the single-flight lock. Every
write also carries the prompt-cache figures this process read since the session's last write
(`cache_usage.CacheLedger`). With the dashboard on, the figures of the turns it serves are
kept and written beside the state by `turn_log.TurnLog`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy.errors import StoreUnavailable
from proxy.observability.metrics import Metrics
from proxy.sessions.activity import ActivityLedger
from proxy.sessions.cache_usage import CacheLedger, CacheUsage
from proxy.sessions.state import ParsedStates, SessionState
from proxy.sessions.store import SessionStore
from proxy.sessions.turn_log import TurnLog

log = logging.getLogger("compaction_proxy")

CAS_ATTEMPTS = 3
LOCK_POLL_SECONDS = 0.05
# A release the store did not take is tried again this often, this many times: about the
# longest store outage (a failover) worth outliving.
RELEASE_RETRY_SECONDS = 1.0
RELEASE_RETRIES = 60


def session_id(header: str | None, hint: str | None, messages: Sequence[Any]) -> str:
    """The session id: the configured header, else the client's own name for it, else derived.

    Ids are used whole (hashed into the store key), never cut: two long ids that differ only
    at their end are two sessions.
    """
    return header or hint or derived_session_id(messages)


def derived_session_id(messages: Sequence[Any]) -> str:
    """A stable id from the first user message (system prompts change from day to day)."""
    first = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None)
    content = first.get("content") if first else None
    digest = hashlib.sha256(orjson.dumps(content)).hexdigest()
    return f"derived-{digest[:24]}"


def session_key(tenant: str, session: str) -> str:
    """The store key of one tenant's session: a hash, unambiguous (the tenant is
    length-prefixed), so one tenant can never address another's state."""
    tenant_bytes = tenant.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(len(tenant_bytes).to_bytes(8, "big") + tenant_bytes)
    digest.update(session.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:32]


@dataclasses.dataclass
class Loaded:
    """A session's state as read, its version, and whether the store answered."""

    state: SessionState
    version: int
    store: str  # "ok" | "unavailable"

    @property
    def available(self) -> bool:
        return self.store == "ok"


@dataclasses.dataclass(frozen=True)
class Lock:
    """A session's lock as asked for: its fencing token, or None when the store failed or
    when another held it (`busy`) for longer than the caller would wait."""

    token: int | None
    busy: bool = False


class Sessions:
    """Session state in a `SessionStore`, as the request path and the admin API use it."""

    def __init__(
        self,
        store: SessionStore,
        metrics: Metrics,
        *,
        fail_open: bool = True,
        cache: CacheLedger | None = None,
        turns: ActivityLedger | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.fail_open = fail_open
        self.cache = cache or CacheLedger()
        # None: the dashboard is off, no turn is kept.
        self.turns = None if turns is None else TurnLog(store, turns, self.cache, metrics)
        self._releasing: set[asyncio.Task[None]] = set()
        self.states = ParsedStates()

    def failing_closed(self) -> Sessions:
        """The same sessions, for the admin API: a store failure is an error, not a default."""
        sessions = Sessions(self.store, self.metrics, fail_open=False, cache=self.cache)
        sessions.turns = self.turns
        return sessions

    async def close(self) -> None:
        """Write the turns not written yet, and stop trying to release locks the store did not
        take (they expire by themselves)."""
        if self.turns is not None:
            await self.turns.close()
        for task in list(self._releasing):
            task.cancel()
        await asyncio.gather(*self._releasing, return_exceptions=True)

    async def load(self, key: str) -> Loaded:
        """The session's state; an empty one when there is none, or when the store failed
        and the proxy fails open (StoreUnavailable otherwise)."""
        try:
            record = await self.store.get(key)
        except StoreUnavailable:
            return self._failed("get")
        if record is None:
            return Loaded(SessionState(), 0, "ok")
        try:
            return Loaded(self.states.parse(key, record.data), record.version, "ok")
        except ValueError:
            log.warning("corrupt session state replaced", extra={"session": key[:12]})
            return Loaded(SessionState(), record.version, "ok")

    async def update(
        self,
        key: str,
        change: Callable[[SessionState], SessionState],
        *,
        fence: int | None = None,
        loaded: Loaded | None = None,
    ) -> bool:
        """Compare-and-set `change(state)`, re-reading on a conflict (a capped number of
        times): whether it was written. `loaded` is the state the caller already read; a
        change that returns the state itself writes nothing. The prompt-cache figures not
        written yet go along."""
        for _ in range(CAS_ATTEMPTS):
            if loaded is None:
                loaded = await self.load(key)
            if not loaded.available:
                return False
            changed = change(loaded.state)
            if changed is loaded.state:
                return False
            unwritten = self.cache.unwritten(key)
            state = _with_cache(changed, unwritten)
            try:
                written = await self.store.compare_and_set(
                    key, loaded.version, state.to_bytes(), fence=fence
                )
            except StoreUnavailable:
                self._failed("compare_and_set")
                return False
            if written is not None:
                if unwritten is not None:
                    self.cache.written(key, unwritten)
                if self.turns is not None:
                    self.turns.relist(key, written, state)
                return True
            loaded = None
        log.warning("session state not written: concurrent updates", extra={"session": key[:12]})
        return False

    def with_unwritten(self, key: str, state: SessionState) -> SessionState:
        """`state` with the prompt-cache figures this process has not written yet."""
        return _with_cache(state, self.cache.unwritten(key))

    async def lock(self, key: str, ttl: float, *, wait: float = 0.0) -> Lock:
        """The session's lock for `ttl` seconds, waiting up to `wait` seconds while another
        holds it (compacting, or preparing a summary)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                token = await self.store.acquire_lock(key, ttl)
            except StoreUnavailable:
                self._failed("lock")
                return Lock(None)
            if token is not None:
                return Lock(token)
            if time.monotonic() >= deadline:
                return Lock(None, busy=True)
            await asyncio.sleep(LOCK_POLL_SECONDS)

    async def unlock(self, key: str, token: int) -> None:
        """Release the lock. When the store does not take it, it is tried again in the
        background: a lock left behind would hold the session's next compaction for its whole
        TTL (the summarizer's time), long after the store is back."""
        try:
            await self.store.release_lock(key, token)
        except StoreUnavailable:
            task = asyncio.create_task(self._release_later(key, token))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)
            self._failed("unlock")

    async def _release_later(self, key: str, token: int) -> None:
        for _ in range(RELEASE_RETRIES):
            await asyncio.sleep(RELEASE_RETRY_SECONDS)
            with contextlib.suppress(StoreUnavailable):
                await self.store.release_lock(key, token)
                return

    async def delete(self, key: str) -> None:
        await self.store.delete(key)
        self.cache.forget(key)
        if self.turns is not None:
            self.turns.forget(key)

    def _failed(self, operation: str) -> Loaded:
        """Count the failure; serve without the session's state, or fail closed."""
        self.metrics.store_errors.labels(operation).inc()
        if not self.fail_open:
            raise StoreUnavailable("the session store is unavailable")
        log.warning("session store unavailable, serving fail-open", extra={"op": operation})
        return Loaded(SessionState(), 0, "unavailable")


def _with_cache(state: SessionState, unwritten: CacheUsage | None) -> SessionState:
    if unwritten is None:
        return state
    return dataclasses.replace(state, prompt_cache=unwritten.plus(state.prompt_cache))
