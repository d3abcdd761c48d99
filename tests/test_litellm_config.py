"""Upstreams of kind litellm in the config: their rules, secrets, the provider check, the
model names windows are looked up by, the documented examples; and what a request may pass
to litellm (properties over random requests)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
from proxy.config import PROVIDER_PARAMS, ConfigError, loads
from proxy.errors import InvalidRequest
from proxy.models.limits import ModelLimits
from proxy.tools.cli import main
from proxy.upstream.litellm_chat import cache_marked
from proxy.upstream.litellm_responses import cache_marked_input
from proxy.upstream.litellm_setup import check_providers
from proxy.upstream.litellm_transport import ROUTES, LiteLLMTransport
from tests.conftest import examples
from tests.conversations import unmarked, words
from tests.litellm_fakes import python

pytestmark = pytest.mark.litellm

ROOT = Path(__file__).resolve().parent.parent
CLAUDE = """upstreams:
  claude:
    kind: litellm
    provider_model: anthropic/{model}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as error:
        loads(text)
    return error.value.problems


def test_base_url_is_optional_for_litellm_only() -> None:
    assert loads(CLAUDE).upstreams["claude"].base_url == ""
    assert problems("upstreams:\n  openai: {kind: openai}\n") == [
        "upstreams.openai.base_url: is required"
    ]
    assert problems(CLAUDE + "    base_url: not-a-url\n") == [
        "upstreams.claude.base_url (<config>, line 5): must be an http:// or https:// URL"
    ]


def test_provider_settings_are_for_litellm_upstreams_only() -> None:
    found = problems(
        "upstreams:\n  openai:\n    base_url: https://api.openai.com/v1\n"
        "    provider_model: x\n    provider_params: {vertex_project: p}\n    prompt_cache: true\n"
    )
    assert [p.split(" (")[0] for p in found] == [
        "upstreams.openai.prompt_cache",
        "upstreams.openai.provider_model",
        "upstreams.openai.provider_params",
    ]
    assert all(p.endswith("only for upstreams of kind litellm") for p in found)


def test_provider_params_are_the_providers_settings() -> None:
    found = problems(CLAUDE + "    provider_params: {aws_regoin_name: x, api_key: k}\n")
    assert found[0].startswith("upstreams.claude.provider_params.api_key")
    assert found[0].endswith("not a provider setting (set it as the upstream's api_key)")
    assert found[1].startswith("upstreams.claude.provider_params.aws_regoin_name")
    assert "known: api_version, aws_access_key_id" in found[1]
    assert problems(CLAUDE + "    provider_params: {aws_region_name: 3}\n") == [
        "upstreams.claude.provider_params.aws_region_name (<config>, line 5): "
        "expected a string, got int 3"
    ]


@pytest.mark.parametrize("template", ["anthropic/{name}", "anthropic/ {model}", "", "a}b"])
def test_a_provider_model_is_a_name_with_model_as_its_only_placeholder(template: str) -> None:
    (problem,) = problems(CLAUDE.replace("anthropic/{model}", repr(template)))
    assert problem.startswith("upstreams.claude.provider_model")
    assert problem.endswith("{model} stands for the request's model")


def test_a_models_provider_model_needs_a_litellm_upstream() -> None:
    text = CLAUDE + "  openai: {base_url: 'https://api.openai.com/v1'}\ndefault_upstream: claude\n"
    loads(text + "models:\n  - {match: sonnet, provider_model: anthropic/claude-sonnet-4-5}\n")
    (problem,) = problems(text + "models:\n  - {match: x, upstream: openai, provider_model: y}\n")
    assert problem.endswith("only for models sent to an upstream of kind litellm")


def test_litellm_upstreams_always_hold_credentials() -> None:
    """They never take the client's credential, so they may spend the environment's."""
    (problem,) = problems(CLAUDE + "listen: {host: 0.0.0.0}\n")
    assert problem.startswith("auth: upstream 'claude' holds its own credentials and the proxy")
    sha = "a" * 64
    keys = f"auth:\n  keys: [{{id: team, sha256: {sha}}}]\n"
    loads(CLAUDE + "listen: {host: 0.0.0.0}\n" + keys)  # Authorization may hold the proxy key


def test_secret_provider_settings_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CP_TEST_AWS_SECRET", "aws-secret-123456")
    config = loads(
        CLAUDE
        + "    api_key: sk-ant-secret-1\n"
        + "    provider_params: {aws_secret_access_key: '${CP_TEST_AWS_SECRET}',"
        + " aws_region_name: eu-west-1}\n"
        + "  openai: {base_url: 'https://api.openai.com/v1'}\ndefault_upstream: claude\n"
    )
    masked = config.masked()["upstreams"]
    assert masked["claude"]["api_key"] == "***"
    assert masked["claude"]["provider_params"] == {
        "aws_secret_access_key": "***",
        "aws_region_name": "eu-west-1",
    }
    assert "provider_params" not in masked["openai"]
    assert "aws-secret-123456" not in orjson.dumps(config.masked()).decode()


def test_an_unknown_provider_fails_the_check() -> None:
    config = loads(
        CLAUDE.replace("anthropic/", "anthropc/")
        + "  any: {kind: litellm}\n  self: {kind: litellm, provider_model: '{model}'}\n"
        + "default_upstream: claude\n"
        + "models:\n  - {match: sonnet, upstream: claude, provider_model: gemini/gemini-2.5-pro}\n"
    )
    with pytest.raises(ConfigError) as error:
        check_providers(config)
    assert error.value.problems == [
        "upstreams.claude.provider_model: litellm knows no provider for 'anthropc/{model}'"
    ]
    check_providers(loads(CLAUDE))


def test_check_config_names_an_unknown_provider(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(CLAUDE.replace("anthropic/", "anthropc/"))
    assert main(["check-config", str(file)]) == 2
    assert "litellm knows no provider for 'anthropc/{model}'" in capsys.readouterr().err


def test_windows_are_looked_up_under_the_providers_name() -> None:
    config = loads(
        CLAUDE
        + "  azure: {kind: litellm, provider_model: 'azure/{model}'}\ndefault_upstream: claude\n"
        + "models:\n  - {match: sonnet, provider_model: anthropic/claude-sonnet-4-5}\n"
        + "  - {match: fast, upstream: azure, provider_model: azure/gpt-4o}\n"
    )
    limits = ModelLimits(config)
    claude, azure = config.upstreams["claude"], config.upstreams["azure"]
    assert limits.limits("sonnet", claude).window == 200_000
    assert limits.limits("claude-sonnet-4-5", claude).window == 200_000
    assert limits.limits("sonnet", claude).counter.mode == "estimate"
    assert limits.limits("fast", azure).window == 128_000
    assert limits.limits("fast", azure).counter.name == "o200k_base"
    assert limits.limits("sonnet").window == config.default_context_window


@pytest.mark.parametrize(
    "heading",
    [
        "A worked example per provider family:",
        "**Claude Code on another provider**",
        "**Codex on Claude.**",
    ],
)
def test_the_documented_examples_are_valid(monkeypatch: pytest.MonkeyPatch, heading: str) -> None:
    docs = (ROOT / "docs/config.md").read_text()
    example = docs.split(heading)[1].split("```yaml\n")[1]
    example = example.split("```")[0]
    for name in set(re.findall(r"\$\{([A-Z_]+)\}", example)):
        monkeypatch.setenv(name, f"value-of-{name.lower()}")
    config = loads(example)
    assert {u.kind for u in config.upstreams.values()} == {"litellm"}
    check_providers(config)


@pytest.mark.subprocess
def test_a_config_without_litellm_does_not_import_it() -> None:
    code = (
        "import sys\n"
        "from proxy.server.app import create_app\n"
        "from proxy.config import loads\n"
        "app = create_app(loads('upstreams: {o: {base_url: \"http://127.0.0.1:9/v1\"}}'))\n"
        "print('litellm' in sys.modules)\n"
    )
    result = python(code, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


# -- what reaches litellm -------------------------------------------------------------------------

TRANSPORT = LiteLLMTransport(loads(CLAUDE + "    api_key: k\n"), policies.HEADINGS)
UPSTREAM = TRANSPORT.config.upstreams["claude"]
FIXED = {"model", "api_key", "api_base", "timeout", "num_retries", "max_retries", "drop_params"}
values = st.none() | st.booleans() | st.integers(0, 10) | st.text(max_size=5)
# Each API's conversation, and what the proxy itself adds for it.
CONVERSATIONS = {
    "/chat/completions": ("messages", set()),
    "/messages": ("messages", set()),
    "/responses": ("input", {"store", "cache_control_injection_points"}),
}
# The output cap each API names, and whether the proxy fills it in from the reserved output.
CAPS = {
    "/chat/completions": "max_tokens",
    "/messages": "max_tokens",
    "/responses": "max_output_tokens",
}


@pytest.mark.parametrize("path", sorted(ROUTES))
@given(data=st.data(), reserved=st.none() | st.integers(1, 9000))
@settings(max_examples=examples(60))
def test_only_the_apis_own_fields_reach_litellm(path: str, data: Any, reserved: Any) -> None:
    route = ROUTES[path]
    conversation, added = CONVERSATIONS[path]
    names = st.sampled_from(sorted(route.fields | route.ignored)) | st.text(min_size=1, max_size=12)
    fields = data.draw(st.dictionaries(names, values, max_size=8))
    body = {**fields, "model": "claude-small", conversation: [{"role": "user", "content": "hi"}]}
    try:
        arguments = TRANSPORT.arguments(route, UPSTREAM, orjson.dumps(body), reserved)
    except InvalidRequest as exc:
        unknown = set(body) - route.fields - route.ignored - {"model"}
        assert unknown and sorted(unknown)[0] in exc.message
        return
    assert set(arguments) <= route.fields | PROVIDER_PARAMS | FIXED | added
    assert not set(arguments) & (route.ignored - added)
    assert arguments["model"] == "anthropic/claude-small" and arguments["api_key"] == "k"
    cap = CAPS[path]
    uncapped = body.get(cap) is None and body.get("max_completion_tokens") is None
    if uncapped and (reserved or path == "/messages"):
        assert arguments[cap] == (reserved or 4096)
    else:
        assert arguments.get(cap) == body.get(cap)


roles = st.sampled_from(["user", "assistant", "tool", "system"])
message = st.fixed_dictionaries({"role": roles, "content": st.sampled_from(["a", "b", None])})


@given(st.lists(message, max_size=12), st.integers(0, 12))
def test_cache_marks_go_on_the_stable_prefix_only(messages: list[Any], header_at: int) -> None:
    from policies.plan import SUMMARY_HEADING

    if header_at < len(messages):
        messages[header_at] = {"role": "user", "content": f"{SUMMARY_HEADING}\n{words(5, 1)}"}
    before = orjson.dumps(messages)
    marked = cache_marked(messages, policies.HEADINGS)
    assert orjson.dumps(messages) == before  # the request's own messages are untouched
    indices = [i for i, m in enumerate(marked) if "cache_control" in m]
    assert len(indices) <= 2
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    headers = [i for i, m in enumerate(messages) if str(m["content"]).startswith(SUMMARY_HEADING)]
    expected = set(assistants[-1:]) | set(headers[:1])
    assert set(indices) == expected
    assert [{k: v for k, v in m.items() if k != "cache_control"} for m in marked] == messages


items = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "developer"]),
            "content": st.sampled_from(["a", "b"]),
        }
    ),
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant"]),
            "content": st.just([{"type": "input_text", "text": "c"}]),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function_call", "reasoning"]), "call_id": st.just("x")}
    ),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "output": st.just("ok")}),
)


@given(st.lists(items, max_size=12), st.integers(0, 12))
@settings(max_examples=examples(100))
def test_responses_cache_marks_at_most_three_items_the_last_one_among_them(
    given_items: list[Any], header_at: int
) -> None:
    from policies.plan import SUMMARY_HEADING

    if header_at < len(given_items):
        given_items[header_at] = {"role": "user", "content": f"{SUMMARY_HEADING}\n{words(5, 1)}"}
    before = orjson.dumps(given_items)
    marked = cache_marked_input(given_items, policies.HEADINGS)
    assert orjson.dumps(given_items) == before  # the request's own items are untouched
    flagged = [i for i, item in enumerate(marked) if "cache_control" in orjson.dumps(item).decode()]
    assert len(flagged) <= 3  # and the instructions: Anthropic's limit of 4
    assert not given_items or flagged[-1] == len(given_items) - 1
    headers = [
        i for i, m in enumerate(given_items) if str(m.get("content")).startswith(SUMMARY_HEADING)
    ]
    assert set(headers[:1]) <= set(flagged)

    for original, changed in zip(given_items, marked, strict=True):
        restored = unmarked(changed)
        if isinstance(original.get("content"), str) and isinstance(restored.get("content"), list):
            assert restored["content"][0]["text"] == original["content"]
        else:
            assert restored == original
