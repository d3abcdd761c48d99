"""A max_tokens the window cannot hold beside the prompt (Claude Code asks for 128k at any
window; `17987 + 32000 > 32768`).

Under `max_tokens_overflow: lower` (the default) the forwarded body asks at once for what the
window leaves the forwarded prompt, by the proxy's count (Messages, chat and Responses; above
extended thinking's budget; never under shadow mode); when that count was short, the
upstream's overflow lowers it again by its own figures, once. Under `relay` the client's
max_tokens goes as it is, and an overflow is relayed as the upstream said it (Claude Code
parses it to lower max_tokens by itself). The proxy never sends the same body twice, and asks
no summary for a target that small."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from proxy.compaction.turn import ESTIMATE_ERROR
from proxy.config import loads
from tests.conftest import merged, metric
from tests.conversations import unmarked, words
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.openai import FakeUpstream
from tests.servers import proxy_server

MODEL = "claude-32k"
WINDOW = 32_768
SMALL, SMALL_WINDOW = "claude-small", 8000
KEY = "sk-ant-api03-test"
SAFETY_MARGIN = 256  # the policy's default safety_margin_tokens
SYSTEM = "You are a careful build engineer. " + words(2500, 1)  # ~3k tokens: over what is left


def config(up: FakeAnthropic, **policy: Any) -> Any:
    data = {
        "upstreams": {"claude": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
        "models": [
            {"match": MODEL, "context_window": WINDOW},
            {"match": SMALL, "context_window": SMALL_WINDOW},
        ],
    }
    return loads(yaml.safe_dump(merged(data, {"policies": {"default": policy}} if policy else {})))


@pytest.fixture(scope="module")
def up() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(windows={MODEL: WINDOW, SMALL: SMALL_WINDOW}) as fake:
        yield fake


@pytest.fixture(autouse=True)
def fresh(up: FakeAnthropic) -> None:
    up.reset()


def history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for turn in range(turns):
        out.append({"role": "user", "content": f"Step {turn}: {words(400, turn)}"})
        out.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    return [*out, {"role": "user", "content": "And now?"}]


def request(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 32_000,
        "system": SYSTEM,
        "messages": history(8),
        **extra,
    }


def sent(up: FakeAnthropic) -> list[dict[str, Any]]:
    return [r.json for r in up.requests if r.headers.get("x-compaction-summary") != "1"]


def test_the_overflow_is_relayed_at_once_as_the_upstream_said_it(up: FakeAnthropic) -> None:
    body = request()
    direct = httpx.post(
        up.base_url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}
    )
    prompt = up.count(body)
    assert direct.status_code == 400 and prompt < WINDOW
    up.reset()
    with (
        proxy_server(config(up, max_tokens_overflow="relay")) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(**body)
        answer = refused.value.response
        assert answer.headers["x-compaction-overflow"] == "relayed"
        assert "x-compaction-max-tokens" not in answer.headers
        # Claude Code reads these words to retry with a max_tokens that fits.
        assert answer.json()["error"] == direct.json()["error"]
        assert answer.json()["error"]["message"].startswith(
            f"input length and `max_tokens` exceed context limit: {prompt} + 32000 > {WINDOW}"
        )
        assert len(sent(up)) == 1  # never the same body twice
        assert up.summary_calls == 0  # a summary of ~70 tokens is not worth a call


def lowered_metric(proxy: Any) -> tuple[float, float]:
    """Requests lowered before their first try, and those sent again lowered after the
    upstream's overflow."""
    with httpx.Client() as http:
        ahead = metric(http, proxy, "compaction_proxy_max_tokens_lowered_total")
        retries = metric(
            http, proxy, "compaction_proxy_upstream_retries_total", reason="max_tokens"
        )
    return ahead, retries


def room(headers: Mapping[str, str], window: int, *, estimated: bool = False) -> int:
    """What the window leaves the forwarded prompt (as the proxy counted it, with the error
    an estimate may have) and the safety margin."""
    prompt = int(headers["x-compaction-tokens-after"])
    return window - math.ceil(prompt * (1 + ESTIMATE_ERROR if estimated else 1)) - SAFETY_MARGIN


def test_lowered_before_the_first_try_and_said_so(up: FakeAnthropic) -> None:
    """Claude Code's 128k at a 32k window: the upstream is asked once, for what is left."""
    body = request(max_tokens=128_000)
    with (
        proxy_server(config(up, max_tokens_overflow="lower")) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        raw = client.messages.with_raw_response.create(**body)
        assert raw.parse().content[0].text.startswith("Fake reply")
        lowered = int(raw.headers["x-compaction-max-tokens"])
        assert lowered == room(raw.headers, WINDOW, estimated=True)  # Claude's: chars/4
        assert up.count(body) + lowered <= WINDOW
        assert "x-compaction-overflow" not in raw.headers  # no overflow was met
        (forwarded,) = sent(up)
        assert forwarded["max_tokens"] == lowered
        assert unmarked({**forwarded, "max_tokens": 128_000}) == body  # nothing else changed
        assert lowered_metric(proxy) == (1, 0)


def test_lowered_before_the_first_try_above_thinkings_budget(up: FakeAnthropic) -> None:
    body = request(max_tokens=128_000, thinking={"type": "enabled", "budget_tokens": 4096})
    with (
        proxy_server(config(up)) as proxy,  # the default policy: lower
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        raw = client.messages.with_raw_response.create(**body)
        lowered = int(raw.headers["x-compaction-max-tokens"])
        assert 4096 < lowered == room(raw.headers, WINDOW, estimated=True)
        (forwarded,) = sent(up)
        assert forwarded["max_tokens"] == lowered
        assert forwarded["thinking"] == {"type": "enabled", "budget_tokens": 4096}
        assert lowered_metric(proxy) == (1, 0)


def test_a_short_estimate_still_ends_in_the_reactive_lowering(up: FakeAnthropic) -> None:
    """The proxy estimates Claude's tokens (chars/4): digits it counts at a quarter of what the
    upstream does, so what it leaves max_tokens is too much; the upstream's own figures then
    lower it, once."""
    digits = " ".join(str(n % 10) for n in range(9000))  # ~4.5k estimated, ~10k upstream
    body = request(max_tokens=128_000, messages=[{"role": "user", "content": digits}])
    prompt = up.count(body)
    with (
        proxy_server(config(up)) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        raw = client.messages.with_raw_response.create(**body)
        assert raw.headers["x-compaction-overflow"] == "max_tokens"
        assert raw.headers["x-compaction-max-tokens"] == str(WINDOW - prompt)
        first, retried = sent(up)
        assert prompt + first["max_tokens"] > WINDOW and first["max_tokens"] < 128_000
        assert retried["max_tokens"] == WINDOW - prompt
        assert {**retried, "max_tokens": 0} == {**first, "max_tokens": 0}
        assert lowered_metric(proxy) == (1, 1)


def measurements(seed: int) -> str:
    """A tool's output of random floats: the proxy's estimate (chars/4) counts it at about
    three fifths of what the upstream does."""
    draw = random.Random(seed)
    return "\n".join(str(draw.random()) for _ in range(150))


ASK = "Please analyse these measurement files and tell me the trend."


def measured(reads: int) -> list[dict[str, Any]]:
    """A user's turn, then `reads` tool calls and their results (Messages)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    for read in range(reads):
        call = {"type": "tool_use", "id": f"toolu_{read:04d}", "name": "read", "input": {}}
        result = {"type": "tool_result", "tool_use_id": call["id"], "content": measurements(read)}
        messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]
    return messages


@pytest.mark.parametrize("stream", [False, True])
def test_a_fresh_sessions_first_overflow_is_sent_again_by_the_upstreams_count(
    up: FakeAnthropic, stream: bool
) -> None:
    """A new session (nothing calibrated) of a prompt the estimate counts at three fifths:
    max_tokens lowered by that estimate overflows, and the request compacted harder goes with
    a max_tokens reckoned by the upstream's own count of the prompt it refused, and passes."""
    tools = [{"name": "read", "input_schema": {"type": "object"}}]
    body = {"model": SMALL, "max_tokens": 32_000, "tools": tools, "messages": measured(6)}
    assert up.count(body) > SMALL_WINDOW
    with (
        proxy_server(config(up)) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        raw = client.messages.with_raw_response.create(
            **body, stream=stream, extra_headers={"x-session-id": "fresh-" + str(stream)}
        )
        assert raw.http_response.status_code == 200
        assert raw.headers["x-compaction-overflow"] == "compacted"
        first, retried = sent(up)
        assert up.count(retried) + retried["max_tokens"] <= SMALL_WINDOW
        assert retried["max_tokens"] == int(raw.headers["x-compaction-max-tokens"])
        assert up.count(first) > up.count(retried)


def test_never_lowered_under_shadow_mode(up: FakeAnthropic) -> None:
    body = request(max_tokens=128_000)
    with (
        proxy_server(config(up, shadow=True)) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(**body)
        assert "x-compaction-max-tokens" not in refused.value.response.headers
        (forwarded,) = sent(up)
        assert forwarded == body  # the client's bytes, as they came
        assert lowered_metric(proxy) == (0, 0)


def test_never_lowered_to_thinkings_budget_or_under(up: FakeAnthropic) -> None:
    body = request(thinking={"type": "enabled", "budget_tokens": 31_000})
    with (
        proxy_server(config(up, max_tokens_overflow="lower")) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(**body)
        assert refused.value.response.headers["x-compaction-overflow"] == "relayed"
        assert len(sent(up)) == 1
        assert sent(up)[0]["max_tokens"] == 32_000


CHAT_WINDOW = 16_384


def chat_config(
    upstream: FakeUpstream,
    model: str,
    overflow: str = "lower",
    window: int = CHAT_WINDOW,
    **settings: Any,
) -> Any:
    data = {
        "upstreams": {"openai": {"base_url": upstream.base_url}},
        "models": [{"match": model, "context_window": window, **settings}],
        "policies": {"default": {"max_tokens_overflow": overflow}},
    }
    return loads(yaml.safe_dump(data))


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_chat_completions_lowered_before_the_first_try(limit: str) -> None:
    model = "gpt-4o-mini"  # counted exactly
    messages = [{"role": "system", "content": words(3000, 2)}, {"role": "user", "content": "Hi"}]
    body = {"model": model, limit: 128_000, "messages": messages}
    with (
        FakeUpstream(windows={model: CHAT_WINDOW}) as upstream,
        proxy_server(chat_config(upstream, model)) as proxy,
        httpx.Client() as http,
    ):
        answer = http.post(proxy.url + "/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        lowered = int(answer.headers["x-compaction-max-tokens"])
        assert lowered == room(answer.headers, CHAT_WINDOW)
        assert "x-compaction-overflow" not in answer.headers
        (forwarded,) = upstream.requests
        assert forwarded.json == {**body, limit: lowered}
        assert lowered_metric(proxy) == (1, 0)


def test_chat_completions_lowered_from_openais_own_words() -> None:
    """Estimated at a quarter of the upstream's count, the prompt leaves max_tokens too much:
    OpenAI's error says by how much."""
    model = "gpt-4o-mini"
    digits = " ".join(str(n % 10) for n in range(6000))
    body = {"model": model, "max_tokens": 16_000, "messages": [{"role": "user", "content": digits}]}
    with (
        FakeUpstream(windows={model: CHAT_WINDOW}) as upstream,
        proxy_server(chat_config(upstream, model, counting="estimate")) as proxy,
        httpx.Client() as http,
    ):
        answer = http.post(proxy.url + "/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        lowered = int(answer.headers["x-compaction-max-tokens"])
        assert answer.headers["x-compaction-overflow"] == "max_tokens"
        first, retried = upstream.requests
        assert lowered < first.json["max_tokens"] < 16_000
        assert retried.json == {**body, "max_tokens": lowered}
        assert lowered_metric(proxy) == (1, 1)


def test_chat_completions_first_overflow_sent_again_by_openais_count() -> None:
    """Claude Code's pattern against an estimated chat model, in a new session: the retry
    compacted harder asks for a max_tokens that fits beside the prompt as OpenAI counts it."""
    model, window = "gpt-4o", 8000
    messages: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    for read in range(6):
        call = {"id": f"call_{read}", "type": "function"}
        call["function"] = {"name": "read", "arguments": "{}"}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": measurements(read)},
        ]
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    with (
        FakeUpstream(windows={model: window}) as upstream,
        proxy_server(chat_config(upstream, model, window=window, counting="estimate")) as proxy,
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0) as client,
    ):
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            max_tokens=6000,
            messages=messages,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            extra_headers={"x-session-id": "fresh"},
        )
        assert raw.http_response.status_code == 200
        assert raw.headers["x-compaction-overflow"] == "compacted"
        first, retried = upstream.requests
        assert retried.json["max_tokens"] == int(raw.headers["x-compaction-max-tokens"])
        assert len(retried.json["messages"]) < len(first.json["messages"])


@pytest.mark.parametrize("policy", ["lower", "relay"])
def test_responses_lowered_before_the_first_try(policy: str) -> None:
    model = "gpt-4o-mini"
    body = {
        "model": model,
        "instructions": words(3000, 2),
        "input": "Hi",
        "max_output_tokens": 128_000,
        "store": False,
    }
    with (
        FakeUpstream(windows={model: CHAT_WINDOW}) as upstream,
        proxy_server(chat_config(upstream, model, policy)) as proxy,
        httpx.Client() as http,
    ):
        answer = http.post(proxy.url + "/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        (forwarded,) = upstream.requests
        if policy == "relay":  # the client's own
            assert "x-compaction-max-tokens" not in answer.headers
            assert forwarded.json == body
            return
        lowered = int(answer.headers["x-compaction-max-tokens"])
        assert lowered == room(answer.headers, CHAT_WINDOW)
        assert forwarded.json == {**body, "max_output_tokens": lowered}
        assert lowered_metric(proxy) == (1, 0)


def build_log(step: int) -> str:
    """A build log: a fifth more of the upstream's tokens than the proxy's estimate makes of
    it, and than of the prose before it, so a session's learnt ratio lags behind each one."""
    return "\n".join(f"[{step:02d}:{n:03d}] {words(10, step * 200 + n)} ok" for n in range(100))


def test_a_claude_code_loop_asking_128k_at_32k_goes_on_compacted(up: FakeAnthropic) -> None:
    """Claude Code's default max_tokens is 128k whatever the window: under the default policy
    the proxy reserves its usual output for it, compacts the growing loop to that budget,
    and sends each request with max_tokens lowered to what the window leaves, at once."""
    task = "Read the logs. The first:\n" + build_log(99)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    with (
        proxy_server(config(up)) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        for step in range(24):
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=128_000, system=SYSTEM, messages=messages
            )
            assert raw.http_response.status_code == 200
            assert "x-compaction-overflow" not in raw.headers
            assert int(raw.headers["x-compaction-max-tokens"]) >= 4096
            messages += [
                {"role": "assistant", "content": [{"type": "text", "text": f"Step {step}."}]},
                {"role": "user", "content": f"Log {step}:\n{build_log(step)}"},
            ]
        assert up.count({"model": MODEL, "system": SYSTEM, "messages": messages}) > WINDOW
        assert raw.headers["x-compaction-action"] in ("compacted", "degraded", "replayed")
        assert len(sent(up)) == 24  # each turn reached the upstream once
        assert lowered_metric(proxy) == (24, 0)
