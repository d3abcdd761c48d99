"""Test doubles for the parts of the proxy that talk to the outside: a summarizer that
answers without an LLM, a store that is down."""

from __future__ import annotations

from typing import Any

import policies
from proxy.compaction.turn import ClientRequest
from proxy.errors import StoreUnavailable
from proxy.sessions.store import MemoryStore


class FakeSummarizer:
    """Answers every summary request with a short fixed text, and records the requests."""

    def __init__(self, answer: str | Exception = "The user asked about many things.") -> None:
        self.answer = answer
        self.requests: list[policies.SummaryRequest] = []

    cooling = False  # no circuit breaker

    def for_request(self, request: ClientRequest) -> FakeSummarizer:
        return self

    async def __call__(self, summary_request: policies.SummaryRequest) -> str:
        self.requests.append(summary_request)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class FailingStore(MemoryStore):
    """A memory store whose every operation fails, as a Redis that is down."""

    async def get(self, key: str) -> Any:
        raise StoreUnavailable("down")

    async def acquire_lock(self, key: str, ttl_seconds: float) -> int | None:
        raise StoreUnavailable("down")
