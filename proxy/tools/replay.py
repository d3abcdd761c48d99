"""An offline replay: recorded requests through the proxy's own compactor, turn by turn.

Each recorded request goes through `Compactor.prepare` as the request path runs it (memory
store, sessions, plans, prepared summaries), with nothing sent upstream. The mechanical digest
stands in for the summarizer unless the replay is live: then summaries are asked of the
configured summarizer, through the configured upstream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import orjson
from tqdm import tqdm

import policies
from proxy.compaction.compactor import Compactor
from proxy.compaction.prepared import PreparedSummaries
from proxy.compaction.summarizer import Summarizers
from proxy.compaction.turn import ClientRequest
from proxy.config import Config, ModelOverride, NoRoute, Policy, Upstream
from proxy.dialects.openai.chat import Chat
from proxy.errors import ContextLengthExceeded, InvalidRequest
from proxy.models.calibration import Calibration
from proxy.models.limits import ModelLimits
from proxy.observability.metrics import Metrics
from proxy.sessions.sessions import Sessions, session_id
from proxy.sessions.store import MemoryStore
from proxy.tools.recordings import Recorded, RecordingError
from proxy.upstream import litellm_transport
from proxy.upstream.client import UpstreamClient

TENANT = "replay"
COMPACTIONS = frozenset({"compacted", "degraded"})


@dataclasses.dataclass(frozen=True)
class TurnResult:
    """What the proxy did with one recorded request."""

    session: str
    turn: int  # 1-based, within its session
    sent: int  # prompt tokens of the request, by the proxy's count
    forwarded: int  # prompt tokens forwarded (0 when refused)
    action: str  # none | replayed | compacted | degraded | refused
    layers: tuple[str, ...]  # the layers that changed something, when it compacted
    stable: bool | None  # the forwarded prefix is the session's previous view; None: first
    budget: policies.Budget

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        budget = data.pop("budget")
        data["window"] = budget["window"]
        data["levels"] = {
            level: budget[f"{level}_tokens"] for level in ("prepare", "compact", "target")
        }
        return data


@dataclasses.dataclass(frozen=True)
class Totals:
    sessions: int
    turns: int
    compactions: int
    refused: int
    sent: int
    forwarded: int
    stable: int  # turns whose forwarded prefix was the session's previous view
    followers: int  # turns with a previous view in their session

    @classmethod
    def of(cls, turns: Sequence[TurnResult]) -> Totals:
        return cls(
            sessions=len({t.session for t in turns}),
            turns=len(turns),
            compactions=sum(t.action in COMPACTIONS for t in turns),
            refused=sum(t.action == "refused" for t in turns),
            sent=sum(t.sent for t in turns),
            forwarded=sum(t.forwarded for t in turns),
            stable=sum(t.stable is True for t in turns),
            followers=sum(t.stable is not None for t in turns),
        )

    @property
    def stable_share(self) -> float:
        return self.stable / self.followers if self.followers else 1.0


class ReplayError(RecordingError):
    """A recorded request the proxy cannot replay (not a valid request, no route)."""


def with_window(config: Config, window: int) -> Config:
    """The config with every model's context window set to `window`."""
    models = tuple(dataclasses.replace(m, context_window=window) for m in config.models)
    catch_all = ModelOverride(match="*", context_window=window)
    return dataclasses.replace(config, models=(*models, catch_all))


def stable(earlier: Sequence[Any], later: Sequence[Any]) -> bool:
    """Whether `later` starts with `earlier`: a provider's prompt cache still hits."""
    return len(later) >= len(earlier) and later[: len(earlier)] == earlier


class _DigestOnly:
    """No summarizer: the mechanical digest stands in for every summary."""

    def for_request(self, request: ClientRequest) -> None:
        return None


class Replay:
    """The proxy's compactor over a memory store; `live` asks the configured summarizer."""

    def __init__(self, config: Config, *, policy: str | None = None, live: bool = False):
        if policy is not None and policy not in config.policies:
            known = ", ".join(config.policies)
            raise ReplayError(f"no policy {policy!r} in the config (its policies: {known})")
        self.config = config
        self.policy = policy
        self.dialect = Chat()
        self.limits = ModelLimits(config)
        store = MemoryStore(ttl_seconds=config.store.ttl_seconds)
        metrics = Metrics()
        self.sessions = Sessions(store, metrics)
        self.client = UpstreamClient(metrics) if live else None
        if self.client is not None:
            litellm_transport.register(self.client, config, policies.HEADINGS)
        summarizers = (
            Summarizers(config, self.client, self.limits, metrics) if self.client else _DigestOnly()
        )
        self.prepared = PreparedSummaries(self.sessions, summarizers, metrics)
        self.compactor = Compactor(
            self.sessions,
            self.limits,
            self.prepared,
            Calibration(),
            max_branches=config.store.max_branches,
        )
        self._views: dict[str, list[policies.Message] | None] = {}
        self._turns: dict[str, int] = {}

    async def close(self) -> None:
        await self.prepared.close()
        if self.client is not None:
            await self.client.close()

    async def turn(self, recorded: Recorded, where: str) -> TurnResult:
        """One request through the compactor, as the request path sends it."""
        try:
            parsed = self.dialect.parse(orjson.dumps(recorded.body))
        except InvalidRequest as exc:
            raise ReplayError(f"{where}: not a valid chat request: {exc.message}") from None
        session = session_id(
            recorded.session, self.dialect.session_hint({}, parsed), parsed.messages
        )
        request = ClientRequest(
            self.dialect, parsed, TENANT, session, *self._route(parsed.model, where), ()
        )
        limits = self.limits.limits(parsed.model, request.upstream)
        budget = request.policy.compaction.budget(
            limits.window, limits.max_output, parsed.max_output
        )
        self._turns[session] = number = self._turns.get(session, 0) + 1
        previous = self._views.get(session)
        try:
            forward = await self.compactor.prepare(request)
        except ContextLengthExceeded:
            self._views[session] = None
            fixed = self.dialect.fixed_tokens(parsed, limits.counter)
            sent = limits.counter.count(parsed.messages, fixed=fixed)
            return TurnResult(session, number, sent, 0, "refused", (), None, budget)
        await self.prepared.wait()
        same = forward.body is parsed.raw
        view = parsed.messages if same else self.dialect.parse(forward.body).messages
        self._views[session] = view
        return TurnResult(
            session,
            number,
            forward.tokens_before,
            forward.tokens_after,
            forward.action,
            tuple(d.layer for d in forward.decisions),
            None if previous is None else stable(previous, view),
            budget,
        )

    def _route(self, model: str, where: str) -> tuple[Policy, Upstream]:
        try:
            policy, upstream = self.config.route(self.dialect.name, model, None)
        except NoRoute as exc:
            raise ReplayError(f"{where}: {exc}") from None
        if self.policy is not None:
            policy = self.config.policies[self.policy]
        return policy, upstream


async def replay(
    recorded: Sequence[Recorded],
    config: Config,
    *,
    policy: str | None = None,
    live: bool = False,
) -> list[TurnResult]:
    """Every recorded request through the proxy's compactor, in order; a progress bar on
    standard error (a terminal) when it takes more than a moment."""
    bar = tqdm(
        total=len(recorded),
        unit="turn",
        file=sys.stderr,
        delay=0.5,
        leave=False,
        disable=None,  # shown on a terminal only
    )
    runner = Replay(config, policy=policy, live=live)
    results = []
    try:
        for index, request in enumerate(recorded, 1):
            results.append(await runner.turn(request, f"request {index}"))
            bar.update()
    finally:
        bar.close()
        await runner.close()
    return results


def run(
    recorded: Sequence[Recorded],
    config: Config,
    *,
    policy: str | None = None,
    live: bool = False,
) -> list[TurnResult]:
    return asyncio.run(replay(recorded, config, policy=policy, live=live))


# -- what is printed ----------------------------------------------------------------------------

COLUMNS = ("session", "turn", "sent", "forwarded", "action", "layers", "stable")


def table(turns: Sequence[TurnResult]) -> str:
    """One row a turn, aligned, then the totals."""
    rows = [COLUMNS] + [
        (
            t.session,
            str(t.turn),
            str(t.sent),
            str(t.forwarded),
            t.action,
            ",".join(t.layers) or "-",
            {None: "-", True: "yes", False: "no"}[t.stable],
        )
        for t in turns
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    numeric = {1, 2, 3}
    lines = [
        "  ".join(
            cell.rjust(width) if i in numeric else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    return "\n".join([*lines, "", *summary(Totals.of(turns))])


def summary(totals: Totals) -> list[str]:
    share = totals.forwarded / totals.sent if totals.sent else 1.0
    return [
        f"sessions {totals.sessions}, turns {totals.turns}, compactions {totals.compactions}, "
        f"refused {totals.refused}",
        f"tokens sent {totals.sent}, forwarded {totals.forwarded} ({share:.1%})",
        f"stable prefix {totals.stable} of {totals.followers} turns ({totals.stable_share:.1%})",
    ]


def as_json(turns: Sequence[TurnResult]) -> bytes:
    totals = dataclasses.asdict(Totals.of(turns))
    body = {"turns": [t.to_dict() for t in turns], "totals": totals}
    return orjson.dumps(body, option=orjson.OPT_INDENT_2)
