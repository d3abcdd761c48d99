"""Upstreams of kind litellm: the OpenAI SDK against the proxy, litellm against strict fakes of
Anthropic Messages and of Gemini on loopback. Answers, streams, tool calls, errors."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import metric
from tests.litellm_fakes import (
    ANTHROPIC_KEY,
    CLAUDE,
    GEMINI,
    GEMINI_KEY,
    Providers,
    fixtures,
    providers,
)
from tests.test_proxy_chat import WEATHER

pytestmark = pytest.mark.litellm

MODELS = [CLAUDE, GEMINI]

shared, p = fixtures()


def sent(p: Providers, model: str) -> list[Any]:
    """What the provider of `model` received: its requests' JSON bodies."""
    fake = p.anthropic if model == CLAUDE else p.gemini
    return [r.json for r in fake.requests]


def test_chat_completion_through_anthropic(p: Providers) -> None:
    raw = p.client().chat.completions.with_raw_response.create(
        model=CLAUDE,
        messages=[
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Hello there"},
        ],
        metadata={"session_id": "litellm-hello"},
        user="user-7",
    )
    reply = raw.parse()
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content.startswith("Fake reply to ")
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert raw.headers["x-compaction-action"] == "none"
    (request,) = p.anthropic.requests
    assert request.path == "/v1/messages"
    # The upstream's own key, never the client's; the model as the route names it.
    assert ANTHROPIC_KEY in (request.headers.get("x-api-key"), request.headers.get("authorization"))
    assert "sk-client-key" not in str(dict(request.headers))
    body = request.json
    assert body["model"] == CLAUDE
    system = body["system"]
    assert (system if isinstance(system, str) else system[0]["text"]) == "Be terse."
    # No max_tokens from the client: the output the proxy reserved (a quarter of 8k).
    assert body["max_tokens"] == 2048


@pytest.mark.parametrize("model", MODELS)
def test_max_tokens_and_options_reach_the_provider(p: Providers, model: str) -> None:
    p.client().chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        max_completion_tokens=77,
        temperature=0.2,
        stop=["\n\n"],
    )
    (body,) = sent(p, model)
    if model == CLAUDE:
        assert (body["max_tokens"], body["temperature"], body["stop_sequences"]) == (
            77,
            0.2,
            ["\n\n"],
        )
    else:
        config = body.get("generationConfig") or body["generation_config"]
        assert config.get("max_output_tokens", config.get("maxOutputTokens")) == 77


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_round_trip(p: Providers, model: str, stream: bool) -> None:
    client = p.client()
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = _ask(client, model, messages, stream, tools=[WEATHER], tool_choice="required")
    assert call["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "city" in json.loads(call["tool_calls"][0]["function"]["arguments"])
    messages.append(call)
    result = call["tool_calls"][0]["id"]
    messages.append({"role": "tool", "tool_call_id": result, "content": "Sunny, 21 C."})
    answer = _ask(client, model, messages, stream, tools=[WEATHER])
    assert answer["content"] and "Fake" in answer["content"]
    # The strict fakes checked the pairing: the call and its result went back as theirs.
    last = sent(p, model)[-1]
    assert "tool_result" in json.dumps(last) or "function_response" in json.dumps(last)


def _ask(
    client: openai.OpenAI, model: str, messages: list[Any], stream: bool, **fields: Any
) -> dict[str, Any]:
    """The assistant message of one answer, assembled from the stream when streamed."""
    if not stream:
        reply = client.chat.completions.create(model=model, messages=messages, **fields)
        return reply.choices[0].message.model_dump(exclude_none=True)
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(
        model=model, messages=messages, stream=True, **fields
    ):
        for choice in chunk.choices:
            message["content"] += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    delta.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
        message["content"] = message["content"] or None
    return message


def sse_events(p: Providers, body: dict[str, Any]) -> tuple[list[bytes], Exception | None]:
    """The `data:` payloads of a streamed answer, read raw, and how the stream ended."""
    events: list[bytes] = []
    ended: Exception | None = None
    headers = {"Authorization": "Bearer sk-client-key"}
    url = p.proxy.url + "/v1/chat/completions"
    with httpx.Client(timeout=30) as http:
        try:
            with http.stream("POST", url, json=body, headers=headers) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:].encode())
        except httpx.HTTPError as exc:
            ended = exc
    return events, ended


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("usage", [False, True])
def test_stream_ends_in_one_done_with_usage_only_when_asked(
    p: Providers, model: str, usage: bool
) -> None:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Stream please"}],
        "stream": True,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    events, ended = sse_events(p, body)
    assert ended is None
    assert events[-1] == b"[DONE]" and events.count(b"[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.startswith("Fake")
    with_usage = [c for c in chunks if c.get("usage")]
    if usage:
        assert len(with_usage) == 1 and with_usage[0]["usage"]["prompt_tokens"] > 0
    else:
        assert with_usage == []


def test_image_and_json_mode_reach_anthropic(p: Providers) -> None:
    pixel = base64.b64encode(bytes.fromhex(_PNG)).decode()
    reply = p.client().chat.completions.create(
        model=CLAUDE,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe this"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{pixel}"}},
                ],
            }
        ],
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].message is not None
    (body,) = sent(p, CLAUDE)
    blocks = body["messages"][0]["content"]
    assert any(b["type"] == "image" and b["source"]["data"] == pixel for b in blocks)


_PNG = (
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


def test_client_cannot_set_litellm_arguments(p: Providers) -> None:
    """Only chat completions fields reach litellm: no other api_base, key or mock answer."""
    for field, value in [
        ("api_base", "http://127.0.0.1:9/"),
        ("mock_response", "hi"),
        ("api_key", "x"),
    ]:
        with pytest.raises(openai.BadRequestError) as caught:
            p.client().chat.completions.create(
                model=CLAUDE,
                messages=[{"role": "user", "content": "Hi"}],
                extra_body={field: value},
            )
        assert field in caught.value.message
    assert p.anthropic.requests == []


def test_other_paths_answer_404_in_openais_shape(p: Providers) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        p.client().models.list()
    assert "serves only POST /v1/chat/completions" in caught.value.message
    assert caught.value.body["code"] == "not_found"  # type: ignore[index]


@pytest.mark.parametrize(
    ("behavior", "error", "code"),
    [
        ("status:400", openai.BadRequestError, None),
        ("status:401", openai.AuthenticationError, "invalid_api_key"),
        ("status:403", openai.PermissionDeniedError, "permission_denied"),
        ("status:404", openai.NotFoundError, "model_not_found"),
        ("status:429", openai.RateLimitError, "rate_limit_exceeded"),
        ("status:500", openai.InternalServerError, None),
    ],
)
def test_provider_errors_are_mapped(
    p: Providers, behavior: str, error: type[openai.APIStatusError], code: str | None
) -> None:
    p.anthropic.behavior = behavior
    with pytest.raises(error) as caught:
        p.client().chat.completions.with_raw_response.create(
            model=CLAUDE, messages=[{"role": "user", "content": "Hi"}]
        )
    exc = caught.value
    assert exc.body["code"] == code  # type: ignore[index]
    assert "Traceback" not in exc.message and "litellm." not in exc.message
    if behavior == "status:429":
        assert exc.response.headers["retry-after"] == "1"


def test_a_rejected_key_never_shows_in_the_message(p: Providers) -> None:
    p.anthropic.api_key = "another-key"
    with pytest.raises(openai.AuthenticationError) as caught:
        p.client().chat.completions.create(
            model=CLAUDE, messages=[{"role": "user", "content": "Hi"}]
        )
    assert ANTHROPIC_KEY not in caught.value.message
    assert ANTHROPIC_KEY not in caught.value.response.text


def test_gemini_errors_are_mapped(p: Providers) -> None:
    p.gemini.behavior = "status:429"
    with pytest.raises(openai.RateLimitError):
        p.client().chat.completions.create(
            model=GEMINI, messages=[{"role": "user", "content": "Hi"}]
        )
    p.gemini.behavior = ""
    p.gemini.api_key = "another-key"
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            p.client().chat.completions.create(
                model=GEMINI, messages=[{"role": "user", "content": "Hi"}]
            )
        assert caught.value.status_code in (400, 401)
        assert GEMINI_KEY not in caught.value.response.text
    finally:
        p.gemini.api_key = GEMINI_KEY


@pytest.mark.parametrize("model", MODELS)
def test_a_failure_mid_stream_ends_with_an_error_event_and_no_done(
    p: Providers, model: str
) -> None:
    fake = p.anthropic if model == CLAUDE else p.gemini
    fake.behavior = "error-mid-stream:4" if model == CLAUDE else "error-mid-stream"
    body = {"model": model, "messages": [{"role": "user", "content": "Stream"}], "stream": True}
    events, ended = sse_events(p, body)
    assert b"[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["message"] and "Traceback" not in error["message"]
    assert ended is not None  # the connection drops: nothing looks complete
    with httpx.Client() as http:
        assert metric(http, p.proxy, "compaction_proxy_upstream_errors_total", kind="broken_stream")


def test_unreachable_and_silent_providers(p: Providers) -> None:
    unreachable = {"kind": "litellm", "provider_model": "anthropic/{model}"}
    silent = {**unreachable, "timeouts": {"first_byte": 1}}
    with providers(
        upstreams={
            "down": {**unreachable, "base_url": "http://127.0.0.1:9", "api_key": "k"},
            "silent": {**silent, "base_url": p.anthropic.base_url, "api_key": ANTHROPIC_KEY},
        },
        routes=[
            {"model": "down-*", "policy": "default", "upstream": "down"},
            {"model": "claude-*", "policy": "default", "upstream": "silent"},
        ],
    ) as other:
        with pytest.raises(openai.APIStatusError) as caught:
            other.client().chat.completions.create(
                model="down-model", messages=[{"role": "user", "content": "Hi"}]
            )
        assert caught.value.status_code == 502
        assert caught.value.body["code"] == "upstream_unreachable"  # type: ignore[index]
        p.anthropic.behavior = "hang"
        with pytest.raises(openai.APIStatusError) as caught:
            other.client().chat.completions.create(
                model=CLAUDE, messages=[{"role": "user", "content": "Hi"}]
            )
        assert caught.value.status_code == 504


def test_a_client_gone_mid_stream_closes_the_providers_stream(p: Providers) -> None:
    p.anthropic.behavior = "slow-stream:0.3"
    body = {"model": CLAUDE, "messages": [{"role": "user", "content": "Stream"}], "stream": True}
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", p.proxy.url + "/v1/chat/completions", json=body) as response,
    ):
        assert next(response.iter_lines()).startswith("data: ")
    # litellm's stream is closed with the client's, and with it the provider's connection.
    assert p.anthropic.wait_for(lambda: p.anthropic.cancelled >= 1, timeout=5)
