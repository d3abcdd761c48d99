"""A compaction that cannot reach its target (the fixed part and the current turn are over the
compact level, as Codex's prompt at a 16k window is) is not redone every turn: the view is
replayed as it is while it fits, said in `x-compaction-target: unreachable` and a metric, and
compacted again only once it no longer fits."""

from __future__ import annotations

import itertools

from proxy.models.tokens import counter_for
from tests.conversations import words
from tests.harness import MODEL, harness


def test_a_compaction_short_of_its_target_is_not_redone_every_turn() -> None:
    counter = counter_for(MODEL, "exact")
    with harness(policies={"default": {"protect_min_tokens": 0}}) as h:
        budget = h.budget()
        chat = h.conversation()
        # The system prompt alone a little under the compact level: with the current turn
        # over it, under the limit.
        size = 1
        while counter.message({"role": "system", "content": words(size, 7)}) < (
            budget.compact_tokens - 15
        ):
            size += 10
        chat.messages[0] = {"role": "system", "content": words(size, 7)}
        headers = [chat.say(words(30, turn)) for turn in range(14)]
        actions = [(h_["x-compaction-action"], h_.get("x-compaction-target")) for h_ in headers]
        compacted = [a for a, _ in actions if a in ("compacted", "degraded")]
        held = [a for a, target in actions if a == "replayed" and target == "unreachable"]
        assert compacted and held, actions
        assert len(compacted) <= len(actions) // 2, actions  # not on every turn
        # A held turn forwards the turn before's view, then what is new.
        forwarded = h.forwarded()
        for (earlier, later), (action, _) in zip(
            itertools.pairwise(forwarded), actions[1:], strict=True
        ):
            if action == "replayed":
                assert later[: len(earlier)] == earlier
        assert all(int(x["x-compaction-tokens-after"]) <= budget.limit for x in headers)
        assert h.metric("compaction_proxy_target_unreachable_total", event="held") == len(held)
        assert h.metric("compaction_proxy_target_unreachable_total", event="compacted") >= 1


def test_a_compaction_without_room_for_the_next_turn_is_not_redone_every_turn() -> None:
    """The fixed part and the current turn under the compact level, but by less than a turn
    (Codex at 16k: its ~8k of prompt and tools): the compaction reaches the level, the next
    turn is over it again. Compacting again could do no better, so the view is held, turn
    after turn, until it no longer fits the limit."""
    counter = counter_for(MODEL, "exact")
    with harness(policies={"default": {"protect_min_tokens": 0}}) as h:
        budget = h.budget()
        chat = h.conversation()
        turn = 60  # a turn's words: its growth, the question and the answer, is over 60 tokens
        size = 1
        while counter.message({"role": "system", "content": words(size, 7)}) < (
            budget.compact_tokens - 2 * turn - 40
        ):
            size += 10
        chat.messages[0] = {"role": "system", "content": words(size, 7)}
        headers = [chat.say(words(turn, i)) for i in range(12)]
        actions = [x["x-compaction-action"] for x in headers]
        after = [int(x["x-compaction-tokens-after"]) for x in headers]
        compactions = [i for i, a in enumerate(actions) if a in ("compacted", "degraded")]
        assert compactions, actions
        # The compaction's view is under the compact level: its target was reached...
        assert after[compactions[0]] < budget.compact_tokens, (after, budget)
        # ...but not every turn after it compacts: the next ones are replayed while they fit.
        assert len(compactions) <= (len(actions) - compactions[0] + 1) // 2, actions
        forwarded = h.forwarded()
        for (earlier, later), action in zip(
            itertools.pairwise(forwarded), actions[1:], strict=True
        ):
            if action == "replayed":
                assert later[: len(earlier)] == earlier
        assert all(tokens <= budget.limit for tokens in after)
        assert h.metric("compaction_proxy_target_unreachable_total", event="held") >= 1
