"""The upstream's exact count of what is sent, asked for only where it changes a decision.

Some tokenizers are not public (Claude's): the proxy estimates, calibrated by each answer's
usage, and the first request near the window of a session is judged by a guess. With the
policy's `exact_count: {via: count_tokens}`, a request whose estimate is within `margin` of
the compaction level (on either side) is counted by its API's count endpoint (Anthropic's
`count_tokens`) before the decision: the request as it would go, with the request's own
credential and headers, within `timeout_seconds`. The count decides (the request's budget is
scaled by its ratio to the estimate) and calibrates the session's counter.

A count is kept per session with the prefix it covered (the chain hash of its messages and
the plan they were rendered with): a later turn that extends that prefix adds the estimate
of what it added, in the session's calibrated tokens, and asks nothing. Far from the level
nothing is asked. A count that fails or is late leaves the decision to the estimate (fail
open: a metric and a debug log line), and, unless the upstream blamed the body itself (400,
413, 422), trips a breaker: for `cooldown_seconds` the estimate decides at once for that
upstream (or that credential, when the upstream refused it or rate-limited it) and nothing
is asked, so an outage of the count endpoint slows no request by more than one timeout per
cooldown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging

import orjson

import policies
from proxy.compaction.cooldowns import Cooldowns, blamed_scope
from proxy.compaction.turn import Turn
from proxy.dialects import TokenCounting
from proxy.errors import ProxyError
from proxy.memo import DEFAULT_MAX_SESSIONS, make_room
from proxy.models.calibration import Calibration, bounded
from proxy.observability.metrics import Metrics
from proxy.upstream.answer import read_whole
from proxy.upstream.client import UpstreamClient

log = logging.getLogger("compaction_proxy")

# Statuses that blame the request's own body, not the upstream nor the credential: nothing
# cools down for them.
BODY_STATUSES = frozenset({400, 413, 422})


@dataclasses.dataclass(frozen=True, slots=True)
class Counted:
    """What the upstream counted for a session's request: its model, the plan it was
    rendered with, how many chain messages it had and their hash, the proxy's count of it
    and the upstream's."""

    model: str
    plan: str
    length: int
    chain: str
    tokens: int
    exact: int

    def extended_by(self, turn: Turn, plan: str) -> bool:
        """Whether `turn` is this request with (perhaps) more messages at its end."""
        return (
            self.model == turn.request.parsed.model
            and self.plan == plan
            and turn.chain.prefix(self.length) == self.chain
        )


class ExactCounts:
    """Counts asked of upstreams, the last one of each session (at most `max_sessions`:
    oldest out)."""

    def __init__(
        self,
        client: UpstreamClient,
        calibration: Calibration,
        metrics: Metrics,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        self.client = client
        self.max_sessions = max_sessions
        self.calibration = calibration
        self.metrics = metrics
        self._counted: dict[str, Counted] = {}
        self.cooldowns = Cooldowns()

    @staticmethod
    def wanted(turn: Turn, tokens: int) -> TokenCounting | None:
        """The request's API, to ask for a count, when the policy asks for exact counts, the
        API has a count endpoint and the estimate `tokens` is near the compaction level."""
        request = turn.request
        settings = request.policy.exact_count
        dialect = request.dialect
        if settings.via == "none" or not isinstance(dialect, TokenCounting) or tokens <= 0:
            return None
        level = turn.budget.compact_tokens
        return dialect if abs(tokens - level) <= settings.margin * level else None

    async def ratio(self, turn: Turn, api: TokenCounting, body: bytes, tokens: int) -> float | None:
        """The upstream's count of `body` (the request as it would go, `tokens` by the
        proxy's count) over `tokens`, asked of `api` (`wanted`); None when the upstream did
        not count it in time."""
        request = turn.request
        key = request.key
        counting = turn.limits.counting
        plan = _fingerprint(turn.plan)
        found = self._counted.get(key)
        if found is not None and found.extended_by(turn, plan):
            stored = turn.loaded.state.ratio_for(counting)
            calibrated = self.calibration.effective(key, counting, stored)
            extended = max(1, found.exact + round((tokens - found.tokens) * calibrated))
            self._note("cached", key, tokens, extended)
            return bounded(extended / tokens, exact=counting.exact)
        upstream = await self._ask(turn, api, body)
        if upstream is None:
            return None
        self._note("counted", key, tokens, upstream)
        make_room(self._counted, key, self.max_sessions)
        chain = turn.chain
        self._counted[key] = Counted(
            request.parsed.model, plan, len(chain), chain.prefix(len(chain)), tokens, upstream
        )
        # An exact count of exactly what is sent: the best calibration there is.
        self.calibration.observe(key, counting, upstream, tokens)
        return bounded(upstream / tokens, exact=counting.exact)

    async def _ask(self, turn: Turn, api: TokenCounting, body: bytes) -> int | None:
        request = turn.request
        # By model, as the summarizer's: one caller's model the upstream lacks or chokes on
        # must not leave every other caller on the estimate.
        what = f"count/{request.parsed.model}"
        breakers = self.cooldowns.breakers(request.upstream, request.credentials, what)
        if self.cooldowns.cooling(*breakers.values()):
            self.metrics.exact_counts.labels("cooling").inc()
            return None
        timeout = request.policy.exact_count.timeout_seconds
        path = api.count_upstream_path
        headers = [*request.headers, ("Accept-Encoding", "identity")]
        status = 0
        try:
            async with asyncio.timeout(timeout):
                response = await self.client.open(
                    request.upstream, "POST", path, "", headers, api.count_body(body), retries=0
                )
                try:
                    payload = await read_whole(response, timeout, request.upstream.max_answer_bytes)
                finally:
                    response.release()
            status = response.status
        except TimeoutError:
            outcome = "timeout"
        except ProxyError:  # unreachable, timed out in a phase of its own, broken off
            outcome = "error"
        else:
            counted = api.counted(payload) if status == 200 else None
            if counted is not None:
                return counted
            outcome = "error"
        scope = blamed_scope(status)
        if status not in BODY_STATUSES:
            self.cooldowns.trip(breakers[scope], request.policy.exact_count.cooldown_seconds)
        self.metrics.exact_counts.labels(outcome).inc()
        log.debug(
            "exact count failed: the estimate decides",
            extra={
                "session": request.key[:16],
                "reason": outcome,
                "status": status,
                "cooling": scope,
            },
        )
        return None

    def _note(self, outcome: str, key: str, tokens: int, upstream: int) -> None:
        self.metrics.exact_counts.labels(outcome).inc()
        log.debug(
            "exact count",
            extra={"session": key[:16], "how": outcome, "estimate": tokens, "exact": upstream},
        )


def _fingerprint(plan: policies.Plan) -> str:
    data = orjson.dumps(plan.to_dict(), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(data, digest_size=16).hexdigest()
