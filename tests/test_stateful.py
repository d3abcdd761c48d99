"""Stateful compaction through the real openai SDK and a real Redis (docs/compaction.md):
plans replayed byte for byte, branches, replicas sharing a session, Redis going away,
calibration and the reactive path. The harness is in tests/harness.py.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import orjson
import pytest

from policies import Chain
from proxy.compaction.forward import Forward
from proxy.sessions.state import SessionState
from tests.conftest import captured
from tests.fakes.openai import ApiError, check_window
from tests.harness import (
    MODEL,
    NO_DASHBOARD,
    SESSION_HEADER,
    WINDOW,
    Harness,
    Message,
    grow_to_prepare,
    harness,
    header_text,
    history,
    prepare_ahead,
    said,
)
from tests.redis_servers import free_port, redis_server

# -- replay -----------------------------------------------------------------------------------


def test_a_request_under_the_levels_writes_nothing() -> None:
    # The dashboard's turns are written by themselves (tests/test_dashboard.py): off here.
    with harness(admin=NO_DASHBOARD) as h:
        chat = h.conversation()
        for _ in range(3):
            assert chat.say()["x-compaction-action"] == "none"
        assert h.up.requests[-1].json["messages"] == chat.messages[:-1]
        assert not h.redis.exists(h.state_key(chat.key))


def test_between_compactions_the_forwarded_prefix_is_byte_stable() -> None:
    with harness() as h:
        budget = h.budget()
        chat = h.conversation()
        headers = chat.until("compacted")
        previous, version = h.forwarded()[-1], h.version(chat.key)
        compactions, replays, start = 1, 0, int(headers["x-compaction-tokens-before"])
        for _ in range(40):
            headers = chat.say()
            view = h.forwarded()[-1]
            if headers["x-compaction-action"] == "compacted":
                compactions += 1
            else:
                assert headers["x-compaction-action"] == "replayed"
                replays += 1
                # The previous view, byte for byte, and the new turn after it.
                assert orjson.dumps(view[: len(previous)]) == orjson.dumps(previous)
                assert view[len(previous) :] == chat.messages[-3:-1]
                if int(headers["x-compaction-tokens-after"]) < budget.prepare_tokens:
                    assert h.version(chat.key) == version  # a replay writes nothing
            previous, version = view, h.version(chat.key)
        assert replays > 30
        # Hysteresis: at most one compaction per (compact_at - target) of growth, plus one.
        grown = int(headers["x-compaction-tokens-before"]) - start
        assert 2 <= compactions <= grown // (budget.compact_tokens - budget.target_tokens) + 1


def test_the_watermark_only_moves_forward() -> None:
    with harness() as h:
        chat = h.conversation()
        marks = []
        for _ in range(4):
            chat.until("compacted")
            (branch,) = h.state(chat.key).branches
            marks.append((branch.plan.cut, branch.plan.covered))
            assert branch.plan.covered == len(Chain.of(chat.messages)) - 1
        cuts, covered = zip(*marks, strict=True)
        assert list(cuts) == sorted(set(cuts))
        assert list(covered) == sorted(set(covered))


# -- branches -------------------------------------------------------------------------------


def test_an_edited_history_is_compacted_from_scratch_and_the_old_branch_survives() -> None:
    with harness() as h:
        chat = h.conversation()
        chat.until("compacted")
        prepare_ahead(h, chat)
        state = h.state(chat.key)
        (branch,) = state.branches
        assert branch.plan.summary is not None and state.prepared is not None
        calls = h.up.summary_calls

        edited = chat.fork()
        edited.messages[1] = {"role": "user", "content": "Something else entirely. " * 20}
        headers = edited.say()
        assert headers["x-compaction-action"] == "compacted"
        assert h.up.summary_calls == calls + 1  # a summary of its own, on the request path
        view = orjson.dumps(h.forwarded()[-1]).decode()
        assert branch.plan.summary.text not in view
        assert state.prepared.text not in view
        assert "Something else entirely" in h.summaries.prompts[-1]

        after = h.state(chat.key)
        assert len(after.branches) == 2
        assert branch in after.branches  # the old branch, untouched
        assert after.branch(Chain.of(chat.messages)) == branch
        headers = chat.say()
        assert headers["x-compaction-action"] == "replayed"
        assert header_text(h.forwarded()[-1]).endswith(branch.plan.summary.text)


def test_branches_are_capped_least_recently_used_out() -> None:
    with harness(store={"max_branches": 2}) as h:
        client = h.openai()
        variants = [history(24, variant=f" (variant {v})") for v in range(3)]

        def send(messages: list[Message]) -> tuple[str, str]:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,
                extra_headers={SESSION_HEADER: "s1"},
            )
            return raw.headers["x-compaction-session"], raw.headers["x-compaction-action"]

        for messages in variants:
            key, action = send(messages)
            assert action == "compacted"
        state = h.state(key)
        found = [state.branch(Chain.of(messages)) for messages in variants]
        assert found[0] is None and None not in found[1:]
        assert len(state.branches) == 2

        calls = h.up.summary_calls
        assert send(variants[0]) == (key, "compacted")  # compacted again, from scratch
        assert h.up.summary_calls == calls + 1
        assert send(variants[2]) == (key, "replayed")


# -- corrupt records --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"\x00not json",
        b'{"branches": [{"plan": {"cut": "x"}, "chain": "ab", "used": 1.0}]}',
        b'{"branches": [], "calibration": "high"}',  # each of these failed a later request
        b'{"branches": [], "memory": [1, 2]}',
        b'{"branches": [], "pending": 7}',
    ],
)
def test_a_corrupt_record_is_treated_as_empty_and_logged(
    data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with harness() as h, captured(caplog):
        chat = h.conversation()
        key = chat.say()["x-compaction-session"]
        h.redis.hset(h.state_key(key), mapping={"v": 7, "d": data})
        assert chat.say()["x-compaction-action"] == "none"
        assert "corrupt session state" in caplog.text
        headers = chat.until("compacted")
        assert headers["x-compaction-store"] == "ok"
        version, state = h.record(key) or (0, SessionState())
        assert version > 7 and len(state.branches) == 1  # replaced by the proxy's writes


# -- replicas ---------------------------------------------------------------------------------


async def ask(h: Harness, server: int, messages: list[Message]) -> httpx.Headers:
    """One request of session s1 through the async SDK, to replica `server`."""
    url = h.servers[server].url + "/v1"
    async with openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, extra_headers={SESSION_HEADER: "s1"}
        )
    return raw.headers


async def test_two_replicas_serve_one_session_with_one_plan_and_one_summary() -> None:
    with harness(replicas=2) as h:
        h.up.summary_delay = 0.3
        compacted: list[httpx.Headers] = []
        # The second request grows the first by 16 rounds: back at the compaction level.
        for phase, messages in enumerate([history(24), history(40)]):
            sent = len(h.forwarded())
            answers = await asyncio.gather(*(ask(h, i % 2, messages) for i in range(6)))
            actions = sorted(a["x-compaction-action"] for a in answers)
            assert actions == ["compacted", *["replayed"] * 5]
            assert h.up.summary_calls == phase + 1
            views = [orjson.dumps(v) for v in h.forwarded()[sent:]]
            assert len(views) == 6 and len(set(views)) == 1  # one plan, the same view for all
            compacted += [a for a in answers if a["x-compaction-action"] == "compacted"]
            version, state = h.record(answers[0]["x-compaction-session"]) or (0, SessionState())
            assert version == phase + 1  # every write counted, none lost
            assert len(state.branches) == 1
            after = {d["tokens_after"] for d in state.decisions}
            assert {int(c["x-compaction-tokens-after"]) for c in compacted} <= after


async def test_requests_wait_for_a_summary_being_prepared_and_compact_once() -> None:
    with harness(replicas=2) as h:
        chat = h.conversation()
        h.up.summary_delay = 0.4
        grow_to_prepare(h, chat)
        assert h.up.wait_for(lambda: h.up.summary_calls == 1)
        chat.skip(8)  # past the compaction level, while the summary is being made
        messages = [*chat.messages, {"role": "user", "content": said(chat.turns)}]
        sent = len(h.forwarded())
        answers = await asyncio.gather(*(ask(h, i % 2, messages) for i in range(6)))
        assert sorted(a["x-compaction-action"] for a in answers) == [
            "compacted",
            *["replayed"] * 5,
        ]
        assert h.up.summary_calls == 1  # the prepared one: none on the request path
        assert len({orjson.dumps(v) for v in h.forwarded()[sent:]}) == 1
        version, state = h.record(chat.key) or (0, SessionState())
        assert version == 2  # the prepared summary, then the one compaction
        assert state.prepared is None and len(state.branches) == 1


async def test_a_replica_does_not_prepare_while_another_compacts() -> None:
    with harness(replicas=2) as h:
        h.up.summary_delay = 0.4
        # Replica 0 compacts the session; meanwhile replica 1 serves it at the prepare level.
        compacting = asyncio.ensure_future(ask(h, 0, history(24)))
        assert await asyncio.to_thread(h.up.wait_for, lambda: h.up.summary_calls == 1)
        preparing = await ask(h, 1, history(15))
        assert (await compacting)["x-compaction-action"] == "compacted"
        assert preparing["x-compaction-action"] == "none"
        assert int(preparing["x-compaction-tokens-after"]) >= h.budget().prepare_tokens
        await asyncio.sleep(0.6)
        assert h.up.summary_calls == 1
        for server in h.servers:
            assert httpx.get(server.url + "/readyz").status_code == 200
            text = httpx.get(server.url + "/metrics").text
            assert "compaction_proxy_store_errors_total{" not in text


def test_a_compaction_waits_no_longer_than_the_summary_being_prepared() -> None:
    settings = {"timeout_seconds": 1.0, "retries": 0}  # the lock lasts 6 s
    with harness(policies={"default": {"summarizer": settings}}) as h:
        chat = h.conversation()
        h.summaries.answer = lambda n: RuntimeError("boom")
        h.up.summary_delay = 0.3
        grow_to_prepare(h, chat)  # its summary fails: it writes nothing
        assert h.up.wait_for(lambda: h.up.summary_calls == 1)
        chat.skip(8)
        started = time.monotonic()
        assert chat.say()["x-compaction-action"] == "degraded"
        assert time.monotonic() - started < 3
        assert h.up.summary_calls == 1  # then the summarizer cools down


# -- the store going away ---------------------------------------------------------------------


def test_redis_stopped_mid_run_then_back() -> None:
    port = free_port()
    with harness(redis_url=f"redis://127.0.0.1:{port}/0") as h:
        chat = h.conversation()
        with redis_server(port):
            chat.until("compacted")
            assert h.record(chat.key) is not None
            errors = h.metric("compaction_proxy_store_errors_total", operation="get")
        # Stopped: served from the request alone.
        for _ in range(3):
            chat.messages.append({"role": "user", "content": said(chat.turns)})
            response = httpx.post(
                h.url + "/v1/chat/completions",
                json={"model": MODEL, "messages": chat.messages},
                headers={SESSION_HEADER: chat.session},
            )
            assert response.status_code == 200
            assert response.headers["x-compaction-store"] == "unavailable"
            assert response.headers["x-compaction-action"] in ("compacted", "degraded")
            chat.messages.append(response.json()["choices"][0]["message"])
        assert httpx.get(h.url + "/readyz").status_code == 503
        after = h.metric("compaction_proxy_store_errors_total", operation="get")
        assert after > errors
        with redis_server(port):
            h.wait_for(lambda: httpx.get(h.url + "/readyz").status_code == 200, timeout=3)
            headers = chat.say()  # asserts x-compaction-store: ok
            assert headers["x-compaction-action"] == "compacted"  # a new, empty Redis
            assert h.record(chat.key) is not None


def test_a_store_that_fails_closed_answers_503() -> None:
    with harness(redis_url=f"redis://127.0.0.1:{free_port()}/0", store={"fail_open": False}) as h:
        response = httpx.post(
            h.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert response.status_code == 503
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "session_store_unavailable"
        assert h.forwarded() == []


# -- calibration and the reactive path --------------------------------------------------------

ESTIMATED = "estimated-model"


def numbers(turn: int) -> str:
    """Text that chars/4 under-counts about 1.45 times (cl100k_base)."""
    return " ".join(f"value {(turn * 40 + n) * 7919 % 1000} and {n * 31 % 100}" for n in range(40))


@pytest.mark.parametrize(
    ("ratio", "shown"), [(1.0, None), (0.99996, None), (1.0004, None), (1.002, "1.002")]
)
def test_the_count_ratio_is_said_only_when_it_shows_as_other_than_1(
    ratio: float, shown: str | None
) -> None:
    headers = dict(Forward(b"{}", "s", "none", "ok", 100, 100, ratio=ratio).headers())
    assert headers.get("x-compaction-count-ratio") == shown


def test_calibration_corrects_an_estimated_count() -> None:
    models = [{"match": ESTIMATED, "context_window": WINDOW, "counting": "estimate"}]
    # Summaries of about the size the summarizer writes, so the target is what is reached.
    layers = [{"summarize": {"target_share": 0.1}}]
    with harness(models=models, policies={"default": {"layers": layers}}) as h:
        budget = h.budget(ESTIMATED)
        chat = h.conversation(model=ESTIMATED)
        for turn in range(40):
            headers = chat.say(numbers(turn))
            if headers["x-compaction-action"] == "compacted":
                break
        # The estimate alone had not reached the compaction level, the upstream's count had;
        # the headers say the count the decision used (the upstream's), and the ratio.
        ratio = float(headers["x-compaction-count-ratio"])
        decided = int(headers["x-compaction-tokens-before"])
        assert decided / ratio < budget.compact_tokens <= decided
        assert chat.usage[-2] < decided <= chat.usage[-2] * 1.2
        # Compacted down to the target in the upstream's own tokens, so the next turns replay.
        assert chat.usage[-1] <= budget.target_tokens * 1.1
        for _ in range(3):
            assert chat.say(numbers(chat.turns))["x-compaction-action"] == "replayed"
        inspect = h.admin("GET", f"/admin/sessions/{chat.key}").json()
        assert 1.3 < inspect["calibration"] < 1.7


CJK = "压缩代理保持长对话在上下文窗口内"  # ~1.2 tokens a character; chars/4 says 0.25


def test_an_under_counted_request_is_compacted_harder_and_retried_once() -> None:
    models = [{"match": "small-8k", "context_window": 8192, "counting": "estimate"}]
    with harness(models=models) as h:
        client = h.openai()
        messages: list[Message] = []
        for turn in range(24):
            messages += [
                {"role": "user", "content": f"{turn}: {CJK * 20}"},
                {"role": "assistant", "content": "Noted."},
            ]
        messages.append({"role": "user", "content": "Which turn was first?"})
        raw = client.chat.completions.with_raw_response.create(model="small-8k", messages=messages)
        assert raw.http_response.status_code == 200
        assert raw.headers["x-compaction-action"] in ("compacted", "degraded")
        first, second = h.forwarded()
        assert first == messages  # the estimate was under every level
        assert len(orjson.dumps(second)) < len(orjson.dumps(first)) / 2
        assert second[-1] == messages[-1]

        # The current turn alone is too long: the upstream's own 400 reaches the client.
        h.up.reset()
        too_long = [{"role": "user", "content": CJK * 440}]
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="small-8k", messages=too_long)
        # No compaction makes it smaller: relayed at once, never the same body again.
        assert len(h.forwarded()) == 1
        assert caught.value.response.headers["x-compaction-overflow"] == "relayed"
        overflow = {"upstream": "fake", "reason": "overflow"}
        assert h.metric("compaction_proxy_upstream_retries_total", **overflow) == 1
        with pytest.raises(ApiError) as expected:
            check_window(h.up.requests[-1].json, 8192)
        assert caught.value.response.json() == expected.value.body
