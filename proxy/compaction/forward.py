"""What goes upstream for a request, and what the proxy did to get it: the body, the action,
the tokens, and the `x-compaction-*` headers that say so."""

from __future__ import annotations

import dataclasses
import time

import policies
from proxy.compaction.turn import ClientRequest, Turn
from proxy.dialects import OutputLimits
from proxy.errors import ContextLengthExceeded
from proxy.sessions.activity import Who
from proxy.sessions.turns import TurnFigures


@dataclasses.dataclass(frozen=True)
class Forward:
    """What goes upstream, and what the proxy did to get it."""

    body: bytes
    session_hash: str
    action: str  # none | replayed | compacted | degraded | refused (shadow mode only)
    store: str  # ok | unavailable
    tokens_before: int
    tokens_after: int
    decisions: tuple[policies.Decision, ...] = ()
    can_retry: bool = True
    anchors_complete: bool = True
    reserved_output: int | None = None  # output tokens the budget kept free in the window
    window_source: str = "config"  # whence the model's window: config | model-map | default
    levels: tuple[int, int] = (0, 0)  # the budget's compact and target levels (tokens)
    # Shadow mode: the action and tokens are what the proxy would have done and sent; the
    # body is the client's own.
    shadow: bool = False
    # The tokens above are the counter's; the decision took the upstream's to be `ratio`
    # times them (calibration, or an exact count), and so do the headers.
    ratio: float = 1.0
    # The client's own compaction request (`Dialect.client_compaction`): forwarded with the
    # least loss, no summary prepared for it.
    client_compaction: bool = False
    retrieval: bool = False  # the body carries the retrieval tool, which the proxy answers
    # What became of an upstream overflow: compacted (harder), max_tokens (lowered to
    # `max_output`) or relayed (nothing the proxy may change could make it pass).
    overflow: str | None = None
    # The max_tokens the body carries in place of the client's (`with_max_output`): lowered
    # before the first try, or after the upstream's overflow.
    max_output: int | None = None
    # The view is at the compact level, where no compaction can bring it under (its last
    # one could not): replayed as it is while it fits, not compacted again every turn.
    unreachable: bool = False

    @property
    def applied(self) -> str:
        """What was done to the request that went upstream."""
        return "none" if self.shadow else self.action

    @property
    def tokens_sent(self) -> int:
        """Tokens of what went upstream (proxy count)."""
        return self.tokens_before if self.shadow else self.tokens_after

    def session_headers(self) -> tuple[tuple[str, str], ...]:
        """The headers that hold whatever became of the request: its session and the store."""
        return session_headers(self.session_hash, self.store)

    def headers(self) -> list[tuple[str, str]]:
        headers = [
            *self.session_headers(),
            ("x-compaction-action", shown_action(self.action, shadow=self.shadow)),
            ("x-compaction-tokens-before", str(round(self.tokens_before * self.ratio))),
            ("x-compaction-tokens-after", str(round(self.tokens_after * self.ratio))),
            ("x-compaction-window-source", self.window_source),
        ]
        ratio = f"{self.ratio:.3f}"
        if ratio != "1.000":  # as shown: a ratio that rounds to 1 says nothing
            headers.append(("x-compaction-count-ratio", ratio))
        if self.overflow is not None:
            headers.append(("x-compaction-overflow", self.overflow))
        if self.unreachable:
            headers.append(("x-compaction-target", "unreachable"))
        if self.max_output is not None:
            headers.append(("x-compaction-max-tokens", str(self.max_output)))
        if not self.anchors_complete:
            headers.append(("x-compaction-anchors", "truncated"))
        if self.client_compaction:
            headers.append(("x-compaction-client-compaction", "true"))
        if self.shadow:
            headers.append(SHADOW_HEADER)
        return headers


SHADOW_HEADER = ("x-compaction-shadow", "true")


def session_headers(session_hash: str, store: str) -> tuple[tuple[str, str], ...]:
    return (("x-compaction-session", session_hash), ("x-compaction-store", store))


def refusal(turn: Turn, result: policies.Compaction, tokens_before: int) -> ContextLengthExceeded:
    """The request refused, since even compacted it cannot fit: its answer says its session,
    the store, the action (`refused`) and the tokens received."""
    budget = turn.budget
    error = ContextLengthExceeded(
        f"This model's maximum context length is {turn.limits.window} tokens. Even after "
        f"compaction, the system prompt, tools and the current turn need {result.floor_tokens} "
        f"tokens, and {budget.reserved_output} are reserved for the output, which leaves "
        f"{budget.limit} tokens for the prompt. Please shorten the current message or the "
        "system prompt, or lower the maximum output tokens.",
        param=turn.request.dialect.conversation_param,
    )
    error.headers = (
        *session_headers(turn.request.key, turn.loaded.store),
        ("x-compaction-action", "refused"),
        ("x-compaction-tokens-before", str(round(tokens_before * turn.ratio))),
    )
    return error


def with_max_output(request: ClientRequest, forward: Forward, max_output: int) -> Forward | None:
    """`forward` with its body reserving `max_output` output tokens in place of the client's
    max_tokens, when the policy says so (`max_tokens_overflow: lower`) and the request may ask
    for so little (not under extended thinking's budget); None otherwise, and under shadow
    mode (the client's bytes go as they are)."""
    dialect = request.dialect
    if request.shadow or request.policy.max_tokens_overflow != "lower":
        return None
    if not isinstance(dialect, OutputLimits):
        return None
    body = dialect.with_max_output(forward.body, max_output)
    if body is None:
        return None
    return dataclasses.replace(forward, body=body, max_output=max_output)


def shown_action(action: str, *, shadow: bool) -> str:
    """The action as headers name it: under shadow mode a would-be action (`shadow-compacted`),
    which no client can take for one done."""
    return f"shadow-{action}" if shadow else action


MAX_MODEL_NAME = 128  # characters of a model's name the dashboard keeps (the client names it)


def dashboard_turn(request: ClientRequest, forward: Forward) -> tuple[Who, TurnFigures]:
    """What the dashboard keeps of a turn (`Sessions.observe_turn`)."""
    model = request.parsed.model[:MAX_MODEL_NAME]
    who = Who(request.tenant, request.dialect.name, model, request.policy.name, forward.store)
    action = shown_action(forward.action, shadow=forward.shadow)
    layers = tuple([decision.layer for decision in forward.decisions]) if forward.decisions else ()
    # In the upstream's tokens, as the headers say them (the counter's times the ratio).
    sent, forwarded, compact, target = (
        round(tokens * forward.ratio)
        for tokens in (forward.tokens_before, forward.tokens_after, *forward.levels)
    )
    return who, TurnFigures(time.time(), sent, forwarded, compact, target, action, layers)
