"""The rules a config's types cannot say: each reported once, naming its key and line."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, NoRoute, loads
from proxy.errors import ProxyError

MINIMAL = "upstreams:\n  fake:\n    base_url: http://127.0.0.1:8001/v1\n"
TWO_KINDS = """upstreams:
  openai: {base_url: "http://127.0.0.1:8001/v1"}
  claude: {base_url: "http://127.0.0.1:8002/v1", kind: anthropic}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as error:
        loads(text)
    return error.value.problems


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # The engine's policy checks its own rules; the config names the policy and its line.
        (
            MINIMAL + "policies:\n  default:\n    compact_at: 0.5\n",
            "policies.default (<config>, line 5): levels must satisfy 0 < target < compact_at <= 1"
            "; levels must satisfy 0 < prepare_at <= compact_at",
        ),
        (
            MINIMAL + "policies:\n  default:\n    prepare_at: 0.95\n",
            "policies.default (<config>, line 5): levels must satisfy 0 < prepare_at <= compact_at",
        ),
        (
            MINIMAL + "policies:\n  default:\n    safety_margin_tokens: -1\n",
            "policies.default (<config>, line 5): safety_margin_tokens must not be negative",
        ),
        (
            MINIMAL + "policies:\n  default:\n    anchors: ['(x']\n",
            "policies.default (<config>, line 5): anchor '(x' is not a valid regular expression: "
            "missing ), unterminated subpattern at position 0",
        ),
        (
            MINIMAL + "policies:\n  default:\n    summarizer: {request_wait_seconds: 0}\n",
            "policies.default.summarizer.request_wait_seconds (<config>, line 6): must be positive",
        ),
        (
            MINIMAL + "admin:\n  dashboard: {turns: 0}\n",
            "admin.dashboard.turns (<config>, line 5): must be between 1 and 2000",
        ),
        (
            MINIMAL + "admin:\n  dashboard: {write_seconds: 0}\n",
            "admin.dashboard.write_seconds (<config>, line 5): must be positive",
        ),
        (
            MINIMAL + "store:\n  url: ftp://x\n",
            "store.url (<config>, line 5): must start with one of memory://, redis://, rediss://, "
            "redis+cluster://, rediss+cluster://, redis+sentinel://, rediss+sentinel://",
        ),
        (
            MINIMAL + "store:\n  url: memory://host/1\n",
            "store.url (<config>, line 5): memory:// takes no host, path or options",
        ),
        (
            MINIMAL + "store:\n  url: redis://cache/x\n",
            "store.url (<config>, line 5): the path must be a database number, as in "
            "redis://host/0",
        ),
        (
            MINIMAL + "store:\n  url: redis://:pw@cache:port/0\n",
            "store.url (<config>, line 5): a port must be a number from 1 to 65535",
        ),
        (
            MINIMAL + "store:\n  key_prefix: 'cp{1}'\n",
            "store.key_prefix (<config>, line 5): must be non-empty and without braces",
        ),
    ],
)
def test_each_rule_is_reported_once(text: str, problem: str) -> None:
    assert problems(text) == [problem]


def test_unknown_policy_keys_list_the_engines_keys_too() -> None:
    (problem,) = problems(MINIMAL + "policies:\n  default:\n    summary_rol: user\n")
    assert problem.startswith("policies.default.summary_rol (<config>, line 6): unknown key")
    assert "summary_role" in problem and "summarizer" in problem and "target" in problem


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "default_upstream: {chat: openai, messages: openai}\n",
            "default_upstream.messages (<config>, line 4): upstream 'openai' is of kind openai, "
            "which serves chat, responses, not messages",
        ),
        (
            "default_upstream: {chats: openai}\n",
            "default_upstream.chats (<config>, line 4): must be one of 'chat', 'responses', "
            "'messages', got 'chats'",
        ),
        (
            "default_upstream: {chat: nope}\n",
            "default_upstream.chat (<config>, line 4): names no upstream: 'nope'",
        ),
        (
            "default_upstream: 5\n",
            "default_upstream (<config>, line 4): expected a string or a mapping, got int 5",
        ),
        (
            "default_upstream: openai\nroutes:\n  - {policy: default, upstream: openai, "
            "dialects: [messages]}\n",
            "routes[0].upstream (<config>, line 6): upstream 'openai' is of kind openai, which "
            "serves chat, responses, none of the route's dialects (messages)",
        ),
        (
            "default_upstream: openai\nroutes:\n  - {policy: default, dialects: []}\n",
            "routes[0].dialects (<config>, line 6): names no dialect (leave it out for every "
            "dialect)",
        ),
        (
            "default_upstream: openai\nroutes:\n  - {policy: default, dialects: [grpc]}\n",
            "routes[0].dialects[0] (<config>, line 6): must be one of 'chat', 'responses', "
            "'messages', got 'grpc'",
        ),
    ],
)
def test_upstreams_must_serve_what_they_are_chosen_for(text: str, problem: str) -> None:
    assert problems(TWO_KINDS + text) == [problem]


def test_an_upstream_kind_is_one_the_proxy_speaks() -> None:
    (problem,) = problems(MINIMAL + "    kind: grpc\n")
    assert problem == (
        "upstreams.fake.kind (<config>, line 4): must be one of 'openai', 'anthropic', "
        "'litellm', got 'grpc'"
    )


def test_routes_of_some_dialects_may_name_an_upstream_serving_one_of_them() -> None:
    config = loads(
        TWO_KINDS
        + "default_upstream: {chat: openai, responses: openai, messages: claude}\n"
        + "routes:\n  - {policy: default, upstream: openai, dialects: [chat, messages]}\n"
    )
    assert config.routes[0].dialects == ("chat", "messages")


def test_routing_errors_are_proxy_errors() -> None:
    assert issubclass(ConfigError, ProxyError)
    assert issubclass(NoRoute, ProxyError)
