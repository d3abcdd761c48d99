"""Nothing the cut removes goes uncovered: a summary prepared ahead of time that covers less
than a compaction evicts gets the rest beside it (a digest) or folded into it, on that very
turn; a compacted agent loop keeps its task and summarises the rounds since."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import (
    Plan,
    Policy,
    Rolled,
    Summary,
    SummaryRequest,
    compact,
    content_text,
    is_system,
    roll_prepared,
)
from policies.prepared import MIN_TAIL_TOKENS
from tests.conftest import examples
from tests.conversations import CharCounter, budget_for, conversations

COUNTER = CharCounter()
POLICY = Policy()


async def extractive(request: SummaryRequest) -> str:
    """The first words of the previous summary and of each evicted message, within the cap."""
    parts = [request.previous.shown[:80]] if request.previous else []
    parts += [content_text(m.get("content"))[:40] for m in request.evicted]
    return COUNTER.head("Summary: " + " | ".join(parts), request.max_tokens)


def request_ends(messages: list[dict]) -> list[int]:
    """The lengths at which a prefix of `messages` is a request a client could send: it
    ends with a user message or with a tool block's last answer."""
    ends = []
    for i, message in enumerate(messages):
        following = messages[i + 1]["role"] if i + 1 < len(messages) else None
        if message["role"] in ("user", "tool") and following != "tool":
            ends.append(i + 1)
    return ends


def removed(plan: Plan) -> set[int]:
    return set(range(plan.cut)) - {plan.task}


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    messages=conversations(max_rounds=8),
    picks=st.tuples(st.integers(0, 99), st.integers(0, 99)),
    window=st.sampled_from([1024, 2048, 4096]),
    ahead=st.sampled_from([0, 150, 600]),
    earlier_summary=st.booleans(),
)
async def test_every_removed_message_is_covered_by_what_replaced_it(
    messages, picks, window, ahead, earlier_summary
) -> None:
    budget = budget_for(window, 0.45)
    ends = sorted(e for e in request_ends(messages) if e < len(messages))
    base = Plan()
    if earlier_summary and ends:
        first = messages[: ends[picks[0] % len(ends)]]
        base = (
            await compact(
                first, Plan(), budget=budget, policy=POLICY, counter=COUNTER, summarizer=extractive
            )
        ).plan
    # A summary prepared ahead of time, from an earlier request of the conversation.
    made: list[tuple[SummaryRequest, str]] = []

    async def recording(request: SummaryRequest) -> str:
        text = await extractive(request)
        made.append((request, text))
        return text

    if ends:
        earlier = messages[: ends[picks[1] % len(ends)]]
        await compact(
            earlier,
            base,
            budget=budget,
            policy=POLICY,
            counter=COUNTER,
            summarizer=recording,
            ahead_tokens=ahead,
        )
    prepared = made[-1] if made else None
    asked: list[set[int]] = []

    async def with_prepared(request: SummaryRequest) -> str:
        asked.append(set(request.positions))
        if prepared is None:
            return await extractive(request)
        made_for, text = prepared
        usable = (
            request.start == made_for.start
            and made_for.end <= request.end
            and request.previous == made_for.previous
        )
        if not usable:
            return await extractive(request)
        rolled = roll_prepared(text, made_for.start, made_for.end, request, COUNTER)
        inside = {p for p in request.positions if made_for.start <= p < made_for.end}
        if isinstance(rolled, Rolled):
            assert inside | set(rolled.digested) == set(request.positions)
            return rolled.text
        assert rolled.previous == Summary(text, "llm")
        assert inside | set(rolled.positions) == set(request.positions)
        return await extractive(rolled)

    result = await compact(
        messages, base, budget=budget, policy=POLICY, counter=COUNTER, summarizer=with_prepared
    )
    newly = removed(result.plan) - removed(base)
    # Covered by a summary asked for them, or by the digest made of them where the layer did
    # not ask (a summary too short to be worth a call, `policies.too_short`).
    digested = [
        set(d.positions)
        for d in result.decisions
        if d.layer == "summarize" and d.detail.startswith("digest")
    ]
    assert newly <= set().union(*asked, *digested)
    chain = [m for m in messages if not is_system(m)]
    if result.plan.task is not None:  # a kept task is the task of an agent loop, verbatim
        assert chain[result.plan.task]["role"] == "user"
        assert chain[result.plan.task] in result.view


def _rounds(count: int) -> tuple[list[dict], list[int]]:
    messages = [{"role": "user", "content": f"question {n} about order {n}"} for n in range(count)]
    return messages, list(range(count))


def test_a_prepared_summary_with_room_gets_a_digest_of_the_rest_beside_it() -> None:
    evicted, positions = _rounds(10)
    request = SummaryRequest(None, evicted, 400, None, start=0, end=10, positions=tuple(positions))
    rolled = roll_prepared("Summary of 0-3.", 0, 4, request, COUNTER)
    assert isinstance(rolled, Rolled) and rolled.digested == tuple(range(4, 10))
    assert rolled.text.startswith("Summary of 0-3.\n\nUser requests:")
    assert "order 9" in rolled.text


def test_a_prepared_summary_that_fills_its_cap_has_the_rest_folded_into_it() -> None:
    evicted, positions = _rounds(10)
    text = "x" * 4 * 390  # 390 of the 400 tokens the summary may take
    request = SummaryRequest(
        None, evicted, 400, "be brief", start=0, end=10, positions=tuple(positions)
    )
    fold = roll_prepared(text, 0, 4, request, COUNTER)
    assert 400 - COUNTER.text(text) < MIN_TAIL_TOKENS
    assert isinstance(fold, SummaryRequest)
    assert fold.previous == Summary(text, "llm") and fold.evicted == evicted[4:]
    assert (fold.start, fold.end, fold.positions) == (4, 10, tuple(range(4, 10)))
    assert fold.instructions == "be brief" and fold.max_tokens == 400
