"""An upstream overflow that the request's max_tokens caused: the prompt fits the window, the
prompt and the output it reserves do not (`17987 + 32000 > 32768`), and no compaction can
make room beside so large an output (the system prompt alone is over what it leaves).

The proxy never sends the same body twice: it relays the upstream's error as it came (which
Claude Code parses to lower max_tokens by itself), or, under `max_tokens_overflow: lower`,
sends it again with max_tokens lowered to what the window leaves (above extended thinking's
budget). No summary is asked for a target that small."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
import yaml

from proxy.config import loads
from tests.conftest import merged, metric
from tests.conversations import words
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.openai import FakeUpstream
from tests.servers import proxy_server

MODEL = "claude-32k"
WINDOW = 32_768
KEY = "sk-ant-api03-test"
SYSTEM = "You are a careful build engineer. " + words(2500, 1)  # ~3k tokens: over what is left


def config(up: FakeAnthropic, **policy: Any) -> Any:
    data = {
        "upstreams": {"claude": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
        "models": [{"match": MODEL, "context_window": WINDOW}],
    }
    return loads(yaml.safe_dump(merged(data, {"policies": {"default": policy}} if policy else {})))


@pytest.fixture(scope="module")
def up() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(windows={MODEL: WINDOW}) as fake:
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


def test_lowered_under_the_policy_and_said_so(up: FakeAnthropic) -> None:
    body = request()
    prompt = up.count(body)
    with (
        proxy_server(config(up, max_tokens_overflow="lower")) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        raw = client.messages.with_raw_response.create(**body)
        assert raw.parse().content[0].text.startswith("Fake reply")
        assert raw.headers["x-compaction-overflow"] == "max_tokens"
        assert raw.headers["x-compaction-max-tokens"] == str(WINDOW - prompt)
        first, retried = sent(up)
        assert first["max_tokens"] == 32_000 and retried["max_tokens"] == WINDOW - prompt
        assert {**retried, "max_tokens": 32_000} == first  # nothing else changed
        with httpx.Client() as http:
            retries = metric(
                http, proxy, "compaction_proxy_upstream_retries_total", reason="max_tokens"
            )
            assert retries == 1


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
    up.reset()
    body = request(thinking={"type": "enabled", "budget_tokens": 4096})
    with (
        proxy_server(config(up, max_tokens_overflow="lower")) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        raw = client.messages.with_raw_response.create(**body)
        assert int(raw.headers["x-compaction-max-tokens"]) > 4096
        assert sent(up)[-1]["thinking"] == {"type": "enabled", "budget_tokens": 4096}


def test_chat_completions_lowered_from_openais_own_words() -> None:
    model = "gpt-4o-mini"
    with FakeUpstream(windows={model: 16_384}) as upstream:
        chat_lowered(upstream, model)


def chat_lowered(upstream: FakeUpstream, model: str) -> None:
    data = {
        "upstreams": {"openai": {"base_url": upstream.base_url}},
        "models": [{"match": model, "context_window": 16_384}],
        "policies": {"default": {"max_tokens_overflow": "lower"}},
    }
    messages = [{"role": "system", "content": words(3000, 2)}, {"role": "user", "content": "Hi"}]
    body = {"model": model, "max_tokens": 16_000, "messages": messages}
    with proxy_server(loads(yaml.safe_dump(data))) as proxy, httpx.Client() as http:
        answer = http.post(proxy.url + "/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        lowered = int(answer.headers["x-compaction-max-tokens"])
        assert lowered < 16_000 and answer.headers["x-compaction-overflow"] == "max_tokens"
        assert upstream.requests[-1].json == {**body, "max_tokens": lowered}


def test_a_claude_code_loop_asking_128k_at_32k_goes_on_compacted(up: FakeAnthropic) -> None:
    """Claude Code's default max_tokens is 128k whatever the window: under the default policy
    the proxy reserves its usual output for it, compacts the growing loop to that budget,
    and sends each request with max_tokens lowered to what the window leaves."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the logs. " + words(50, 3)}]
    with (
        proxy_server(config(up)) as proxy,
        anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=60) as client,
    ):
        for step in range(24):
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=128_000, system=SYSTEM, messages=messages
            )
            assert raw.http_response.status_code == 200
            assert raw.headers["x-compaction-overflow"] == "max_tokens"
            assert int(raw.headers["x-compaction-max-tokens"]) >= 4096
            messages += [
                {"role": "assistant", "content": [{"type": "text", "text": f"Step {step}."}]},
                {"role": "user", "content": f"Log {step}: {words(1200, step)}"},
            ]
        assert up.count({"model": MODEL, "system": SYSTEM, "messages": messages}) > WINDOW
        assert raw.headers["x-compaction-action"] in ("compacted", "degraded", "replayed")
