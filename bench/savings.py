"""Token savings at a small window: the proxy's compaction beside LangChain's and LiteLLM's
`trim_messages`, on the recorded traces replayed turn by turn, in one run.

    .venv/bin/python bench/savings.py [--window 8192] [--join 2]

Each session is replayed as a client does it: one request per assistant message, holding the
history up to it, with max_tokens = a quarter of the window. Every method gets the same prompt
budget (window - max_tokens - the proxy's safety margin); every result is checked as the
strict fake upstream checks it (tests/fakes/openai: tool pairing and the window). Sessions
are the conversations alone, then `--join` of them joined into one long session.

- proxy: `policies.compact` with the default policy of config.yaml and the mechanical digest
  (no LLM), applied statefully as the proxy does: the session's plan is replayed on every
  request and a new compaction happens only at the compact level (proxy/compaction/compactor.py).
  "proxy+anchors" adds the identifier patterns below as the policy's anchors; "proxy 85/45"
  is the default policy with the levels first proposed, compact_at 0.85 and target
  0.45 (fewer, larger compactions: more stable prefixes, less content kept).
- langchain: `langchain_core.messages.trim_messages(strategy="last", start_on="human",
  include_system=True)`, counting with the proxy's tiktoken counter.
- litellm: `litellm.utils.trim_messages(max_tokens=budget)`, counting with its own counter.

Content kept is measured on the turns whose history is over the budget: the share of the
user/assistant text (by sentence, in characters) that the view shows verbatim or in a
summary/digest, and of the identifiers (reservation and flight codes, user and payment ids,
file paths) of user/assistant text and tool-call arguments that the view still shows.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from langchain_core.messages import (
    BaseMessage,
    convert_to_messages,
    convert_to_openai_messages,
    trim_messages,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_traces
from compaction import MODEL, budget_for, conditions, default_policy

import policies
from policies.message import Message, call_arguments, call_function, tool_calls, visible_text
from proxy.config import Policy
from proxy.models.tokens import REPLY_PRIMING, TokenCounter, counter_for
from proxy.tools.recordings import joined
from tests.fakes.openai import (
    ApiError,
    check_window,
    count_prompt_tokens,
    validate_chat,
)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: its shipped map

IDENTIFIERS = (
    r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6}\b",  # reservation ids, flight numbers
    r"\b[a-z]+(?:_[a-z]+)+_\d+\b",  # user and payment ids: mia_li_3668, credit_card_4421
    r"(?<![\w/])(?:\.{1,2}/|/)?(?:[\w.-]+/)+[\w-]+\.\w+\b",  # file paths
)
_IDENTIFIERS = tuple(re.compile(pattern) for pattern in IDENTIFIERS)
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")


class Method(Protocol):
    """A way to fit a request into the budget; `start` begins a new session."""

    name: str

    def start(self) -> None: ...

    async def view(self, messages: list[Message]) -> list[Message] | None:
        """The messages to forward, or None when the request is refused (the proxy's 400)."""
        ...


# -- the methods --------------------------------------------------------------------------------


class Proxy:
    """The proxy's request path (proxy/compaction/compactor.py) without the store and the
    network: replay the session's plan while its prefix matches, compact at the compact level
    (at the limit after a compaction that left too little room, `Compaction.short`), to the
    target."""

    def __init__(
        self,
        name: str,
        policy: Policy,
        budget: policies.Budget,
        counter: TokenCounter,
        summarizer: policies.Summarizer | None = None,
    ):
        self.name = name
        self.policy = policy
        self.budget = budget
        self.counter = counter
        self.summarizer = summarizer  # None: the mechanical digest
        self.start()

    def start(self) -> None:
        self.plan = policies.Plan()
        self.covered: list[Message] = []  # the chain prefix the plan was computed over
        self.short = False  # the plan's compaction left too little room: held to the limit

    async def view(self, messages: list[Message]) -> list[Message] | None:
        chain = [m for m in messages if not policies.is_system(m)]
        matches = chain[: self.plan.covered] == self.covered
        plan = self.plan if matches else policies.Plan()
        role = self.policy.compaction.summary_role
        view = policies.render(messages, plan, summary_role=role)
        tokens = self.counter.count(view, fixed=REPLY_PRIMING)
        held = matches and self.short and tokens <= self.budget.limit
        if tokens < self.budget.compact_tokens or held:
            return view
        result = await policies.compact(
            messages,
            plan,
            budget=self.budget,
            policy=self.policy.compaction,
            counter=self.counter,
            fixed_tokens=REPLY_PRIMING,
            summarizer=self.summarizer,
        )
        if not result.fits:
            return None  # the proxy answers context_length_exceeded itself
        if result.plan != plan or result.short:
            self.plan, self.covered = result.plan, chain[: result.plan.covered]
        self.short = result.short
        return result.view


class LangChain:
    name = "langchain"

    def __init__(self, budget: policies.Budget, counter: TokenCounter) -> None:
        self.budget = budget
        self.counter = counter

    def start(self) -> None:
        pass

    async def view(self, messages: list[Message]) -> list[Message] | None:
        counts: dict[int, int] = {}  # by id: the messages live as long as this request

        def count(batch: list[BaseMessage]) -> int:
            total = REPLY_PRIMING
            for message in batch:
                found = counts.get(id(message))
                if found is None:
                    openai = convert_to_openai_messages(message)
                    found = counts[id(message)] = self.counter.message(openai)
                total += found
            return total

        kept = trim_messages(
            convert_to_messages(messages),
            max_tokens=self.budget.limit,
            token_counter=count,
            strategy="last",
            start_on="human",
            include_system=True,
        )
        result: list[Message] = convert_to_openai_messages(kept)
        return result


class LiteLLM:
    name = "litellm"

    def __init__(self, budget: policies.Budget) -> None:
        import litellm.utils  # here: after LITELLM_LOCAL_MODEL_COST_MAP is set

        # It logs a traceback when it gives up (and returns the messages untrimmed).
        logging.getLogger("LiteLLM").setLevel(logging.CRITICAL)
        self.budget = budget
        self.trim = litellm.utils.trim_messages

    def start(self) -> None:
        pass

    async def view(self, messages: list[Message]) -> list[Message] | None:
        result: list[Message] = self.trim(messages, model=MODEL, max_tokens=self.budget.limit)
        return result


# -- what is measured ---------------------------------------------------------------------------


@dataclass
class Tally:
    """One method's figures over a replay. The "kept" figures count accepted requests only;
    tokens, stability and content are measured on the turns over the budget."""

    turns: int = 0
    refused: int = 0
    overflow: int = 0
    invalid: int = 0
    accepted: int = 0
    system_kept: int = 0
    round_kept: int = 0
    turn_kept: int = 0
    over: int = 0
    whole: int = 0  # forwarded unchanged although over the budget
    sent: int = 0
    forwarded: int = 0
    stable: int = 0
    text: int = 0
    text_kept: int = 0
    ids: int = 0
    ids_kept: int = 0
    seconds: float = 0.0


@dataclass
class Turn:
    """One request and what is known about it before any method runs."""

    messages: list[Message]
    tokens: int
    over: bool
    pieces: dict[str, int]  # user/assistant sentences (whitespace-normalised) -> characters
    ids: set[str]


def normalised(text: str) -> str:
    return " ".join(text.split())


def pieces_of(message: Message) -> Iterator[str]:
    if message.get("role") in ("user", "assistant"):
        text = policies.content_text(message.get("content"))
        yield from filter(None, map(normalised, _SENTENCES.split(text)))


def ids_of(message: Message) -> Iterator[str]:
    if message.get("role") in ("user", "assistant"):
        text = visible_text(message)
        yield from (match for pattern in _IDENTIFIERS for match in pattern.findall(text))


def turns_of(session: list[Message], limit: int) -> Iterator[Turn]:
    """The requests of a session: the history up to each assistant message."""
    pieces: dict[str, int] = {}
    ids: set[str] = set()
    for index, message in enumerate(session):
        if message.get("role") == "assistant" and index:
            request = session[:index]
            tokens = count_prompt_tokens(body(request))
            yield Turn(request, tokens, tokens > limit, dict(pieces), set(ids))
        pieces.update((piece, len(piece)) for piece in pieces_of(message))
        ids.update(ids_of(message))


def body(messages: list[Message], max_tokens: int = 0) -> dict[str, Any]:
    limit = {"max_tokens": max_tokens} if max_tokens else {}
    return {"model": MODEL, "messages": messages, **limit}


def form(message: Message) -> bytes:
    """The canonical form, tool-call arguments compared as JSON values (LangChain's round
    trip rewrites `{"a":1}` as `{"a": 1}`: the same call)."""
    calls = tool_calls(message)
    if calls:
        message = {**message, "tool_calls": [reparsed(call) for call in calls]}
    return policies.canonical(message)


def reparsed(call: dict[str, Any]) -> dict[str, Any]:
    try:
        arguments = json.dumps(json.loads(call_arguments(call)), sort_keys=True)
    except ValueError:
        return call
    return {**call, "function": {**call_function(call), "arguments": arguments}}


def forms(messages: Sequence[Message]) -> list[bytes]:
    return [form(m) for m in messages if not policies.is_system(m)]


def rejection(view: list[Message], max_tokens: int, window: int) -> str | None:
    """What the strict upstream says of the view: None (accepted), or the error's code."""
    try:
        validate_chat(body(view, max_tokens))
        check_window(body(view, max_tokens), window)
    except ApiError as error:
        return str(error.body["error"]["code"] or "invalid")
    return None


def score(tally: Tally, turn: Turn, view: list[Message]) -> None:
    """What an accepted view kept of its request."""
    request = turn.messages
    chain = [m for m in request if not policies.is_system(m)]
    shown = forms(view)
    systems = [m.get("content") for m in request if policies.is_system(m)]
    tally.accepted += 1
    tally.system_kept += [m.get("content") for m in view if policies.is_system(m)] == systems
    last_user = max((i for i, m in enumerate(chain) if m.get("role") == "user"), default=0)
    tail = forms(chain[last_user:])
    tally.round_kept += shown[len(shown) - len(tail) :] == tail
    tally.turn_kept += all(form(chain[i]) in shown for i in policies.current_turn(chain))
    if turn.over:
        text = normalised("\n".join(visible_text(m) for m in view))
        tally.text += sum(turn.pieces.values())
        tally.text_kept += sum(n for piece, n in turn.pieces.items() if piece in text)
        tally.ids += len(turn.ids)
        tally.ids_kept += sum(i in text for i in turn.ids)


async def replay(
    sessions: list[list[Message]],
    methods: Sequence[Method],
    budget: policies.Budget,
    max_tokens: int,
    window: int,
) -> dict[str, Tally]:
    tallies = {method.name: Tally() for method in methods}
    for session in sessions:
        previous: dict[str, list[Message] | None] = dict.fromkeys(tallies)
        for method in methods:
            method.start()
        for turn in turns_of(session, budget.limit):
            for method in methods:
                tally = tallies[method.name]
                tally.turns += 1
                started = time.perf_counter()
                view = await method.view(turn.messages)
                tally.seconds += time.perf_counter() - started
                if view is None:
                    tally.refused += 1
                    previous[method.name] = None
                    continue
                if turn.over:
                    tally.over += 1
                    tally.whole += view == turn.messages
                    tally.sent += turn.tokens
                    tally.forwarded += count_prompt_tokens(body(view))
                    before = previous[method.name]
                    tally.stable += before is not None and view[: len(before)] == before
                problem = rejection(view, max_tokens, window)
                if problem == "context_length_exceeded":
                    tally.overflow += 1
                elif problem is not None:
                    tally.invalid += 1
                else:
                    score(tally, turn, view)
                previous[method.name] = view
    return tallies


# -- the run ------------------------------------------------------------------------------------


def share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def accepted(part: Callable[[Tally], int]) -> Callable[[Tally], str]:
    return lambda t: share(part(t), t.accepted)


ROWS: tuple[tuple[str, Callable[[Tally], str]], ...] = (
    ("requests", lambda t: str(t.turns)),
    ("rejected by the upstream: over the window", lambda t: str(t.overflow)),
    ("rejected by the upstream: invalid (tool pairs)", lambda t: str(t.invalid)),
    ("refused by the proxy (400, cannot fit)", lambda t: str(t.refused)),
    ("system prompt kept", accepted(lambda t: t.system_kept)),
    ("last round kept verbatim", accepted(lambda t: t.round_kept)),
    ("current turn kept", accepted(lambda t: t.turn_kept)),
    ("requests over the budget", lambda t: str(t.over)),
    ("- forwarded whole", lambda t: str(t.whole)),
    ("- tokens forwarded / sent", lambda t: share(t.forwarded, t.sent)),
    ("- prefix stable from the turn before", lambda t: share(t.stable, t.over)),
    ("- user/assistant text kept", lambda t: share(t.text_kept, t.text)),
    ("- identifiers kept", lambda t: share(t.ids_kept, t.ids)),
    ("ms per request (mean)", lambda t: f"{1000 * t.seconds / max(1, t.turns):.2f}"),
)


def table(title: str, tallies: dict[str, Tally]) -> list[str]:
    names = list(tallies)
    lines = [f"### {title}", "", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, cell in ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(tallies[n]) for n in names) + " |")
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--join", type=int, default=2, help="conversations per long session")
    args = parser.parse_args()
    policy = default_policy()
    max_tokens = args.window // 4
    budget = budget_for(policy, args.window, max_tokens)
    counter = counter_for(MODEL)
    anchored = dataclasses.replace(
        policy, compaction=dataclasses.replace(policy.compaction, anchors=IDENTIFIERS)
    )
    fuller = dataclasses.replace(
        policy,
        compaction=dataclasses.replace(
            policy.compaction, compact_at=0.85, target=0.45, prepare_at=0.6
        ),
    )
    methods: list[Method] = [
        Proxy("proxy", policy, budget, counter),
        Proxy("proxy+anchors", anchored, budget, counter),
        Proxy("proxy 85/45", fuller, budget_for(fuller, args.window, max_tokens), counter),
        LangChain(budget, counter),
        LiteLLM(budget),
    ]
    conversations = load_traces()
    print(conditions())
    print(
        f"{MODEL}, window {args.window}, max_tokens {max_tokens}, prompt budget {budget.limit}"
        f" (compact at {budget.compact_tokens}, target {budget.target_tokens});"
        f" {len(conversations)} recorded conversations"
    )
    for join in (1, args.join):
        started = time.perf_counter()
        tallies = await replay(
            joined(conversations, join), methods, budget, max_tokens, args.window
        )
        title = "each conversation alone" if join == 1 else f"{join} conversations per session"
        print()
        print("\n".join(table(f"{title} ({time.perf_counter() - started:.0f} s)", tallies)))


if __name__ == "__main__":
    asyncio.run(main())
