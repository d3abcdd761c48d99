"""Calibration against the upstream's own counts, through the proxy: it converges for text the
proxy's estimate is far off for, and never lets an exactly counted prompt over its budget."""

from __future__ import annotations

import copy

import pytest

from proxy.models.calibration import MAX_RATIO, Calibration, Counting
from tests.harness import MODEL, harness

IMAGE = {"type": "image_url", "image_url": {"url": "https://x.test/photo.png"}}
CJK = "压缩代理保持长对话在上下文窗口内"  # ~1.2 tokens a character; chars/4 says 0.25
ESTIMATED = "small-8k"  # counted by chars/4 here; the fake counts it exactly, at 8192


def test_media_the_proxy_over_counts_never_widen_an_exact_budget() -> None:
    with harness() as h:
        budget = h.budget()
        chat = h.conversation()
        # The proxy counts an image of unknown size as 765 tokens, the upstream charged 85:
        # the session's first usage says the proxy counts five times too much.
        photos = [{"type": "text", "text": "Here are my photos."}, IMAGE, IMAGE]
        chat.messages += [
            {"role": "user", "content": photos},
            {"role": "assistant", "content": "Nice photos."},
        ]
        after = []
        for _ in range(30):
            headers = chat.say()
            after.append(int(headers["x-compaction-tokens-after"]))
        assert max(after) <= budget.limit  # the proxy's own exact count, every turn
        state = h.state(chat.key)
        assert state.branches and state.branches[0].plan.cut > 2  # the photos were evicted
        assert state.calibration is not None and state.calibration >= 1.0


def cjk_turn(turn: int) -> str:
    return f"{turn}: {CJK * 12}"


def test_an_estimated_count_converges_on_cjk_text() -> None:
    models = [{"match": ESTIMATED, "context_window": 8192, "counting": "estimate"}]
    with harness(models=models) as h:
        budget = h.budget(ESTIMATED)
        chat = h.conversation(model=ESTIMATED)
        forwarded = []
        for turn in range(40):
            sent = len(h.forwarded())
            chat.say(cjk_turn(turn))
            forwarded.append(len(h.forwarded()) - sent)
        # From the first usage on, the proxy counts as the upstream does: no request needs
        # the reactive retry, and every prompt leaves the reserved output its room.
        assert forwarded[1:] == [1] * 39
        over = [u for u in chat.usage[1:] if u + budget.reserved_output > budget.window]
        assert over == []
        assert h.state(chat.key).branches  # compacted, in the upstream's tokens
        ratio = h.state(chat.key).calibration
        assert ratio is not None and 3 < ratio < MAX_RATIO


def test_a_ratio_learnt_for_one_model_applies_to_no_other() -> None:
    """One session id for two models (a client that switches, or reuses its id): the ratio
    learnt for the estimated one (CJK text: about 4) scales the exactly counted one's budget
    neither in this replica nor, stored with the session, in another, where it still serves
    the model it was learnt for."""
    models = [
        {"match": ESTIMATED, "context_window": 8192, "counting": "estimate"},
        {"match": MODEL, "context_window": 8192},
    ]
    with harness(models=models, replicas=2) as h:
        estimated = h.conversation("mixed", model=ESTIMATED)
        for turn in range(12):
            headers = estimated.say(cjk_turn(turn) * 6)
            if headers["x-compaction-action"] == "compacted":
                break
        assert headers["x-compaction-action"] == "compacted"  # the ratio is stored with it
        learnt = float(headers["x-compaction-count-ratio"])
        assert learnt > 3
        for server in (0, 1):
            exact = h.conversation("mixed", server=server, model=MODEL)
            exact.messages = copy.deepcopy(estimated.messages)
            headers = exact.say(cjk_turn(100 + server))
            assert "x-compaction-count-ratio" not in headers
            after = int(headers["x-compaction-tokens-after"])
            assert after == pytest.approx(exact.usage[-1], rel=0.02)  # the exact count
        other = h.conversation("mixed", server=1, model=ESTIMATED)
        other.messages = copy.deepcopy(estimated.messages)
        ratio = float(other.say(cjk_turn(200))["x-compaction-count-ratio"])
        assert ratio == pytest.approx(learnt, rel=0.01)


def test_a_higher_ratio_is_taken_at_once_and_a_lower_one_approached() -> None:
    calibration = Calibration()
    estimated, exact = Counting("estimate:local-llama", False), Counting("o200k_base:gpt-4o", True)
    calibration.observe("s", estimated, 400, 100)
    assert calibration.effective("s", estimated, None) == 4.0
    calibration.observe("s", estimated, 100, 100)
    assert calibration.effective("s", estimated, None) == 2.0  # half way, in log space
    calibration.observe("s", estimated, 800, 100)
    assert calibration.effective("s", estimated, None) == 8.0
    assert calibration.effective("s", exact, None) == 1.0  # another model's: not this one's
    # Exactly counted: never under 1, whatever was stored.
    calibration.observe("t", exact, 50, 100)
    assert calibration.effective("t", exact, None) == 1.0
    assert calibration.effective("u", exact, 0.5) == 1.0
    assert calibration.effective("u", estimated, 0.5) == 0.5
