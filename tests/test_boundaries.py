"""What must never cross a boundary: a guessed budget into the session's stored plan, a client
path out of the upstream's base URL, a client's credential to an upstream it did not call, a
request's own max_tokens into a plan that strips the session."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.conftest import ConfigFactory, config_for, merged
from tests.fakes.openai import SUMMARY_HEADER, FakeUpstream
from tests.servers import proxy_server

CHAT = "/v1/chat/completions"


def chat(turns: int, size: int = 60) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages += [
            {"role": "user", "content": f"My name is Bob, turn {turn}. " + "word " * size},
            {"role": "assistant", "content": f"Noted {turn}."},
        ]
    return [*messages, {"role": "user", "content": "What is my name?"}]


def test_a_guessed_window_that_fits_nothing_forwards_as_is_and_stores_nothing(
    upstream: FakeUpstream, proxy_config: ConfigFactory, http: httpx.Client
) -> None:
    # An unknown model: counted by estimate, in the default 8192-token window, while the real
    # upstream has far more. max_tokens alone takes the whole guessed window.
    config = proxy_config(default_context_window=8192)
    messages = chat(8)
    with proxy_server(config) as server:
        body = {"model": "llama3-local", "messages": messages, "max_tokens": 8192}
        first = http.post(server.url + CHAT, json=body, headers={"X-Session-Id": "guess"})
        assert first.status_code == 200
        assert first.headers["x-compaction-action"] == "none"
        assert upstream.requests[-1].json["messages"] == messages
        # Nothing was stored: the next turn of the session is not stripped by that guess.
        body = {"model": "llama3-local", "messages": messages}
        second = http.post(server.url + CHAT, json=body, headers={"X-Session-Id": "guess"})
        assert second.headers["x-compaction-action"] == "none"
        assert upstream.requests[-1].json["messages"] == messages


def test_passthrough_paths_stay_below_the_base_url(
    upstream: FakeUpstream, server: object, http: httpx.Client
) -> None:
    url = server.url  # type: ignore[attr-defined]
    for path in ("/v1/%2e%2e/internal/admin", "/v1/models/%2E%2E/%2e%2e/x", "/v1/%2e/models"):
        response = http.send(http.build_request("GET", url + path))
        assert response.status_code == 404, path
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []
    # Encoded characters reach the upstream as the client encoded them.
    http.send(http.build_request("GET", url + "/v1/files/a%2Fb"))
    http.send(http.build_request("GET", url + "/v1/models%3Fx=1"))
    paths = [(r.path, r.query) for r in upstream.requests]
    assert paths == [("/v1/files/a%2Fb", ""), ("/v1/models%3Fx=1", "")]


@pytest.mark.parametrize(
    "path", ["/v1/..;/admin", "/v1/models;x=1", "/v1/%3B/x", "/v1/..\\admin", "/v1/a%5Cb"]
)
def test_passthrough_paths_with_a_backslash_or_a_semicolon_are_refused(
    upstream: FakeUpstream, server: object, http: httpx.Client, path: str
) -> None:
    """Servers read them differently (`\\` as `/`, `;` as the start of parameters): `..;/`
    and `..\\` could go up a level behind the upstream's base URL."""
    url = server.url  # type: ignore[attr-defined]
    response = http.send(http.build_request("GET", url + path))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert upstream.requests == []


def test_the_clients_credential_never_goes_to_another_summarizer_upstream(
    upstream: FakeUpstream, http: httpx.Client
) -> None:
    with FakeUpstream(windows={"small-8k": 8192}) as other:
        config = config_for(
            upstream,
            **merged(
                {"upstreams": {"other": {"base_url": other.base_url}}},
                {
                    "default_upstream": "fake",
                    "policies": {"default": {"summarizer": {"upstream": "other"}}},
                },
            ),
        )
        with proxy_server(config) as server:
            body = {"model": "small-8k", "messages": chat(60)}
            headers = {"Authorization": "Bearer sk-client-secret", "X-Session-Id": "cred"}
            response = http.post(server.url + CHAT, json=body, headers=headers)
            assert response.status_code == 200
            assert response.headers["x-compaction-action"] in ("compacted", "degraded")
        summaries = [r for r in other.requests if r.headers.get(SUMMARY_HEADER)]
        assert summaries, "the summary went to the configured summarizer upstream"
        for request in summaries:
            assert "sk-client-secret" not in str(list(request.headers.items()))
        assert all(
            r.headers.get("authorization") == "Bearer sk-client-secret" for r in upstream.requests
        )


@pytest.mark.parametrize("max_tokens", [0, -5, 7600, 8192])
def test_a_max_tokens_that_leaves_no_room_never_strips_the_session(
    upstream: FakeUpstream, server: object, http: httpx.Client, max_tokens: int
) -> None:
    # gpt-4: an 8192-token window counted exactly. The history (~1,600 tokens) is far below
    # the compaction level of an ordinary request, and far above the 336 tokens that a
    # max_tokens of 7600 would leave.
    url = server.url + CHAT  # type: ignore[attr-defined]
    messages = chat(16)
    headers = {"X-Session-Id": f"max-tokens-{max_tokens}", "content-type": "application/json"}
    raw = orjson.dumps({"model": "gpt-4", "messages": messages, "max_tokens": max_tokens})
    first = http.post(url, content=raw, headers=headers)
    assert first.headers["x-compaction-action"] == "none"
    if max_tokens > 0:
        # Prompt and output over the window: forwarded once, with max_tokens lowered to what
        # the window leaves (max_tokens_overflow: lower, the default), the history whole.
        lowered = upstream.requests[-1]
        assert lowered.json == {**orjson.loads(raw), "max_tokens": lowered.json["max_tokens"]}
        assert first.status_code == 200 and "x-compaction-overflow" not in first.headers
        assert int(first.headers["x-compaction-max-tokens"]) == lowered.json["max_tokens"]
    else:
        assert upstream.requests[-1].body == raw  # forwarded as it came, for the upstream
    # The next turn, with room again: the whole history, no plan made for that request.
    second = http.post(url, json={"model": "gpt-4", "messages": messages}, headers=headers)
    assert second.status_code == 200
    assert second.headers["x-compaction-action"] == "none"
    assert upstream.requests[-1].json["messages"] == messages


def test_one_callers_failing_summaries_never_stop_anothers(
    upstream: FakeUpstream, server: object, http: httpx.Client
) -> None:
    # The caller's own credential goes to the summarizer: a wrong one fails every summary of
    # that caller, and trips the summarizer's breaker for that caller alone.
    url = server.url + CHAT  # type: ignore[attr-defined]
    upstream.api_key = "sk-right"
    body = {"model": "small-8k", "messages": chat(60)}
    wrong = {"Authorization": "Bearer sk-wrong", "X-Session-Id": "breaker-a"}
    assert http.post(url, json=body, headers=wrong).status_code == 401
    assert upstream.summary_calls == 0  # refused before the summarizer saw them
    right = {"Authorization": "Bearer sk-right", "X-Session-Id": "breaker-b"}
    answer = http.post(url, json=body, headers=right)
    assert answer.status_code == 200
    assert answer.headers["x-compaction-action"] == "compacted"
    assert upstream.summary_calls > 0
