"""The config: every documented key, errors that name the key and line, secrets, routing."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

import policies
from policies import ClearToolResultsParams as ClearToolResults
from proxy import config as config_module
from proxy.config import Config, ConfigError, load, loads

DOCS = Path(__file__).resolve().parent.parent / "docs" / "config.md"
COMPACTION_DOCS = DOCS.parent / "compaction.md"
SHA = "a" * 64
SECRETS = {
    "CP_TEST_OPENAI_KEY": "sk-live-0123456789",
    "CP_TEST_ADMIN_TOKEN": "admin-token-9876",
    "CP_TEST_REDIS_PASSWORD": "redis-pass-5555",
    "CP_TEST_ITEMS_KEY": "items-key-0123456789abcdef0123456789",
    "CP_TEST_HOOK_TOKEN": "hook-token-4321",
    "CP_TEST_HOOK_PASSWORD": "hook-password-2468",
    "CP_TEST_HOOK_QUERY": "hook-query-1357",
    "CP_TEST_HOOK_PATH": "hook-path-8642",
    "CP_TEST_PROXY_PASSWORD": "proxy-password-9753",
}
# Every key of docs/config.md, each set to a value other than its default.
FULL = f"""
listen:
  host: 127.0.0.1
  port: 9000
  max_body_bytes: 1048576
  max_head_bytes: 16384
  max_header_fields: 50
  max_concurrent_requests: 64
  shutdown_delay_seconds: 2.5
  shutdown_grace_seconds: 10
  websockets: false
  websocket_history_bytes: 1000000
  workers: 3
store:
  url: redis://:${{CP_TEST_REDIS_PASSWORD}}@127.0.0.1:6379/2
  ttl_seconds: 3600
  key_prefix: cpx
  timeout_seconds: 0.25
  fail_open: false
  max_sessions: 500
  max_branches: 2
  originals: {{session_bytes: 1048576, total_bytes: 8388608}}
sessions:
  header: X-Conversation
  policy_header: X-Policy
  shadow_header: X-Shadow
auth:
  keys:
    - {{id: team-a, sha256: {SHA}}}
  header: X-Proxy-Key
  allow_unauthenticated: true
upstreams:
  openai:
    base_url: https://api.openai.com/v1
    kind: openai
    api_key: ${{CP_TEST_OPENAI_KEY}}
    timeouts: {{connect: 5, first_byte: 60, stream_idle: 30}}
    retries: 1
    max_connections: 32
    max_answer_bytes: 4194304
    proxy: http://egress:${{CP_TEST_PROXY_PASSWORD}}@egress.corp:3128
  local:
    base_url: http://127.0.0.1:8001/v1
  bedrock:
    kind: litellm
    provider_model: bedrock/{{model}}
    provider_params: {{aws_region_name: eu-west-1}}
    prompt_cache: false
default_upstream: openai
default_context_window: 16384
models:
  - match: "local/*"
    context_window: 32768
    max_output_tokens: 2048
    upstream: local
    counting: estimate
    encoding: cl100k_base
  - match: sonnet
    upstream: bedrock
    provider_model: bedrock/anthropic.claude-sonnet-4-5
policies:
  default:
    reserved_output_tokens: 2048
    safety_margin_tokens: 128
    prepare_at: 0.5
    compact_at: 0.8
    target: 0.4
    summarizer:
      upstream: local
      model: small-summarizer
      timeout_seconds: 10
      retries: 1
      cooldown_seconds: 4
      temperature: 0.0
      request_wait_seconds: 1.5
    cache_breakpoints: false
    provider_compaction: serve
    max_tokens_overflow: relay
    shadow: true
    exact_count: {{via: count_tokens, margin: 0.2, timeout_seconds: 1.5, cooldown_seconds: 5}}
    retrieval:
      enabled: true
      tool_name: read_back
      description: Reads a cut output back.
      max_rounds: 2
      max_result_chars: 5000
    protect_recent_rounds: 8
    anchors: ['ORD-\\d+']
    layers:
      - clear_tool_results: {{keep_last: 3}}
      - truncate_tool_fields: {{keep_tokens: 100}}
      - drop_tool_blocks
      - summarize
      - trim_head
  cheap: {{}}
default_policy: cheap
routes:
  - {{policy: default, model: "gpt-4o*", policy_header: careful, upstream: local, dialects: [chat]}}
admin:
  token: ${{CP_TEST_ADMIN_TOKEN}}
  dashboard:
    enabled: true
    open_on_loopback: true
    turns: 300
    write_seconds: 2
compaction_items:
  signing_key: ${{CP_TEST_ITEMS_KEY}}
hooks:
  pre_compact:
    url: http://hooks:${{CP_TEST_HOOK_PASSWORD}}@127.0.0.1:9100/pre?token=${{CP_TEST_HOOK_QUERY}}
    timeout_seconds: 0.5
    include_text: true
    max_in_flight: 8
  post_compact:
    url: https://hooks.example.com/services/${{CP_TEST_HOOK_PATH}}
    headers: {{Authorization: "Bearer ${{CP_TEST_HOOK_TOKEN}}"}}
logging:
  level: debug
  format: text
"""
MINIMAL = "upstreams:\n  fake:\n    base_url: http://127.0.0.1:8001/v1\n"


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return SECRETS


def test_every_documented_key_parses(secrets: dict[str, str]) -> None:
    config = loads(FULL)
    assert (config.listen.port, config.listen.max_body_bytes) == (9000, 1048576)
    listen = config.listen
    assert listen.max_concurrent_requests == 64
    assert (listen.max_head_bytes, listen.max_header_fields) == (16384, 50)
    assert (listen.shutdown_delay_seconds, listen.shutdown_grace_seconds) == (2.5, 10.0)
    assert (listen.websockets, listen.websocket_history_bytes) == (False, 1000000)
    assert config.store.url == f"redis://:{secrets['CP_TEST_REDIS_PASSWORD']}@127.0.0.1:6379/2"
    assert (config.store.fail_open, config.store.max_branches, config.store.key_prefix) == (
        False,
        2,
        "cpx",
    )
    assert config.sessions.header == "X-Conversation"
    assert config.auth.keys[0].id == "team-a" and config.auth.header == "X-Proxy-Key"
    openai = config.upstreams["openai"]
    assert openai.api_key == secrets["CP_TEST_OPENAI_KEY"]
    assert (openai.timeouts.connect, openai.timeouts.first_byte) == (5.0, 60.0)
    assert (openai.retries, openai.max_connections, openai.max_answer_bytes) == (1, 32, 4 << 20)
    assert openai.name == "openai" and config.upstreams["local"].api_key is None
    assert openai.proxy == f"http://egress:{secrets['CP_TEST_PROXY_PASSWORD']}@egress.corp:3128"
    assert config.default_context_window == 16384
    model, alias = config.models
    assert (model.context_window, model.counting, model.upstream) == (32768, "estimate", "local")
    bedrock = config.upstreams["bedrock"]
    assert (bedrock.kind, bedrock.base_url, bedrock.prompt_cache) == ("litellm", "", False)
    assert bedrock.provider_params == {"aws_region_name": "eu-west-1"}
    assert config.provider_model(bedrock, "sonnet") == alias.provider_model
    assert config.provider_model(bedrock, "x") == "bedrock/x"
    policy = config.policies["default"]
    compaction = policy.compaction
    assert (compaction.prepare_at, compaction.compact_at, compaction.target) == (0.5, 0.8, 0.4)
    assert (compaction.reserved_output_tokens, compaction.safety_margin_tokens) == (2048, 128)
    assert policy.summarizer.model == "small-summarizer" and policy.summarizer.retries == 1
    assert not policy.cache_breakpoints and config.policies["cheap"].cache_breakpoints
    assert policy.provider_compaction == "serve"
    assert policy.max_tokens_overflow == "relay"
    assert config.policies["cheap"].provider_compaction == "relay"
    assert config.compaction_items.signing_key == secrets["CP_TEST_ITEMS_KEY"]
    assert policy.shadow and not config.policies["cheap"].shadow
    assert config.sessions.shadow_header == "X-Shadow"
    assert policy.summarizer.request_wait_seconds == 1.5
    assert (policy.exact_count.via, policy.exact_count.margin) == ("count_tokens", 0.2)
    assert policy.exact_count.cooldown_seconds == 5
    assert policy.retrieval.tool_name == "read_back" and policy.retrieval.max_rounds == 2
    assert config.store.originals.session_bytes == 1048576
    assert config.policies["cheap"].exact_count.via == "none"
    assert compaction.protect_recent_rounds == 8
    assert compaction.anchors == ("ORD-\\d+",)
    assert [name for name, _ in compaction.layers] == [
        "clear_tool_results",
        "truncate_tool_fields",
        "drop_tool_blocks",
        "summarize",
        "trim_head",
    ]
    assert config.policies["cheap"].compaction.target == 0.7  # defaults fill what is left out
    assert config.routes[0].policy_header == "careful"
    assert config.routes[0].dialects == ("chat",)
    assert config.admin.token == secrets["CP_TEST_ADMIN_TOKEN"]
    assert (config.logging.level, config.logging.format) == ("debug", "text")
    pre, post = config.hooks.pre_compact, config.hooks.post_compact
    assert pre is not None and post is not None
    assert (pre.timeout_seconds, pre.include_text, pre.max_in_flight) == (0.5, True, 8)
    assert (post.timeout_seconds, post.include_text, post.max_in_flight) == (1.0, False, 64)
    assert post.headers == {"Authorization": f"Bearer {secrets['CP_TEST_HOOK_TOKEN']}"}


def documented_keys() -> set[str]:
    """The keys in the first column of docs/config.md's tables."""
    rows = re.findall(r"^\| `([a-z_.]+)` \|", DOCS.read_text(), flags=re.MULTILINE)
    return set(rows)


def key_paths(data: Any, prefix: str = "") -> set[str]:
    """Every dotted key path in parsed YAML, list positions left out."""
    paths: set[str] = set()
    items = data.items() if isinstance(data, dict) else enumerate(data or [])
    for key, value in items:
        path = f"{prefix}.{key}" if isinstance(key, str) else prefix
        if isinstance(key, str):
            paths.add(path.lstrip("."))
        if isinstance(value, dict | list):
            paths |= key_paths(value, path)
    return paths


def test_the_full_example_covers_the_docs() -> None:
    paths = key_paths(yaml.safe_load(FULL))
    missing = {key for key in documented_keys() if not any(p.endswith(key) for p in paths)}
    assert documented_keys() and not missing


def test_every_setting_is_documented() -> None:
    """Every key a config file may hold; the engine's policy keys in either document."""
    documented = documented_keys() | set(re.findall(r"`([a-z_]+)`", DOCS.read_text()))
    both = documented | set(re.findall(r"`([a-z_]+)`", COMPACTION_DOCS.read_text()))
    engine = {f.name for f in dataclasses.fields(policies.Policy)}
    assert engine <= both, engine - both
    sections = [
        config_module.Listen,
        config_module.Store,
        config_module.Sessions,
        config_module.Auth,
        config_module.Upstream,
        config_module.Timeouts,
        config_module.ModelOverride,
        config_module.Summarizer,
        config_module.ExactCount,
        config_module.Policy,
        config_module.Route,
        config_module.Admin,
        config_module.Dashboard,
        config_module.Hooks,
        config_module.Hook,
        config_module.Logging,
        config_module.Config,
    ]
    fields = {f.name for cls in sections for f in dataclasses.fields(cls) if f.init}
    fields -= {"compaction"}  # the engine's policy: its keys sit flat in a policy
    names = {part for key in documented for part in key.split(".")}
    assert fields <= names, fields - names


def test_the_repository_config_is_the_embedded_default() -> None:
    config = load()
    assert config.listen.host == "127.0.0.1"
    assert config.store.url == "memory://"
    (upstream,) = config.upstreams.values()
    assert upstream.base_url == "https://api.openai.com/v1"
    assert upstream.api_key is None  # the client's own credential is passed through
    assert config.default_policy in config.policies


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as error:
        loads(text)
    return error.value.problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL + "listen_port: 80\n", "listen_port (<config>, line 4): unknown key"),
        (
            MINIMAL + "    timeout: {connect: 1}\n",
            "upstreams.fake.timeout (<config>, line 4): unknown key",
        ),
        (
            MINIMAL + "listen:\n  port: eighty\n",
            "listen.port (<config>, line 5): expected an integer, got a string",
        ),
        (
            MINIMAL + "store:\n  fail_open: 'no'\n",
            "store.fail_open (<config>, line 5): expected true or false, got a string",
        ),
        (
            MINIMAL + "listen:\n  port: 70000\n",
            "listen.port (<config>, line 5): must be between 1 and 65535",
        ),
        (
            MINIMAL + "store:\n  url: ftp://x\n",
            "store.url (<config>, line 5): must start with one of memory://, redis://, rediss://,",
        ),
        (
            MINIMAL + "logging:\n  level: loud\n",
            "logging.level (<config>, line 5): must be one of",
        ),
        (
            MINIMAL + "    timeouts:\n      first_byte: -1\n",
            "upstreams.fake.timeouts.first_byte (<config>, line 5): must be positive",
        ),
        (
            MINIMAL + "    retries: 11\n",
            "upstreams.fake.retries (<config>, line 4): must be between 0 and 10",
        ),
        (
            MINIMAL + "    max_connections: 0\n",
            "upstreams.fake.max_connections (<config>, line 4): must be at least 1",
        ),
        (
            MINIMAL + "    max_answer_bytes: 100\n",
            "upstreams.fake.max_answer_bytes (<config>, line 4): must be at least 1024",
        ),
        (
            MINIMAL + "listen:\n  max_head_bytes: 100\n",
            "listen.max_head_bytes (<config>, line 5): must be at least 1024",
        ),
        (
            MINIMAL + "listen:\n  max_header_fields: 0\n",
            "listen.max_header_fields (<config>, line 5): must be at least 1",
        ),
        (
            MINIMAL + "    proxy: socks5://egress:1080\n",
            "upstreams.fake.proxy (<config>, line 4): must be an http:// or https:// proxy URL "
            "(SOCKS is not supported), or none for no proxy",
        ),
        (
            "upstreams:\n  bedrock: {kind: litellm, proxy: none}\n",
            "upstreams.bedrock.proxy (<config>, line 2): not for upstreams of kind litellm",
        ),
        (
            MINIMAL + "listen:\n  max_concurrent_requests: 0\n",
            "listen.max_concurrent_requests (<config>, line 5): must be at least 1",
        ),
        (
            MINIMAL + "listen:\n  shutdown_grace_seconds: -1\n",
            "listen.shutdown_grace_seconds (<config>, line 5): must not be negative",
        ),
        (
            MINIMAL + "listen:\n  websocket_history_bytes: -1\n",
            "listen.websocket_history_bytes (<config>, line 5): must not be negative",
        ),
        (
            "upstreams:\n  fake:\n    base_url: ftp://x/v1\n",
            "upstreams.fake.base_url (<config>, line 3): must be an http:// or https:// URL",
        ),
        (
            MINIMAL + "policies:\n  default:\n    target: 0.9\n",
            "policies.default (<config>, line 5): levels must satisfy 0 < target < compact_at",
        ),
        (
            MINIMAL + "hooks:\n  pre_compact:\n    url: ftp://hooks/pre\n",
            "hooks.pre_compact.url (<config>, line 6): must be an http:// or https:// URL",
        ),
        (
            MINIMAL + "hooks:\n  post_compact: {url: 'http://h/p', timeout_seconds: 0}\n",
            "hooks.post_compact.timeout_seconds (<config>, line 5): must be positive",
        ),
        (
            MINIMAL + "hooks:\n  post_compact: {url: 'http://h/p', max_in_flight: 0}\n",
            "hooks.post_compact.max_in_flight (<config>, line 5): must be at least 1",
        ),
        (
            MINIMAL + "hooks:\n  post_compact: {url: 'http://h/p', headers: {'a b': x}}\n",
            "hooks.post_compact.headers.a b (<config>, line 5): must be a header name",
        ),
        (
            MINIMAL + "hooks:\n  post_compact: {url: 'http://h/p', headers: {'a(b)': x}}\n",
            "hooks.post_compact.headers.a(b) (<config>, line 5): must be a header name",
        ),
        (
            MINIMAL + "hooks:\n  pre_compact: {timeout_seconds: 1}\n",
            "hooks.pre_compact.url: is required",
        ),
        (
            MINIMAL + "routes:\n  - policy: nope\n",
            "routes[0].policy (<config>, line 5): names no policy: 'nope'",
        ),
        (
            MINIMAL + "models:\n  - match: x\n    upstream: nope\n",
            "models[0].upstream (<config>, line 6): names no upstream: 'nope'",
        ),
        (
            MINIMAL + "auth:\n  header: X-Key\n  keys:\n    - {id: a, sha256: abc}\n",
            "auth.keys[0].sha256 (<config>, line 7): must be 64 lowercase hex characters",
        ),
        (
            MINIMAL + "policies:\n  default:\n    layers: [squash]\n",
            "policies.default.layers[0] (<config>, line 6): unknown layer 'squash'",
        ),
        (
            MINIMAL + "policies:\n  p:\n    layers:\n      - trim_head\n"
            "      - truncate_tool_fields: {keep_tokens: many}\n",
            "policies.p.layers[1].truncate_tool_fields.keep_tokens (<config>, line 8): "
            "expected an integer",
        ),
        (
            MINIMAL + "upstreams:\n  other:\n    base_url: http://127.0.0.1:9/v1\n",
            "",  # a duplicate mapping key: the YAML's last one wins, and that is valid
        ),
        ("listen: {}\n", "upstreams: is required"),
        (
            MINIMAL + "compaction_items:\n  signing_key: short\n",
            "compaction_items.signing_key (<config>, line 5): must be at least 32 characters",
        ),
        (
            MINIMAL + "policies:\n  default:\n    provider_compaction: answer\n",
            "policies.default.provider_compaction (<config>, line 6):",
        ),
        (
            MINIMAL + "  two:\n    base_url: http://127.0.0.1:9/v1\n",
            "default_upstream: is required with more than one upstream (fake, two)",
        ),
    ],
)
def test_errors_name_the_key_and_its_line(text: str, expected: str) -> None:
    if not expected:
        assert loads(text).upstreams
        return
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        (
            MINIMAL + "listen:\n  port: x\n  hots: x\nstore:\n  fail_open: 1\n",
            ["listen.hots", "listen.port", "store.fail_open"],
        ),
        (
            MINIMAL + "listen:\n  port: 0\nstore:\n  url: x://\n  ttl_seconds: -5\n",
            ["listen.port", "store.url", "store.ttl_seconds"],
        ),
    ],
    ids=["keys-and-types", "values"],
)
def test_every_problem_of_a_kind_is_reported_at_once(text: str, keys: list[str]) -> None:
    assert [p.split(" ")[0] for p in problems(text)] == keys


@pytest.mark.parametrize(
    "text",
    [
        "upstreams: [unclosed\n",
        "!!python/object/apply:os.system ['echo unsafe']\n",
        MINIMAL + "listen: !!python/object/apply:os.getcwd []\n",
    ],
)
def test_not_yaml_or_unsafe_yaml_is_refused(text: str) -> None:
    (problem,) = problems(text)
    assert "not valid YAML" in problem
    assert 'in "<config>", line' in problem  # where, by the source's name


def test_a_yaml_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("listen:\n  port: 8080\n   host: 0.0.0.0\n")
    with pytest.raises(ConfigError) as error:
        load(path)
    (problem,) = error.value.problems
    assert f'in "{path}", line 3, column 8' in problem


def test_a_file_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")


def test_environment_interpolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CP_TEST_KEY", "sk-from-env")
    monkeypatch.delenv("CP_TEST_UNSET", raising=False)
    monkeypatch.delenv("CP_TEST_MISSING", raising=False)
    config = loads(
        MINIMAL
        + "    api_key: ${CP_TEST_KEY}\n"
        + "admin:\n  token: prefix-${CP_TEST_UNSET:-fallback}-suffix\n"
    )
    assert config.upstreams["fake"].api_key == "sk-from-env"
    assert config.admin.token == "prefix-fallback-suffix"
    (problem,) = problems(MINIMAL + "    api_key: ${CP_TEST_MISSING}\n")
    assert problem == (
        "upstreams.fake.api_key (<config>, line 4): environment variable CP_TEST_MISSING is not set"
    )


def test_masked_hides_every_secret(secrets: dict[str, str]) -> None:
    masked = loads(FULL).masked()
    assert masked["upstreams"]["openai"]["api_key"] == "***"
    assert masked["upstreams"]["local"]["api_key"] is None
    assert masked["upstreams"]["openai"]["proxy"] == "http://egress:***@egress.corp:3128"
    assert "proxy" not in masked["upstreams"]["bedrock"]  # kind litellm has none
    assert masked["admin"]["token"] == "***"
    assert masked["compaction_items"]["signing_key"] == "***"
    assert masked["store"]["url"] == "redis://:***@127.0.0.1:6379/2"
    assert masked["hooks"]["post_compact"]["headers"] == {"Authorization": "***"}
    assert masked["hooks"]["pre_compact"]["url"] == "http://hooks:***@127.0.0.1:9100/***?token=***"
    assert masked["hooks"]["post_compact"]["url"] == "https://hooks.example.com/***"
    text = orjson.dumps(masked).decode()
    for secret in secrets.values():
        assert secret not in text
    assert masked["listen"]["port"] == 9000  # the rest is as configured


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw-1@cache:6380/1", "redis://user:***@cache:6380/1"),
        ("rediss://:pw-2@cache/0", "rediss://:***@cache/0"),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("redis://token-3@cache/0", "redis://***@cache/0"),
        (
            "rediss://cache/0?ssl_keyfile=/k&ssl_check_hostname=false",
            "rediss://cache/0?ssl_keyfile=***&ssl_check_hostname=***",
        ),
    ],
)
def test_masked_store_urls(url: str, shown: str) -> None:
    assert loads(MINIMAL + f"store:\n  url: {url}\n").masked()["store"]["url"] == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:pw-3@h/p?token=tk-4&v=2#top", "https://u:***@h/***?token=***&v=***#top"),
        ("https://tk-5@h:8443/p?tk-6", "https://***@h:8443/***?***"),
        ("http://h/p#?x=1", "http://h/***#?x=1"),
        ("https://discord.com/api/webhooks/123/tk-7", "https://discord.com/***"),
        ("http://h:9000/", "http://h:9000/"),
    ],
)
def test_masked_hook_urls(url: str, shown: str) -> None:
    config = loads(MINIMAL + f"hooks:\n  pre_compact:\n    url: '{url}'\n")
    assert config.masked()["hooks"]["pre_compact"]["url"] == shown


def test_masked_lays_a_policy_out_as_in_the_file(secrets: dict[str, str]) -> None:
    policy = loads(FULL).masked()["policies"]["default"]
    assert "compaction" not in policy
    assert (policy["target"], policy["protect_recent_rounds"]) == (0.4, 8)
    assert policy["layers"][0] == {"clear_tool_results": dataclasses.asdict(ClearToolResults(3))}
    assert policy["summarizer"]["model"] == "small-summarizer"


def test_configs_are_plain_frozen_data() -> None:
    config = loads(MINIMAL)
    assert isinstance(config, Config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.listen.port = 1
