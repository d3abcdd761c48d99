"""One request as compaction sees it: who asked, in which session, and the facts every
compaction decision of that request is made from."""

from __future__ import annotations

import dataclasses
import functools
import math

import policies
from proxy.compaction.histories import Counts
from proxy.config import Policy, Upstream
from proxy.dialects import CacheBreakpoints, Dialect, Entries, Parsed
from proxy.models.limits import Limits
from proxy.sessions.originals import OriginalsIndex, ViewOriginals
from proxy.sessions.sessions import Loaded, session_key
from proxy.sessions.state import Branch

# How far an estimated count (chars/4), though calibrated, may fall short of the upstream's:
# the ratio is learnt from the turns before, and a new tool output is often denser.
ESTIMATE_ERROR = 0.05


@dataclasses.dataclass(frozen=True, eq=False)
class ClientRequest:
    """A client's request, read by its dialect and routed."""

    dialect: Dialect
    parsed: Parsed
    tenant: str
    session: str
    policy: Policy
    upstream: Upstream
    # The client's credential headers (and those its API's calls need, such as
    # anthropic-version), for this request's own summary only; never stored.
    credentials: tuple[tuple[str, str], ...]
    window: int | None = None  # the context window the request's own headers open
    # The request's headers as they go upstream (the proxy's own dropped), for its exact
    # count call (the credential, anthropic-version and -beta); never stored.
    headers: tuple[tuple[str, str], ...] = ()
    # Compaction is computed, stored and reported, but the client's bytes go upstream.
    shadow: bool = False
    # The session's kept originals as read before compaction (None: not read yet).
    originals: OriginalsIndex | None = None

    # The session's store key (`session_key`), made once: every step of the request uses it.
    key: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", session_key(self.tenant, self.session))

    @property
    def messages(self) -> list[policies.Message]:
        return self.parsed.messages

    @functools.cached_property
    def client_compaction(self) -> bool:
        """Whether this is the client's own compaction request (`Dialect.client_compaction`)."""
        return self.dialect.client_compaction(self.parsed)

    def budget(self, limits: Limits, ratio: float) -> policies.Budget:
        """The request's budget in the counter's tokens, the upstream's being `ratio` times.

        A max_tokens that leaves less than half the window for the prompt (Claude Code asks
        for 128k at any window) is reserved only as far as the policy's output reservation
        under `max_tokens_overflow: lower`: the forwarded body then asks for what the window
        leaves (`Turn.lowered_output`)."""
        policy = self.policy.compaction
        asked = self.parsed.max_output
        lower = self.policy.max_tokens_overflow == "lower"
        if lower and asked is not None and asked > limits.window // 2:
            usual = policy.budget(limits.window, limits.max_output, None).reserved_output
            asked = min(asked, usual)
        return policy.budget(limits.window, limits.max_output, asked).scaled(ratio)

    def body(self, entries: Entries | None) -> bytes:
        """What goes upstream for the view `entries` (None: the request as it is): the
        client's own bytes under shadow mode; else the view, with the proxy's prompt-cache
        breakpoints when the policy asks for them and the API takes them."""
        if self.shadow:
            return self.parsed.raw
        dialect = self.dialect
        if self.policy.cache_breakpoints and isinstance(dialect, CacheBreakpoints):
            shown = list(enumerate(self.messages)) if entries is None else entries
            return dialect.render(self.parsed, shown, breakpoints=True)
        return self.parsed.raw if entries is None else dialect.render(self.parsed, entries)


@dataclasses.dataclass
class Turn:
    """Everything one request's compaction decisions are made from."""

    request: ClientRequest
    limits: Limits
    budget: policies.Budget
    fixed: int  # tokens outside the conversation (tools, instructions)
    counts: Counts  # tokens of each message of the request
    chain: policies.Chain
    loaded: Loaded
    branch: Branch | None
    # The upstream's count of a prompt over the counter's: the budget is scaled by it.
    ratio: float = 1.0
    # The session's kept originals (None: its policy keeps none, or the store failed).
    originals: ViewOriginals | None = None

    @property
    def plan(self) -> policies.Plan:
        return self.branch.plan if self.branch else policies.Plan()

    @property
    def tokens_before(self) -> int:
        return self.fixed + self.counts.before[-1]

    def tokens(self, entries: Entries) -> int:
        """Tokens of the view `entries` (`policies.render_entries`); a message it shows as the
        request has it is not counted again (a `View`'s runs of them: by `Counts.before`)."""
        messages, counts, before = self.request.messages, self.counts, self.counts.before
        message_tokens = self.limits.counter.message
        total = self.fixed
        for entry in entries.runs if isinstance(entries, policies.View) else entries:
            if isinstance(entry, range):
                total += before[entry.stop] - before[entry.start]
                continue
            index, message = entry
            if index is not None and message is messages[index]:
                total += counts[index]
            else:
                total += message_tokens(message)
        return total

    async def compact(
        self,
        summarizer: policies.Summarizer | None,
        *,
        target_tokens: int | None = None,
        ahead_tokens: int = 0,
        instructions: str | None = None,
    ) -> policies.Compaction:
        """The policy's layers over this request, from the branch's plan."""
        return await policies.compact(
            self.request.messages,
            self.plan,
            budget=self.budget,
            policy=self.request.policy.compaction,
            counter=self.limits.counter,
            fixed_tokens=self.fixed,
            message_tokens=self.counts,
            summarizer=summarizer,
            instructions=instructions,
            target_tokens=target_tokens,
            ahead_tokens=ahead_tokens,
        )

    def lowered_output(self, tokens: int) -> int | None:
        """The max_tokens to send in place of the request's, when a prompt of `tokens` (the
        counter's) and the request's cannot fit the window: what the window leaves the prompt
        as the upstream will count it (`ratio`) and the safety margin, never under the output
        the budget reserved (a prompt over its limit is the upstream's to judge: its overflow
        says by how much). None when the request's own fits, or it sets none."""
        asked = self.request.parsed.max_output
        if asked is None:
            return None
        budget = self.budget
        prompt = tokens * self.ratio
        if self.limits.counter.mode != "exact":
            prompt *= 1 + ESTIMATE_ERROR
        room = budget.window - math.ceil(prompt) - budget.safety_margin
        room = max(room, budget.reserved_output)
        return room if room < asked else None

    def held(self, entries: Entries | None, tokens: int) -> bool:
        """Whether the view stays as the branch's plan makes it, though at the compact level:
        that plan's compaction could not leave room under it for the turns the policy wants
        (`Policy.short`: its fixed part and current turn were too large), so another would
        only change the prefix again; it is redone once the view no longer fits."""
        branch = self.branch
        return (
            branch is not None
            and branch.short > 0
            and entries is not None
            and tokens <= self.budget.limit
        )

    def reload(self, loaded: Loaded) -> None:
        """The session as read again (another request changed it meanwhile)."""
        self.loaded = loaded
        self.branch = loaded.state.branch(self.chain)
