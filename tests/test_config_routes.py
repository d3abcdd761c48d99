"""Routing: the policy and upstream of a request, by its dialect, model and policy header."""

from __future__ import annotations

import pytest

from proxy.config import DIALECTS, DIALECTS_BY_KIND, Kind, NoRoute, loads
from proxy.dialects.anthropic.messages import Messages
from proxy.dialects.openai.chat import Chat
from proxy.errors import InvalidRequest
from proxy.server import handler

ROUTED = """
upstreams:
  main: {base_url: "http://127.0.0.1:8001/v1"}
  local: {base_url: "http://127.0.0.1:8002/v1"}
  special: {base_url: "http://127.0.0.1:8003/v1"}
default_upstream: main
models:
  - {match: "local/*", upstream: local}
policies:
  default: {}
  mini: {target: 0.3}
  careful: {compact_at: 0.8, prepare_at: 0.6, target: 0.5}
routes:
  - {policy: careful, policy_header: careful}
  - {policy: mini, model: "gpt-4o-mini*"}
  - {policy: careful, model: "local/big-*", upstream: special}
"""


@pytest.mark.parametrize(
    ("model", "header", "policy", "upstream"),
    [
        ("gpt-4o", None, "default", "main"),
        ("gpt-4o-mini-2024-07-18", None, "mini", "main"),
        ("gpt-4o-mini", "careful", "careful", "main"),  # the first matching route wins
        ("gpt-4o-mini", "other", "mini", "main"),
        ("local/llama", None, "default", "local"),  # the model's upstream
        ("local/big-model", None, "careful", "special"),  # the route's upstream wins
        ("local/llama", "careful", "careful", "local"),
    ],
)
def test_routes(model: str, header: str | None, policy: str, upstream: str) -> None:
    chosen_policy, chosen_upstream = loads(ROUTED).route("chat", model, header)
    assert (chosen_policy.name, chosen_upstream.name) == (policy, upstream)


def test_a_handler_remembers_routes_for_a_bounded_number_of_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler's routes are `Config.route`'s, asked again or not, for a bounded number of
    (model, policy header) pairs; one that has none is refused each time."""
    monkeypatch.setattr(handler, "MAX_ROUTES", 4)
    config = loads(ROUTED.replace("default_upstream: main", "default_upstream: {chat: main}"))
    chat, messages = (
        handler.Handler(dialect, config, None, frozenset(), None, None, None, None)  # type: ignore[arg-type]
        for dialect in (Chat(), Messages())
    )
    asked = [(f"local/{n}", None) for n in range(6)] + [("gpt-4o-mini", "careful")] * 2
    for model, header in asked * 2:
        assert chat.route(model, header) == config.route("chat", model, header)
        assert len(chat._routes) <= 4
        with pytest.raises(InvalidRequest, match="no upstream "):
            messages.route(model, header)
        assert messages._routes == {}


DIALECTS_CONFIG = """
upstreams:
  openai: {base_url: "http://127.0.0.1:8001/v1"}
  claude: {base_url: "http://127.0.0.1:8002/v1", kind: anthropic}
  azure: {base_url: "http://127.0.0.1:8003/v1"}
default_upstream: {chat: openai, responses: openai, messages: claude}
models:
  - {match: "gpt-4o*", upstream: azure}
policies:
  default: {}
  anthropic: {target: 0.5}
  careful: {target: 0.4}
routes:
  - {policy: anthropic, dialects: [messages]}
  - {policy: careful, policy_header: careful, upstream: openai}
"""


@pytest.mark.parametrize(
    ("dialect", "model", "header", "policy", "upstream"),
    [
        ("chat", "o3", None, "default", "openai"),  # the dialect's default upstream
        ("responses", "o3", None, "default", "openai"),
        ("chat", "gpt-4o", None, "default", "azure"),  # the model's upstream
        ("messages", "claude-sonnet-4", None, "anthropic", "claude"),  # a route by dialect
        ("messages", "claude-sonnet-4", "careful", "anthropic", "claude"),
        ("chat", "o3", "careful", "careful", "openai"),
        ("responses", "gpt-4o", "careful", "careful", "openai"),  # the route's upstream wins
    ],
)
def test_routes_by_dialect(
    dialect: str, model: str, header: str | None, policy: str, upstream: str
) -> None:
    chosen_policy, chosen_upstream = loads(DIALECTS_CONFIG).route(dialect, model, header)
    assert (chosen_policy.name, chosen_upstream.name) == (policy, upstream)
    assert chosen_upstream.serves(dialect)


def test_a_route_whose_upstream_cannot_serve_the_dialect_is_passed_over() -> None:
    config = loads(
        DIALECTS_CONFIG.replace(
            "routes:\n", "routes:\n  - {policy: careful, model: 'claude*', upstream: openai}\n"
        )
    )
    policy, upstream = config.route("messages", "claude-sonnet-4", None)
    assert (policy.name, upstream.name) == ("anthropic", "claude")


@pytest.mark.parametrize(
    ("config", "dialect", "model", "message"),
    [
        (
            DIALECTS_CONFIG,
            "messages",
            "gpt-4o",
            "no upstream serves messages requests for model 'gpt-4o': its upstream is of kind "
            "openai, which serves chat, responses",
        ),
        (
            "upstreams:\n  one: {base_url: 'http://127.0.0.1:8001/v1'}\n",
            "messages",
            "claude-sonnet-4",
            "no upstream serves messages requests for model 'claude-sonnet-4': its upstream is "
            "of kind openai, which serves chat, responses",
        ),
        (
            DIALECTS_CONFIG.replace(", messages: claude}", "}"),
            "messages",
            "claude-sonnet-4",
            "no upstream is configured for messages requests",
        ),
    ],
)
def test_no_route_when_the_chosen_upstream_cannot_serve_the_dialect(
    config: str, dialect: str, model: str, message: str
) -> None:
    with pytest.raises(NoRoute) as error:
        loads(config).route(dialect, model, None)
    assert str(error.value) == message


def test_every_kind_serves_known_dialects() -> None:
    kinds = set(Kind.__args__)  # type: ignore[attr-defined]
    assert kinds <= set(DIALECTS_BY_KIND)
    assert all(d in DIALECTS for served in DIALECTS_BY_KIND.values() for d in served)
