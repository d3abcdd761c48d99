"""Who is calling (tenants, inbound keys) and which conversation it is (sessions)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.config import Auth, Config, ConfigError, load
from proxy.credentials import hash_key
from proxy.server.tenants import Tenants
from proxy.sessions.sessions import session_id
from tests.conftest import ConfigFactory, config_for
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
UPSTREAM_KEY = "sk-upstream-secret"


def session_of(
    http: httpx.Client, server: ServerThread, messages: list[Any] = HELLO, **fields: Any
) -> str:
    """The session hash the proxy reports for one chat request."""
    headers = fields.pop("headers", {})
    body = {"model": "small-8k", "messages": messages, **fields}
    response = http.post(server.url + CHAT, json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.headers["x-compaction-session"]


def test_session_from_the_header(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    alice = {"authorization": "Bearer sk-alice"}
    one = session_of(http, server, headers={**alice, "x-session-id": "conv-1"})
    assert session_of(http, server, headers={**alice, "X-Session-Id": "conv-1"}) == one
    other = [{"role": "user", "content": "another first message"}]
    assert session_of(http, server, other, headers={**alice, "x-session-id": "conv-1"}) == one
    assert session_of(http, server, headers={**alice, "x-session-id": "conv-2"}) != one
    assert "x-session-id" not in upstream.requests[-1].headers  # the proxy's own header


def test_session_from_metadata(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    by_header = session_of(http, server, headers={"x-session-id": "conv-9"})
    assert session_of(http, server, metadata={"session_id": "conv-9"}) == by_header
    assert session_of(http, server, metadata={"session_id": "conv-8"}) != by_header
    both = session_of(
        http, server, metadata={"session_id": "conv-8"}, headers={"x-session-id": "conv-9"}
    )
    assert both == by_header  # the header wins
    assert upstream.requests[-1].json["metadata"] == {"session_id": "conv-8"}  # forwarded as is


def test_session_derived_from_the_first_user_message(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    def conversation(system: str, first: str, *more: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
        for text in more:
            messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]
        return messages

    start = session_of(http, server, conversation("Today is Monday.", "Plan my week"))
    assert session_of(http, server, conversation("Today is Tuesday.", "Plan my week")) == start
    assert (
        session_of(http, server, conversation("Today is Monday.", "Plan my week", "more")) == start
    )
    assert session_of(http, server, conversation("Today is Monday.", "Plan my day")) != start


def test_credentials_separate_tenants(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    same_id = {"x-session-id": "shared-name"}
    alice = session_of(http, server, headers={**same_id, "authorization": "Bearer sk-alice"})
    bob = session_of(http, server, headers={**same_id, "authorization": "Bearer sk-bob"})
    nobody = session_of(http, server, headers=same_id)
    assert len({alice, bob, nobody}) == 3
    azure_style = session_of(http, server, headers={**same_id, "api-key": "sk-alice"})
    assert azure_style == alice  # the same credential, however it is presented


def test_a_tenant_is_never_the_credential() -> None:
    tenants = Tenants(Auth())
    tenant = tenants.tenant({"authorization": "Bearer sk-very-secret-key"})
    assert "sk-very-secret-key" not in tenant
    assert tenant == tenants.tenant({"authorization": "sk-very-secret-key"})
    assert tenant != tenants.tenant({"authorization": "Bearer sk-other"})


def test_long_session_ids_are_used_whole(http: httpx.Client, server: ServerThread) -> None:
    long = "x" * 10_000
    one = session_of(http, server, headers={"x-session-id": long + "a"})
    assert session_of(http, server, headers={"x-session-id": long + "b"}) != one
    assert session_of(http, server, metadata={"session_id": long + "a"}) == one
    assert session_id("", None, HELLO) == session_id(None, None, HELLO)


# -- inbound keys ----------------------------------------------------------------------------------


def inbound_keys(*names: str) -> list[dict[str, str]]:
    return [{"id": f"team-{name}", "sha256": hash_key(f"pk-{name}")} for name in names]


@pytest.fixture
def keyed_server(proxy_config: ConfigFactory, upstream: FakeUpstream) -> Iterator[ServerThread]:
    """Clients present proxy keys in Authorization; the proxy holds the upstream key."""
    upstream.api_key = UPSTREAM_KEY  # the fake refuses any other credential
    config = proxy_config(
        upstreams={"fake": {"api_key": UPSTREAM_KEY}}, auth={"keys": inbound_keys("a", "b")}
    )
    with proxy_server(config) as server:
        yield server


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("POST", CHAT, {}),
        ("POST", CHAT, {"authorization": "Bearer pk-wrong"}),
        ("POST", CHAT, {"authorization": f"Bearer {UPSTREAM_KEY}"}),
        ("GET", "/v1/models", {}),
        ("GET", "/v1/models", {"authorization": "Bearer pk-wrong"}),
    ],
)
def test_a_missing_or_wrong_proxy_key_is_a_401(
    http: httpx.Client,
    keyed_server: ServerThread,
    upstream: FakeUpstream,
    method: str,
    path: str,
    headers: dict[str, str],
) -> None:
    body = {"model": "small-8k", "messages": HELLO} if method == "POST" else None
    response = http.request(method, keyed_server.url + path, json=body, headers=headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key"
    assert upstream.requests == []


def test_the_right_proxy_key_is_served_and_not_forwarded(
    http: httpx.Client, keyed_server: ServerThread, upstream: FakeUpstream
) -> None:
    url = keyed_server.url + "/v1"
    with openai.OpenAI(base_url=url, api_key="pk-a", max_retries=0) as client:
        answer = client.chat.completions.with_raw_response.create(model="small-8k", messages=HELLO)
        assert answer.parse().choices[0].message.content
        assert client.models.list().data[0].id
    with (
        openai.OpenAI(base_url=url, api_key="pk-c", max_retries=0) as other,
        pytest.raises(openai.AuthenticationError),
    ):
        other.models.list()
    for received in upstream.requests:
        assert received.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert not any("pk-a" in value for value in received.headers.values())

    # The tenant is the key's id: the same session id under two keys is two sessions.
    same_id = {"x-session-id": "conv-1"}
    a = session_of(http, keyed_server, headers={**same_id, "authorization": "Bearer pk-a"})
    again = session_of(http, keyed_server, headers={**same_id, "authorization": "pk-a"})
    b = session_of(http, keyed_server, headers={**same_id, "authorization": "Bearer pk-b"})
    assert a == again != b
    assert answer.headers["x-compaction-session"] != a


def test_a_proxy_key_in_its_own_header_leaves_the_clients_credential(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    config = proxy_config(auth={"keys": inbound_keys("a"), "header": "X-Proxy-Key"})
    client_key = {"authorization": "Bearer sk-client-own"}
    with proxy_server(config) as server:
        body = {"model": "small-8k", "messages": HELLO}
        refused = http.post(server.url + CHAT, json=body, headers=client_key)
        assert refused.status_code == 401
        served = http.post(
            server.url + CHAT, json=body, headers={**client_key, "x-proxy-key": "pk-a"}
        )
        assert served.status_code == 200
        listed = http.get(server.url + "/v1/models", headers={**client_key, "x-proxy-key": "pk-a"})
        assert listed.status_code == 200
    for received in upstream.requests:
        assert received.headers["authorization"] == "Bearer sk-client-own"
        assert "x-proxy-key" not in received.headers


# -- no accidental open relay ----------------------------------------------------------------------


def relay_config(upstream: FakeUpstream, **sections: Any) -> Config:
    return config_for(upstream, upstreams={"fake": {"api_key": UPSTREAM_KEY}}, **sections)


def test_an_open_relay_is_refused(upstream: FakeUpstream) -> None:
    with pytest.raises(ConfigError) as refused:
        relay_config(upstream, listen={"host": "0.0.0.0"})
    (problem,) = refused.value.problems
    assert problem.startswith("auth")
    assert "upstream 'fake' holds its own api_key and the proxy listens on 0.0.0.0" in problem
    assert "auth.keys" in problem
    other = {"base_url": upstream.base_url, "api_key": "sk-other"}
    with pytest.raises(ConfigError) as both:
        config_for(
            upstream,
            upstreams={"fake": {"api_key": UPSTREAM_KEY}, "other": other},
            default_upstream="fake",
            listen={"host": "0.0.0.0"},
        )
    (problem,) = both.value.problems
    assert "upstreams 'fake', 'other' hold their own api_keys" in problem


@pytest.mark.parametrize(
    "sections",
    [
        {"listen": {"host": "127.0.0.1"}},
        {"listen": {"host": "::1"}},
        {"listen": {"host": "localhost"}},
        {"listen": {"host": "0.0.0.0"}, "auth": {"allow_unauthenticated": True}},
        {"listen": {"host": "0.0.0.0"}, "auth": {"keys": inbound_keys("a")}},
    ],
    ids=["loopback", "ipv6-loopback", "localhost", "explicitly-allowed", "inbound-keys"],
)
def test_the_ways_out_of_the_open_relay_refusal(
    upstream: FakeUpstream, sections: dict[str, Any]
) -> None:
    config = relay_config(upstream, **sections)
    assert config.upstreams["fake"].api_key == UPSTREAM_KEY


def test_a_command_line_host_goes_through_the_same_check(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(
        "upstreams:\n  openai:\n    base_url: https://api.openai.com/v1\n    api_key: sk-x\n"
    )
    assert load(file).listen.host == "127.0.0.1"
    with pytest.raises(ConfigError, match="auth"):
        load(file, listen={"host": "0.0.0.0"})


def test_proxy_keys_in_authorization_need_upstream_keys(upstream: FakeUpstream) -> None:
    with pytest.raises(ConfigError) as refused:
        config_for(upstream, auth={"keys": inbound_keys("a")})
    (problem,) = refused.value.problems
    assert problem.startswith("auth.header") and "fake" in problem


def test_hash_key_is_the_sha256_hex() -> None:
    assert hash_key("pk-a") == hashlib.sha256(b"pk-a").hexdigest()
