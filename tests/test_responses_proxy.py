"""/v1/responses through the proxy with the real openai SDK: answers, bytes, headers, errors,
the reactive retry for both overflow forms, history held upstream and /v1/responses/compact
(over a WebSocket: test_responses_socket)."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import SDK, ConfigFactory, metric
from tests.fakes.openai import FakeUpstream, count_input_tokens, is_summary_request, reply_text
from tests.servers import ServerThread, proxy_server
from tests.test_fake_responses import sse_events
from tests.test_proxy_chat import check_compaction_headers
from tests.test_stateful import CJK

RESPONSES = "/v1/responses"
HELLO = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def test_sdk_create_forwards_the_clients_bytes(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, sdk: SDK
) -> None:
    labels = {"route": "responses", "status": "200"}
    before = metric(http, server, "compaction_proxy_requests_total", **labels)
    sent: list[httpx.Request] = []
    raw = sdk(server, sent).responses.with_raw_response.create(
        model="gpt-4o-mini", input=HELLO, instructions="Be brief.", store=False
    )
    response = raw.parse()

    body = orjson.loads(sent[-1].content)
    prompt = count_input_tokens(body)
    assert response.output_text == reply_text(prompt, "hi")
    assert response.usage is not None and response.usage.input_tokens == prompt
    (received,) = upstream.requests
    assert (received.method, received.path) == ("POST", RESPONSES)
    assert received.body == sent[-1].content
    check_compaction_headers(raw.headers)
    assert raw.headers["x-compaction-action"] == "none"
    # The proxy counts the prompt as the upstream does.
    assert int(raw.headers["x-compaction-tokens-before"]) == prompt
    assert metric(http, server, "compaction_proxy_requests_total", **labels) == before + 1


@pytest.mark.parametrize("how", ["create", "stream"])
def test_sdk_streams_arrive_whole(
    server: ServerThread, upstream: FakeUpstream, how: str, sdk: SDK
) -> None:
    client = sdk(server, [])
    if how == "create":
        events = list(client.responses.create(model="gpt-4o-mini", input="hi", stream=True))
        final = events[-1].response
    else:
        with client.responses.stream(model="gpt-4o-mini", input="hi") as stream:
            events = list(stream)
            final = stream.get_final_response()
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    prompt = count_input_tokens(upstream.requests[-1].json)
    assert final.output_text == reply_text(prompt, "hi")


VARYING = re.compile(rb'"(id|item_id|created_at|completed_at|obfuscation)":("[^"]*"|\d+)')


def test_a_stream_reaches_the_client_byte_for_byte(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    body = {"model": "gpt-4o-mini", "input": "hi", "stream": True}
    with http.stream("POST", server.url + RESPONSES, json=body) as response:
        relayed = b"".join(response.iter_raw())
        check_compaction_headers(response.headers)
        assert response.headers["content-type"].startswith("text/event-stream")
    with http.stream("POST", upstream.origin + RESPONSES, json=body) as direct:
        expected = b"".join(direct.iter_raw())
    assert [e["type"] for e in sse_events(relayed)][-1] == "response.completed"
    # The same bytes but for what differs from one answer to the next (ids, times, padding).
    assert VARYING.sub(b"", relayed) == VARYING.sub(b"", expected)


def test_bad_input_is_a_400_in_openais_shape(http: httpx.Client, server: ServerThread) -> None:
    response = http.post(server.url + RESPONSES, json={"model": "gpt-4o-mini", "input": [1]})
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "Invalid type for 'input[0]': expected an object, but got a number instead.",
            "type": "invalid_request_error",
            "param": "input[0]",
            "code": "invalid_type",
        }
    }


def test_a_current_turn_over_the_window_is_a_400_naming_input(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    words = "lorem ipsum dolor sit amet " * 2000  # ~10k tokens in an 8k window
    body = {"model": "gpt-4", "input": words, "instructions": "Be brief."}  # exact counting
    response = http.post(server.url + RESPONSES, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input")
    assert upstream.requests == []


@pytest.fixture
def estimating(proxy_config: ConfigFactory) -> Any:
    """A proxy that counts small-8k by chars/4, which CJK text fools."""
    models = [{"match": "small-8k", "context_window": 8192, "counting": "estimate"}]
    with proxy_server(proxy_config(models=models)) as server:
        yield server


def cjk_history() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for turn in range(24):
        items += [
            {"role": "user", "content": f"{turn}: {CJK * 20}"},
            {"role": "assistant", "content": "Noted."},
        ]
    return [*items, {"role": "user", "content": "Which turn was first?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_both_overflow_forms_are_retried_compacted_harder(
    estimating: ServerThread, upstream: FakeUpstream, stream: bool, sdk: SDK
) -> None:
    items = cjk_history()
    client = sdk(estimating, [])
    raw = client.responses.with_raw_response.create(model="small-8k", input=items, stream=stream)
    answer = raw.parse()
    if stream:
        events = list(answer)
        assert [e.type for e in events][-1] == "response.completed"
        assert "response.failed" not in [e.type for e in events]
    else:
        assert answer.output_text.startswith("Fake reply")
    assert raw.headers["x-compaction-action"] in ("compacted", "degraded")
    first, second = (
        r.json
        for r in upstream.requests
        if r.path == RESPONSES and not is_summary_request(r.headers, r.json)
    )
    assert first["input"] == items  # the estimate was under every level: the fake refused it
    assert len(orjson.dumps(second)) < len(orjson.dumps(first)) / 2
    assert second["input"][-1] == items[-1]


def test_history_held_upstream_goes_unchanged(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream, sdk: SDK
) -> None:
    models = [{"match": "small-8k", "context_window": 2048}]
    with proxy_server(proxy_config(models=models)) as server:
        client = sdk(server, [])
        first = client.responses.create(model="small-8k", input="Remember ORDER-1234.")
        body = {
            "model": "small-8k",
            "previous_response_id": first.id,
            "input": [{"role": "user", "content": "lorem ipsum " * 700}],  # over compact_at
        }
        response = http.post(server.url + RESPONSES, json=body)
        assert response.status_code == 200
        assert response.headers["x-compaction-action"] == "none"
        assert upstream.requests[-1].body == orjson.dumps(body)
        labels = {"dialect": "responses", "reason": "previous_response_id"}
        assert metric(http, server, "compaction_proxy_held_upstream_total", **labels) == 1
        # The upstream counted history the proxy never saw: no calibration from it.
        proxy = server.server.config.app.state.proxy
        counting = proxy.limits.limits("small-8k").counting
        key = response.headers["x-compaction-session"]
        assert proxy.compactor.calibration.ratio(key, counting) is None


def test_usage_is_counted_with_what_the_cache_served(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, sdk: SDK
) -> None:
    labels = {"dialect": "responses"}
    cached_before = metric(http, server, "compaction_proxy_cached_prompt_tokens_total", **labels)
    before = metric(http, server, "compaction_proxy_upstream_prompt_tokens_total", **labels)
    long = {"model": "gpt-4o-mini", "input": "lorem ipsum " * 800, "prompt_cache_key": "k"}
    client = sdk(server, [])
    usages = [client.responses.create(**long).usage, client.responses.create(**long).usage]
    with client.responses.stream(**long) as stream:  # usage read from the stream's tail
        usages.append(stream.get_final_response().usage)
    cached = [u.input_tokens_details.cached_tokens for u in usages if u is not None]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > 0
    # A stream's usage is counted when the relay ends, just after the client has its last event.
    deadline = time.monotonic() + 5
    after = metric(http, server, "compaction_proxy_cached_prompt_tokens_total", **labels)
    while after != cached_before + sum(cached) and time.monotonic() < deadline:
        time.sleep(0.01)
        after = metric(http, server, "compaction_proxy_cached_prompt_tokens_total", **labels)
    assert after == cached_before + sum(cached)
    total = metric(http, server, "compaction_proxy_upstream_prompt_tokens_total", **labels)
    assert total == before + sum(u.input_tokens for u in usages if u is not None)


def test_compact_is_passed_through_untouched(
    server: ServerThread, upstream: FakeUpstream, sdk: SDK
) -> None:
    sent: list[httpx.Request] = []
    compacted = sdk(server, sent).responses.compact(model="gpt-4o-mini", input=HELLO)
    assert compacted.output[-1].type == "compaction"
    assert upstream.compact_calls == 1
    assert upstream.requests[-1].path == "/v1/responses/compact"
    assert upstream.requests[-1].body == sent[-1].content


def test_codex_names_its_session(http: httpx.Client, server: ServerThread) -> None:
    def session(headers: dict[str, str], **body: Any) -> str:
        body = {"model": "gpt-4o-mini", **body}
        response = http.post(server.url + RESPONSES, json=body, headers=headers)
        return response.headers["x-compaction-session"]

    by_header = {session({"session_id": "codex-1"}, input=text) for text in ("a", "b")}
    by_key = {session({}, input=text, prompt_cache_key="codex-2") for text in ("a", "b")}
    derived = {session({}, input=text) for text in ("a", "b")}
    assert len(by_header) == len(by_key) == 1
    assert len(derived) == 2
    # The configured header comes first.
    assert session({"session_id": "codex-1", "x-session-id": "mine"}, input="a") != (
        by_header.pop()
    )


def test_the_store_down_fails_open(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream, closed_port: int
) -> None:
    config = proxy_config(store={"url": f"redis://127.0.0.1:{closed_port}/0"})
    with proxy_server(config) as server:
        response = http.post(server.url + RESPONSES, json={"model": "small-8k", "input": "hi"})
        assert response.status_code == 200
        assert response.headers["x-compaction-store"] == "unavailable"
        assert response.json()["output"][0]["content"][0]["text"].startswith("Fake reply")
