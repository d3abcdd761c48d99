"""Egress proxies (docs/config.md, "Egress proxies"): HTTPS_PROXY, HTTP_PROXY and NO_PROXY as
curl reads them, and an upstream's own `proxy`, against a real egress proxy on loopback
(tests/egress_proxy.py) that records the tunnels and requests it is asked for."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from proxy.config import ConfigError, loads
from proxy.config.egress import (
    EgressProxy,
    InvalidEgressProxy,
    bypassed,
    egress_proxy,
    parse_egress_proxy,
)
from proxy.upstream.answer import read_whole
from proxy.upstream.connect import EgressRefused
from proxy.upstream.pool import Pool
from tests.egress_proxy import EgressProxy as LoopbackProxy
from tests.fakes.hook import FakeHook
from tests.fakes.scripted import TLS, Request, ScriptedUpstream, response, server_tls
from tests.harness import harness
from tests.servers import proxy_server
from tests.test_hooks import PRE
from tests.test_http1 import BODY_LIMIT, get, keep_answering, serving
from tests.test_upstream_resilience import BODY, CHAT, config_of, retries

CREDENTIALS = ("egress user", "s3cret:pw")
BASIC = "Basic " + base64.b64encode(b"egress user:s3cret:pw").decode()
PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No proxy variable but the test's own; the TLS test certificate trusted."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "cert.pem"))
    return monkeypatch


@pytest.fixture
def egress() -> Iterator[LoopbackProxy]:
    with LoopbackProxy(credentials=CREDENTIALS) as proxy:
        yield proxy


def proxy_url(proxy: LoopbackProxy) -> str:
    """The loopback proxy's URL with its credentials, percent-encoded."""
    return proxy.url.replace("://", "://egress%20user:s3cret%3Apw@")


# -- which proxy, by the environment and the setting ------------------------------------------


@pytest.mark.parametrize(
    ("rules", "host", "port", "straight"),
    [
        ("*", "api.openai.com", 443, True),
        ("api.openai.com", "api.openai.com", 443, True),
        ("openai.com", "api.openai.com", 443, True),
        (".openai.com", "api.openai.com", 443, True),
        (".openai.com", "openai.com", 443, True),
        ("openai.com", "myopenai.com", 443, False),
        ("OpenAI.com.", "api.openai.com.", 443, True),
        ("example.com,openai.com", "api.openai.com", 443, True),
        (" example.com , , openai.com ", "api.openai.com", 443, True),
        ("example.com openai.com", "api.openai.com", 443, True),
        ("api.openai.com:443", "api.openai.com", 443, True),
        ("api.openai.com:8443", "api.openai.com", 443, False),
        ("api.openai.com:x", "api.openai.com", 443, False),
        ("10.0.0.0/8", "10.1.2.3", 443, True),
        ("10.0.0.0/8", "11.1.2.3", 443, False),
        ("127.0.0.1", "127.0.0.1", 8080, True),
        ("127.0.0.1", "localhost", 8080, False),  # names are never resolved
        ("localhost", "127.0.0.1", 8080, False),
        ("::1", "::1", 8080, True),
        ("[::1]:8080", "::1", 8080, True),
        ("[::1]:8080", "::1", 443, False),
        ("fe80::/10", "fe80::1", 443, True),
        ("10.0.0.0/8", "::1", 443, False),
        ("", "localhost", 80, False),
    ],
)
def test_no_proxy_rules_as_curl_reads_them(
    rules: str, host: str, port: int, straight: bool
) -> None:
    assert bypassed(rules, host, port) is straight


def test_the_environment_names_the_proxy_by_scheme_the_lowercase_first() -> None:
    https, http = urlsplit("https://api.openai.com/v1"), urlsplit("http://localhost:8001/v1")
    both = {"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2"}
    assert egress_proxy(https, None, both) == EgressProxy("lower", 2, False, None)
    assert egress_proxy(http, None, both) is None  # https's proxy is not plain HTTP's
    plain = {"HTTP_PROXY": "egress.corp:3128"}  # no scheme: http
    assert egress_proxy(http, None, plain) == EgressProxy("egress.corp", 3128, False, None)
    assert egress_proxy(http, None, {"http_proxy": "", **plain}) is not None  # empty: unset
    # Nothing goes straight but what NO_PROXY lists: not even localhost.
    assert egress_proxy(http, None, {**plain, "no_proxy": "localhost"}) is None
    assert egress_proxy(http, None, {**plain, "NO_PROXY": "openai.com"}) is not None


def test_the_setting_wins_over_the_environment() -> None:
    https = urlsplit("https://api.openai.com/v1")
    environ = {"HTTPS_PROXY": "http://egress:3128"}
    assert egress_proxy(https, "none", environ) is None
    own = egress_proxy(https, "http://other:8080", {**environ, "NO_PROXY": "*"})
    assert own == EgressProxy("other", 8080, False, None)


def test_a_proxy_urls_user_and_password_are_its_basic_credentials() -> None:
    proxy = parse_egress_proxy("https://egress%20user:s3cret%3Apw@egress.corp/")
    assert proxy == EgressProxy("egress.corp", 443, True, BASIC)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("socks5://u:pw-1@egress:1080", "SOCKS is not supported"),
        ("http://u:pw-2@egress:port", "not a number"),
        ("http://u:pw-3@:3128", "names no host"),
        ("http://u:pw-4@egress:3128/path?x=1", "without a path"),
    ],
)
def test_a_proxy_url_the_client_cannot_use_is_refused_without_its_password(
    url: str, problem: str
) -> None:
    with pytest.raises(InvalidEgressProxy, match=problem) as refused:
        parse_egress_proxy(url)
    assert "pw-" not in str(refused.value)


def test_a_proxy_variable_the_client_cannot_use_fails_the_config(
    environment: pytest.MonkeyPatch,
) -> None:
    environment.setenv("https_proxy", "socks5://u:pw-5@egress:1080")
    with pytest.raises(ConfigError) as refused:
        loads("upstreams:\n  up:\n    base_url: https://api.openai.com/v1\n")
    assert refused.value.problems == [
        "environment variable https_proxy: must be an http:// or https:// proxy URL "
        "(SOCKS is not supported)"
    ]


# -- the pool through a loopback egress proxy -------------------------------------------------


async def test_https_goes_through_a_tunnel_with_the_proxy_credentials(
    environment: pytest.MonkeyPatch, egress: LoopbackProxy
) -> None:
    environment.setenv("HTTPS_PROXY", proxy_url(egress))
    async with serving(keep_answering, server_tls()) as server:
        pool = Pool(f"https://localhost:{server.port}/v1", 2)
        first, second = await get(pool), await get(pool)  # both held: two connections
        for response in (first, second):
            assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
            response.release()
        again = await get(pool)  # a kept-alive tunnel
        await read_whole(again, 1, BODY_LIMIT)
        again.release()
        assert (
            egress.connects()
            == [f"localhost:{server.port}"] * 2
            == [f"localhost:{server.port}"] * server.connections
        )
        assert [seen.headers["proxy-authorization"] for seen in egress.seen] == [BASIC] * 2
        # Inside the tunnel: TLS to the upstream, and requests as if straight to it.
        assert server.heads[0].startswith(
            b"POST /v1/chat HTTP/1.1\r\nHost: localhost:%d\r\n" % server.port
        )
        assert all(b"Proxy-Authorization" not in head for head in server.heads)
        pool.close()


async def test_no_proxy_hosts_go_straight(
    environment: pytest.MonkeyPatch, egress: LoopbackProxy
) -> None:
    environment.setenv("HTTPS_PROXY", proxy_url(egress))
    environment.setenv("NO_PROXY", "example.com,localhost")
    async with serving(keep_answering, server_tls()) as server:
        pool = Pool(f"https://localhost:{server.port}/v1", 1)
        response = await get(pool)
        assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
        response.release()
        assert egress.seen == [] and server.connections == 1
        pool.close()


async def test_plain_http_goes_to_the_proxy_in_absolute_form(
    environment: pytest.MonkeyPatch, egress: LoopbackProxy
) -> None:
    environment.setenv("HTTP_PROXY", proxy_url(egress))
    async with serving(keep_answering) as server:
        pool = Pool(f"http://localhost:{server.port}/v1", 1)
        for _ in range(2):
            response = await get(pool)
            assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
            response.release()
        url = f"http://localhost:{server.port}/v1/chat"
        assert [(seen.method, seen.target) for seen in egress.seen] == [("POST", url)] * 2
        assert all(seen.headers["proxy-authorization"] == BASIC for seen in egress.seen)
        assert all(seen.headers["host"] == f"localhost:{server.port}" for seen in egress.seen)
        assert egress.connects() == []
        pool.close()


async def test_an_upstreams_own_proxy_wins(
    environment: pytest.MonkeyPatch, egress: LoopbackProxy
) -> None:
    environment.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens there
    async with serving(keep_answering, server_tls()) as server:
        straight = Pool(f"https://localhost:{server.port}/v1", 1, proxy="none")
        environment.setenv("NO_PROXY", "*")
        tunnelled = Pool(f"https://localhost:{server.port}/v1", 1, proxy=proxy_url(egress))
        for pool in (straight, tunnelled):
            response = await get(pool)
            assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
            response.release()
            pool.close()
        assert egress.connects() == [f"localhost:{server.port}"]


@pytest.mark.parametrize(("refuse", "lasting"), [(403, True), (502, False), (0, True)])
async def test_a_refused_tunnel_says_the_egress_proxy_refused(
    environment: pytest.MonkeyPatch, refuse: int, lasting: bool
) -> None:
    """The proxy's policy (403), its credentials (407: none were given here) or its reach of
    the upstream (502, which may pass)."""
    with LoopbackProxy(credentials=CREDENTIALS, refuse=refuse) as egress:
        environment.setenv("HTTPS_PROXY", egress.url)
        pool = Pool("https://api.example.com/v1", 1)
        with pytest.raises(EgressRefused) as refused:
            await get(pool)
        assert refused.value.status == (refuse or 407)
        assert refused.value.lasting is lasting
        assert "example" not in str(refused.value) and "127.0.0.1" not in str(refused.value)
        assert pool._open == 0


async def test_a_407_to_a_request_in_absolute_form_is_the_proxys_refusal(
    environment: pytest.MonkeyPatch, egress: LoopbackProxy
) -> None:
    environment.setenv("HTTP_PROXY", egress.url)
    pool = Pool("http://api.example.com/v1", 1)
    with pytest.raises(EgressRefused, match="407 Proxy Authentication Required"):
        await get(pool)
    assert pool._open == 0


async def test_an_https_egress_proxy_carries_tls_inside_tls(
    environment: pytest.MonkeyPatch,
) -> None:
    with LoopbackProxy(tls=server_tls()) as egress:
        environment.setenv("HTTPS_PROXY", egress.url)
        async with serving(keep_answering, server_tls()) as server:
            pool = Pool(f"https://localhost:{server.port}/v1", 1)
            response = await get(pool)
            assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
            response.release()
            assert egress.connects() == [f"localhost:{server.port}"]
            pool.close()


# -- through the proxy -------------------------------------------------------------------------


async def answers(request: Request, writer: asyncio.StreamWriter) -> bool:
    writer.write(response(200, b'{"ok": true}'))
    return True


@pytest.fixture
def https_upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(answers, host="localhost", tls=server_tls()) as up:
        yield up


def test_every_call_to_an_https_upstream_goes_through_a_tunnel(
    environment: pytest.MonkeyPatch,
    egress: LoopbackProxy,
    https_upstream: ScriptedUpstream,
    http: httpx.Client,
) -> None:
    environment.setenv("HTTPS_PROXY", proxy_url(egress))
    with proxy_server(config_of(https_upstream)) as server:
        for _ in range(3):
            assert http.post(server.url + CHAT, json=BODY).status_code == 200
    assert len(https_upstream.requests) == 3
    target = f"localhost:{https_upstream.port}"
    assert egress.connects() == [target] * https_upstream.connections


def test_a_refused_tunnel_is_a_502_that_says_so_and_is_not_retried(
    environment: pytest.MonkeyPatch,
    egress: LoopbackProxy,
    https_upstream: ScriptedUpstream,
    http: httpx.Client,
) -> None:
    environment.setenv("HTTPS_PROXY", egress.url)
    with proxy_server(config_of(https_upstream)) as server:
        answer = http.post(server.url + CHAT, json=BODY)
        assert answer.status_code == 502
        assert answer.json()["error"]["message"] == (
            "upstream 'up' is unreachable: "
            "the egress proxy refused the connection (407 Proxy Authentication Required)"
        )
        assert retries(http, server, "connect") == 0
    assert len(egress.seen) == 1 and https_upstream.connections == 0


def test_an_egress_proxy_that_cannot_reach_the_upstream_is_retried(
    environment: pytest.MonkeyPatch, http: httpx.Client
) -> None:
    with LoopbackProxy(refuse=502) as egress:
        environment.setenv("HTTPS_PROXY", egress.url)
        upstream = {"base_url": "https://api.example.com/v1"}
        with proxy_server(loads(yaml.safe_dump({"upstreams": {"up": upstream}}))) as server:
            answer = http.post(server.url + CHAT, json=BODY)
            assert answer.status_code == 502
            assert answer.json()["error"]["message"].endswith("(502 Bad Gateway) (3 attempts)")
            assert retries(http, server, "connect") == 2
        assert len(egress.seen) == 3


def test_an_upstreams_proxy_setting_wins(
    environment: pytest.MonkeyPatch,
    egress: LoopbackProxy,
    https_upstream: ScriptedUpstream,
    http: httpx.Client,
) -> None:
    environment.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens there
    with proxy_server(config_of(https_upstream, proxy="none")) as server:
        assert http.post(server.url + CHAT, json=BODY).status_code == 200
    environment.setenv("NO_PROXY", "localhost")
    with proxy_server(config_of(https_upstream, proxy=proxy_url(egress))) as server:
        assert http.post(server.url + CHAT, json=BODY).status_code == 200
    assert egress.connects() == [f"localhost:{https_upstream.port}"]


def test_the_summarizer_and_the_hooks_go_through_the_egress_proxy(
    environment: pytest.MonkeyPatch, egress: LoopbackProxy
) -> None:
    """The upstream by its own `proxy` (the summarizer's calls with it), a hook by HTTP_PROXY;
    NO_PROXY keeps the tests' own client straight to the proxy (127.0.0.1)."""
    environment.setenv("HTTP_PROXY", proxy_url(egress))
    environment.setenv("NO_PROXY", "127.0.0.1")
    with FakeHook() as hook:
        pre = {"url": hook.url(PRE).replace("127.0.0.1", "localhost")}
        own = {"fake": {"proxy": proxy_url(egress)}}
        with harness(hooks={"pre_compact": pre}, upstreams=own) as h:
            h.conversation().until("compacted")
            to_upstream = [s for s in egress.seen if s.target.startswith(h.up.base_url)]
            to_hook = [s for s in egress.seen if s.target == pre["url"]]
            assert h.up.summary_calls > 0 and len(to_upstream) == len(h.up.requests)
            assert hook.calls(PRE) and len(to_hook) == len(hook.calls(PRE))
            assert len(egress.seen) == len(to_upstream) + len(to_hook)
            assert all(seen.headers["proxy-authorization"] == BASIC for seen in egress.seen)
