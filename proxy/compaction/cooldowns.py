"""Circuit breakers: after repeated failure, no new attempt for a while, each keyed by what
failed (one credential, or one upstream). The summarizer and exact counts have their own."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Literal

from proxy.config import Upstream

Scope = Literal["credential", "upstream"]
# What says that the credential, not the upstream, failed: it is refused or over its limits.
CREDENTIAL_STATUSES = frozenset({401, 403, 429})


def blamed_scope(status: int) -> Scope:
    """What an upstream's failing status blames: the credential it refused or rate-limited,
    else the upstream."""
    return "credential" if status in CREDENTIAL_STATUSES else "upstream"


class Cooldowns:
    """Breakers by key, each open until its cooldown ends."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        # Credentials are keyed by a keyed hash, so the breakers never hold one.
        self._salt = os.urandom(16)

    def cooling(self, *keys: str) -> bool:
        """Whether any of these breakers is open."""
        now = time.monotonic()
        return any(now < self._until.get(key, 0.0) for key in keys)

    def trip(self, key: str, seconds: float) -> None:
        now = time.monotonic()
        # Breakers that have cooled down go: keys come from clients (models, credentials).
        self._until = {k: until for k, until in self._until.items() if until > now}
        self._until[key] = now + seconds

    def breakers(
        self, upstream: Upstream, credentials: Sequence[tuple[str, str]], what: str
    ) -> dict[Scope, str]:
        """The breaker of each thing a failure can be blamed on: the credential the calls
        carry (the upstream's own key, else the caller's `credentials` headers), and `what`
        of the upstream (e.g. one model of it)."""
        credential = upstream.api_key or "\n".join(v for _, v in sorted(credentials))
        digest = hashlib.blake2b(credential.encode(), key=self._salt, digest_size=12)
        return {
            "credential": f"credential:{upstream.name}:{digest.hexdigest()}",
            "upstream": f"upstream:{upstream.name}/{what}",
        }
