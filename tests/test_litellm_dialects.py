"""Every client to every provider through upstreams of kind litellm: the anthropic SDK
(Messages, as Claude Code speaks it) to an OpenAI-compatible server with chat completions only,
and the openai SDK (the Responses API, as Codex speaks it) to Anthropic. Long tool loops at a
16k window, answers and streams in the client's grammar, usage, errors, thinking."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from proxy.config import loads
from tests.claude_loop import MODEL as LOOP_MODEL
from tests.claude_loop import TOOLS as LOOP_TOOLS
from tests.claude_loop import ClaudeLoop
from tests.codex import SHELL, SocketCodex
from tests.conftest import metric
from tests.conversations import words
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.openai import SUMMARY_PROMPT_PREFIX, FakeUpstream, is_summary_request
from tests.servers import ServerThread, proxy_server

pytestmark = pytest.mark.litellm

WINDOW = 16_384
OPENAI_KEY = "sk-local-key-of-the-tests-0123"
ANTHROPIC_KEY = "sk-ant-key-of-the-tests-0123456789"
CLAUDE = "claude-sonnet-4-5"  # known to litellm's map: reasoning becomes thinking


def config(upstream: dict[str, Any], model: str) -> Any:
    data = {
        "upstreams": {"provider": {"kind": "litellm", **upstream}},
        "models": [{"match": model, "context_window": WINDOW}],
    }
    return loads(yaml.safe_dump(data))


@dataclasses.dataclass
class Local:
    """A chat-completions-only server, the proxy in front of it, the anthropic SDK."""

    up: FakeUpstream
    proxy: ServerThread
    sdk: anthropic.Anthropic


@dataclasses.dataclass
class OnClaude:
    """Anthropic's API, the proxy in front of it, the openai SDK."""

    up: FakeAnthropic
    proxy: ServerThread
    sdk: openai.OpenAI


@contextlib.contextmanager
def routed(fake: Any, provider: str, key: str, model: str) -> Iterator[Any]:
    """The proxy in front of `fake`, via litellm's `provider`."""
    upstream = {
        "provider_model": f"{provider}/{{model}}",
        "base_url": fake.base_url,
        "api_key": key,
    }
    with proxy_server(config(upstream, model)) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def local() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    """The proxy in front of a chat-completions-only OpenAI-compatible server, via litellm."""
    with (
        FakeUpstream(windows={LOOP_MODEL: WINDOW}, chat_only=True, api_key=OPENAI_KEY) as up,
        routed(up, "openai", OPENAI_KEY, LOOP_MODEL) as proxy,
    ):
        yield up, proxy


@pytest.fixture(scope="module")
def claude() -> Iterator[tuple[FakeAnthropic, ServerThread]]:
    """The proxy in front of Anthropic's Messages API, via litellm."""
    with (
        FakeAnthropic(windows={CLAUDE: WINDOW}, api_key=ANTHROPIC_KEY) as up,
        routed(up, "anthropic", ANTHROPIC_KEY, CLAUDE) as proxy,
    ):
        yield up, proxy


def long_session(
    up: FakeUpstream | FakeAnthropic, say: Callable[[list[Any]], tuple[str, str]]
) -> None:
    """16 turns of long user messages, each answered by `say` (the answer's text and its
    x-compaction-action) with text, compacted with no request refused."""
    up.behavior = ""
    history: list[Any] = []
    actions = []
    for turn in range(16):
        history.append({"role": "user", "content": f"Turn {turn}: {words(900, turn)}"})
        text, action = say(history)
        actions.append(action)
        history.append({"role": "assistant", "content": text})
    assert "compacted" in actions and "degraded" not in actions and up.rejected == 0


@pytest.fixture
def messages(local: tuple[FakeUpstream, ServerThread]) -> Iterator[Local]:
    """The module's server with nothing recorded and every answer a tool call."""
    up, proxy = local
    up.reset()
    up.behavior = "tool-call"
    with anthropic.Anthropic(base_url=proxy.url, api_key="sk-client", max_retries=0) as sdk:
        yield Local(up, proxy, sdk)


@pytest.fixture
def responses(claude: tuple[FakeAnthropic, ServerThread]) -> Iterator[OnClaude]:
    """The module's Anthropic with nothing recorded and every answer a tool call."""
    up, proxy = claude
    up.reset()
    up.behavior = "tool-call"
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0) as sdk:
        yield OnClaude(up, proxy, sdk)


# -- Claude Code's API to a chat-completions-only server ------------------------------------------


def test_claude_code_loop_on_a_chat_only_server(
    messages: Local,
) -> None:
    """30 turns of a tool loop with thinking, streamed and not, compacted at a 16k window:
    every request answered, every event parsed by the SDK, usage in every answer."""
    up, sdk = messages.up, messages.sdk
    loop = ClaudeLoop(sdk, "claude-on-local", thinking=True)
    turns = loop.run(30)
    assert up.rejected == 0
    assert all(t.input_tokens > 0 for t in turns)
    actions = [t.action for t in turns]
    assert "compacted" in actions and "degraded" not in actions
    # Only chat completions were asked for (litellm would use the Responses API for thinking).
    assert {r.path for r in up.requests} == {"/v1/chat/completions"}
    assert len(up.requests) == 30
    assert all("sk-client" not in json.dumps(dict(r.headers)) for r in up.requests)
    # The answers' usage calibrated the proxy's counter.
    with httpx.Client() as http:
        prompt = metric(
            http,
            messages.proxy,
            "compaction_proxy_upstream_prompt_tokens_total",
            dialect="messages",
        )
    assert prompt >= sum(t.input_tokens for t in turns)


def test_summaries_of_a_messages_session_take_the_same_route(
    messages: Local,
) -> None:
    up, sdk = messages.up, messages.sdk

    def say(history: list[Any]) -> tuple[str, str]:
        raw = sdk.messages.with_raw_response.create(
            model=LOOP_MODEL,
            max_tokens=300,
            messages=history,
            extra_headers={"X-Claude-Code-Session-Id": "summarized"},
        )
        block = raw.parse().content[0]
        assert block.type == "text"
        return block.text, raw.headers["x-compaction-action"]

    long_session(up, say)
    summaries = [r.json for r in up.requests if is_summary_request(r.headers, r.json)]
    assert summaries and all(r.path == "/v1/chat/completions" for r in up.requests)
    assert "Summary of" in json.dumps(up.requests[-1].json["messages"])


def test_messages_stream_grammar_and_usage(messages: Local) -> None:
    up, sdk = messages.up, messages.sdk
    up.behavior = ""
    with sdk.messages.stream(
        model=LOOP_MODEL, max_tokens=200, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_messages_errors_come_in_anthropics_shape(
    messages: Local,
) -> None:
    up, sdk = messages.up, messages.sdk
    up.behavior = "status:429"
    with pytest.raises(anthropic.RateLimitError) as caught:
        sdk.messages.create(
            model=LOOP_MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    up.reset()
    up.behavior = ""
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk.messages.create(
            model=LOOP_MODEL,
            max_tokens=50,
            messages=[{"role": "user", "content": "Hi"}],
            extra_body={"api_base": "http://elsewhere.invalid"},
        )
    assert "api_base" in refused.value.message
    assert up.requests == []


def test_count_tokens_is_refused_cleanly(messages: Local) -> None:
    up, sdk = messages.up, messages.sdk
    with pytest.raises(anthropic.NotFoundError) as caught:
        sdk.messages.count_tokens(model=LOOP_MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert up.requests == []


def test_an_overflow_of_the_provider_is_retried_compacted() -> None:
    """The proxy believes in a 64k window, the server has 16k: its error, in Anthropic's
    words for the client, makes the proxy compact harder and retry, unseen."""
    with FakeUpstream(windows={LOOP_MODEL: WINDOW}, chat_only=True) as up:
        upstream = {"provider_model": "openai/{model}", "base_url": up.base_url, "api_key": "k"}
        wide = loads(
            yaml.safe_dump(
                {
                    "upstreams": {"provider": {"kind": "litellm", **upstream}},
                    "models": [{"match": LOOP_MODEL, "context_window": 65_536}],
                }
            )
        )
        history: list[dict[str, Any]] = []
        for turn in range(14):
            history += [
                {"role": "user", "content": f"Turn {turn}: {words(1500, turn)}"},
                {"role": "assistant", "content": "Noted."},
            ]
        history.append({"role": "user", "content": "And now?"})
        with (
            proxy_server(wide) as proxy,
            anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0) as sdk,
        ):
            raw = sdk.messages.with_raw_response.create(
                model=LOOP_MODEL, max_tokens=100, messages=history
            )
        assert raw.parse().content[0].type == "text"
        assert raw.headers["x-compaction-action"] in ("compacted", "degraded")
        chats = [r.json for r in up.requests if not is_summary_request(r.headers, r.json)]
        assert len(chats) == 2  # refused once, then accepted compacted
        assert len(chats[1]["messages"]) < len(chats[0]["messages"])


# -- Codex's API to Anthropic ---------------------------------------------------------------------


@dataclasses.dataclass
class CodexOnClaude:
    """A Codex-like session on the Responses API: stateless, reasoning with its encrypted
    content, every output item sent back; items read from `response.output_item.done` when
    streamed, as Codex reads them."""

    client: openai.OpenAI
    session: str
    input: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    usages: list[Any] = dataclasses.field(default_factory=list)
    actions: list[str] = dataclasses.field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        return {
            "model": CLAUDE,
            "instructions": "You are Codex, a coding agent. " + words(300, 3),
            "input": self.input,
            "tools": [SHELL],
            "reasoning": {"effort": "low"},
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": self.session,
            "extra_headers": {"session_id": self.session},
        }

    def step(self, stream: bool) -> list[dict[str, Any]]:
        if stream:
            with self.client.responses.stream(**self.fields()) as events:
                kinds, done = [], []
                for event in events:
                    kinds.append(event.type)
                    if event.type == "response.output_item.done":
                        done.append(event.item.model_dump(mode="json", exclude_none=True))
                final = events.get_final_response()
                action = events._response.headers["x-compaction-action"]
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            output = done
        else:
            raw = self.client.responses.with_raw_response.create(**self.fields())
            final, action = raw.parse(), raw.headers["x-compaction-action"]
            output = [i.model_dump(mode="json", exclude_none=True) for i in final.output]
        self.usages.append(final.usage)
        self.actions.append(action)
        self.input += [{k: v for k, v in i.items() if k not in ("id", "status")} for i in output]
        for item in output:
            if item["type"] == "function_call":
                number = len(self.actions)
                result = f"FILE-{number:03d}: {words(900, number)}"
                self.input.append(
                    {"type": "function_call_output", "call_id": item["call_id"], "output": result}
                )
        return output


def test_codex_loop_on_claude(responses: OnClaude) -> None:
    """30 turns of a tool loop with reasoning, streamed and not, compacted at a 16k window:
    Anthropic's thinking signatures come back through encrypted_content, so no request is
    refused; the prompt is marked for Anthropic's cache and read from it."""
    up, sdk = responses.up, responses.sdk
    codex = CodexOnClaude(sdk, "codex-on-claude")
    codex.input.append({"role": "user", "content": "Run the tests and fix what fails."})
    for turn in range(30):
        output = codex.step(stream=turn % 2 == 1)
        reasoning = [i for i in output if i["type"] == "reasoning"]
        assert reasoning and reasoning[0]["encrypted_content"] and reasoning[0]["summary"]
        assert [i["type"] for i in output][-1] == "function_call"
    assert up.rejected == 0
    assert all(u is not None and u.input_tokens > 0 and u.output_tokens > 0 for u in codex.usages)
    assert "compacted" in codex.actions and "degraded" not in codex.actions
    chats = [r.json for r in up.requests if r.path == "/v1/messages"]
    # Each request's last assistant turn starts with its signed thinking block.
    last = [m for m in chats[-1]["messages"] if m["role"] == "assistant"][-1]
    assert last["content"][0]["type"] == "thinking" and last["content"][0]["signature"]
    cached = [u.input_tokens_details.cached_tokens for u in codex.usages]
    assert sum(1 for c in cached if c) >= 20


def test_summaries_of_a_responses_session_take_the_same_route(
    responses: OnClaude,
) -> None:
    def say(history: list[Any]) -> tuple[str, str]:
        raw = responses.sdk.responses.with_raw_response.create(
            model=CLAUDE, input=history, store=False, extra_headers={"session_id": "summarized"}
        )
        return raw.parse().output_text, raw.headers["x-compaction-action"]

    long_session(responses.up, say)
    systems = [json.dumps(r.json.get("system")) for r in responses.up.requests]
    assert any(SUMMARY_PROMPT_PREFIX in s for s in systems)
    assert "Summary of" in json.dumps(responses.up.requests[-1].json["messages"])


def test_responses_errors_come_in_openais_shape(responses: OnClaude) -> None:
    up, sdk = responses.up, responses.sdk
    up.behavior = "status:429"
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.responses.create(model=CLAUDE, input="Hi")
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "rate_limit_exceeded" and caught.value.body["message"]
    up.reset()
    up.behavior = ""
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=CLAUDE, input="Hi", extra_body={"mock_response": "x"})
    assert "mock_response" in refused.value.message
    assert up.requests == []


def test_responses_answer_text_with_usage(responses: OnClaude) -> None:
    up, sdk = responses.up, responses.sdk
    up.behavior = ""
    answer = sdk.responses.create(model=CLAUDE, input="Hello", max_output_tokens=300)
    assert answer.status == "completed" and answer.output_text.startswith("Fake reply")
    assert answer.usage is not None and answer.usage.input_tokens > 0
    (request,) = up.requests
    assert request.json["max_tokens"] == 300


def test_a_failure_mid_stream_ends_the_responses_stream_failed(responses: OnClaude) -> None:
    """Anthropic overloaded after the stream began: `response.failed` in the Responses
    grammar, and the connection drops."""
    up, sdk = responses.up, responses.sdk
    up.behavior = "error-mid-stream:4"
    kinds = []
    with (
        pytest.raises((openai.APIError, httpx.HTTPError)),
        sdk.responses.stream(model=CLAUDE, input="Stream a long answer.") as events,
    ):
        for event in events:
            kinds.append(event.type)
    assert kinds[0] == "response.created" and kinds[-1] == "response.failed"


def test_a_failure_mid_stream_ends_the_messages_stream_with_an_error(messages: Local) -> None:
    up, sdk = messages.up, messages.sdk
    up.behavior = "reset-mid-stream:3"
    kinds = []
    with (
        pytest.raises((anthropic.APIError, httpx.HTTPError)),
        sdk.messages.stream(
            model=LOOP_MODEL, max_tokens=200, messages=[{"role": "user", "content": "Stream"}]
        ) as stream,
    ):
        for event in stream:
            kinds.append(event.type)
    assert kinds[0] == "message_start" and "message_stop" not in kinds


def test_codex_over_the_websocket_on_claude(responses: OnClaude) -> None:
    """Codex's built-in provider holds its session over a WebSocket, each request continuing
    the last response: the proxy sends the whole history through litellm each time."""
    with SocketCodex(responses.proxy.url, responses.up, model=CLAUDE) as codex:  # type: ignore[arg-type]
        codex.said("Run the tests.")
        for turn in range(6):
            sent = codex.send(reasoning={"effort": "low"})
            assert sent.status == 200
            calls = [i for i in sent.output if i["type"] == "function_call"]
            reasoning = [i for i in sent.output if i["type"] == "reasoning"]
            assert calls and reasoning and reasoning[0]["encrypted_content"]
            codex.answer(f"FILE-{turn:03d}: {words(300, turn)}")
    assert responses.up.rejected == 0
    assert len(responses.up.requests) == 6


@pytest.mark.filterwarnings("ignore:The model 'claude-sonnet-4-5' is deprecated")
def test_claude_code_on_claude_through_litellm(responses: OnClaude) -> None:
    """Messages to a provider litellm passes them through to: a tool loop with thinking,
    streamed and not, its signed thinking sent back each turn; every event parsed."""
    up = responses.up
    history: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    with anthropic.Anthropic(
        base_url=responses.proxy.url, api_key="sk-client", max_retries=0
    ) as sdk:
        for turn in range(6):
            fields: dict[str, Any] = {
                "model": CLAUDE,
                "max_tokens": 2048,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "tools": LOOP_TOOLS,
                "messages": history,
            }
            if turn % 2:
                with sdk.messages.stream(**fields) as stream:
                    kinds = [event.type for event in stream]
                    message = stream.get_final_message()
                assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
            else:
                message = sdk.messages.create(**fields)
            content = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
            assert [b["type"] for b in content] == ["thinking", "tool_use"]
            assert content[0]["signature"] and message.usage.input_tokens > 0
            history += [
                {"role": "assistant", "content": content},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": content[1]["id"], "content": "ok"}
                    ],
                },
            ]
    assert up.rejected == 0 and len(up.requests) == 6


def sse_names_and_types(url: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """Each event of a stream: its SSE name, and the type its data says."""
    pairs, name = [], ""
    with httpx.Client(timeout=60) as http, http.stream("POST", url, json=body) as answer:
        for line in answer.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                pairs.append((name, json.loads(line.removeprefix("data: "))["type"]))
    return pairs


def test_responses_events_are_named_by_their_type(responses: OnClaude) -> None:
    """Through litellm's translation (to Anthropic) and its pass-through (to OpenAI's Responses
    API, whose events litellm gives with enum types), each SSE event is named by its type."""
    responses.up.behavior = ""
    body = {"model": CLAUDE, "input": "Hello", "stream": True}
    translated = sse_names_and_types(responses.proxy.url + "/v1/responses", body)
    with (
        FakeUpstream(windows={"gpt-4o": WINDOW}, api_key=OPENAI_KEY) as up,
        routed(up, "openai", OPENAI_KEY, "gpt-4o") as proxy,
    ):
        body = {"model": "gpt-4o", "input": "Hello", "stream": True}
        passed = sse_names_and_types(proxy.url + "/v1/responses", body)
        assert [r.path for r in up.requests] == ["/v1/responses"]
    for pairs in (translated, passed):
        assert pairs[0] == ("response.created", "response.created")
        assert pairs[-1] == ("response.completed", "response.completed")
        assert all(name == kind for name, kind in pairs)
