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
