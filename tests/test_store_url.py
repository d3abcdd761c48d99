"""Store URLs: one parser for every form (proxy/config/store_url.py), checked once at start-up,
never quoting a password; and the stores they open, TLS included, on servers of the tests' own.
"""

from __future__ import annotations

import traceback
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from proxy.config import ConfigError, loads
from proxy.config.store_url import TLS, InvalidStoreURL, StoreURL, masked_url, parse_store_url
from proxy.errors import StoreUnavailable
from proxy.sessions.sessions import session_key
from proxy.sessions.store import MemoryStore, RedisStore, open_store
from tests.redis_servers import Certificates, free_port, redis_server

SECRET = "hunter2-do-not-print"
MINIMAL = "upstreams:\n  fake:\n    base_url: http://127.0.0.1:8001/v1\n"


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("memory://", StoreURL("memory")),
        ("redis://cache", StoreURL("redis", (("cache", 6379),))),
        (
            "rediss://user:pw@cache:6380/2?ssl_ca_certs=/etc/ca.pem",
            StoreURL(
                "redis",
                (("cache", 6380),),
                db=2,
                username="user",
                password="pw",
                tls=TLS(ca_certs="/etc/ca.pem"),
            ),
        ),
        (
            "redis+cluster://:p%40ss@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002",
            StoreURL(
                "cluster",
                (("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002)),
                password="p@ss",
            ),
        ),
        (
            "rediss+cluster://node-1?ssl_cert_reqs=none",
            StoreURL(
                "cluster",
                (("node-1", 6379),),
                tls=TLS(cert_reqs="none", check_hostname=False),
            ),
        ),
        (
            "redis+sentinel://s1,s2:26380,s3/mymaster/3",
            StoreURL("sentinel", (("s1", 26379), ("s2", 26380), ("s3", 26379)), 3, "mymaster"),
        ),
        (
            "rediss+sentinel://:pw@s1/mymaster?sentinel_auth=true&ssl_check_hostname=false",
            StoreURL(
                "sentinel",
                (("s1", 26379),),
                master="mymaster",
                password="pw",
                tls=TLS(check_hostname=False),
                sentinel_auth=True,
            ),
        ),
    ],
)
def test_store_urls(url: str, parsed: StoreURL) -> None:
    assert parse_store_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("", "must start with one of memory://, redis://, rediss://, redis+cluster://"),
        ("unix:///tmp/redis.sock", "must start with one of"),
        ("memory://elsewhere", "memory:// takes no host"),
        (f"redis://:{SECRET}@a,b/0", "redis:// names one server"),
        (f"redis://:{SECRET}@cache:notaport/0", "a port must be a number"),
        (f"redis://:{SECRET}@cache:0/0", "a port must be a number"),
        (f"redis://:{SECRET}@/0", "every node needs a host"),
        (f"redis+cluster://:{SECRET}@a,,b", "every node needs a host"),
        (f"redis://:{SECRET}@cache/notadb", "the path must be a database number"),
        (f"redis+cluster://:{SECRET}@a/1", "Redis Cluster has only database 0"),
        (f"redis+sentinel://:{SECRET}@s1", "the path must name the master"),
        (f"redis+sentinel://:{SECRET}@s1/m/x", "the path must name the master"),
        (f"redis://:{SECRET}@cache/0?ssl_ca_certs=/ca.pem", "option ssl_ca_certs needs TLS"),
        (f"rediss://:{SECRET}@cache/0?{SECRET}=1", "unknown option in the query"),
        (f"rediss://:{SECRET}@cache/0?ssl_cert_reqs=maybe", "ssl_cert_reqs must be"),
        (f"rediss://:{SECRET}@c/0?ssl_ca_certs=", "option ssl_ca_certs needs a file path"),
        (f"rediss://:{SECRET}@c/0?ssl_certfile=a&ssl_certfile=b", "given twice"),
        ("rediss://c/0?ssl_cert_reqs=none&ssl_check_hostname=yes", "needs certificates"),
        (f"redis+sentinel://s1/m?sentinel_auth={SECRET}", "must be true or false"),
        ("redis+sentinel://s1/m?sentinel_auth=yes", "needs a user or password"),
        (f"redis://:{SECRET}@cache/0?sentinel_auth=yes", "unknown option"),
        (f"redis://:{SECRET}@cache/0#{SECRET}", "takes no #fragment"),
    ],
)
def test_bad_store_urls_are_refused_without_quoting_them(url: str, problem: str) -> None:
    with pytest.raises(InvalidStoreURL) as caught:
        parse_store_url(url)
    assert problem in caught.value.problem
    assert str(caught.value).startswith("store.url: ")
    assert SECRET not in "".join(traceback.format_exception(caught.value))
    # The config names the key and its line, and quotes nothing of the URL either.
    with pytest.raises(ConfigError) as found:
        loads(MINIMAL + f"store:\n  url: '{url}'\n")
    (line,) = [p for p in found.value.problems if p.startswith("store.url")]
    assert line.startswith("store.url (<config>, line 5): ") and problem in line
    assert SECRET not in str(found.value)


@given(
    st.text(min_size=1, max_size=30), st.sampled_from(["redis", "rediss+cluster", "redis+sentinel"])
)
def test_a_password_is_read_and_masked_whatever_it_holds(password: str, scheme: str) -> None:
    path = "/mymaster" if "sentinel" in scheme else "/0"
    url = f"{scheme}://user:{quote(password, safe='')}@h1:7000{path}"
    assert parse_store_url(url).password == password
    shown = masked_url(url)
    assert shown == f"{scheme}://user:***@h1:7000{path}"
    config = loads(MINIMAL + f"store:\n  url: '{url}'\n")
    assert config.masked()["store"]["url"] == shown


def test_the_keys_of_one_session_share_one_cluster_slot() -> None:
    """The Lua scripts get a session's state, lock and fence keys in one call: Redis Cluster
    runs a script only when all its keys hash to one slot (the cluster client refuses the
    call otherwise, which the contract suite on the cluster would show)."""
    store = RedisStore("redis+cluster://127.0.0.1:7000", ttl_seconds=60, key_prefix="cp:a.b")
    for session in ("s1", "conversation {1}", "x" * 200):
        keys = store._keys(session_key("tenant", session))
        assert len({key_slot(k.encode()) for k in keys}) == 1


async def test_open_store_picks_the_implementation() -> None:
    urls = [
        "memory://",
        "redis://127.0.0.1:6379/0",
        "rediss://localhost:6380/1",
        "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
        "rediss+sentinel://127.0.0.1:26379/mymaster",
    ]
    stores = [open_store(url, ttl_seconds=60) for url in urls]
    assert [type(s) for s in stores] == [MemoryStore, *[RedisStore] * 4]
    for store in stores:
        await store.close()


@pytest.mark.tls
async def test_rediss_checks_the_servers_certificate(certificates: Certificates) -> None:
    """A TLS server, with the CA given (it answers) and without (the certificate is refused:
    unavailable, and nothing of the URL in the error)."""
    port = free_port()
    with redis_server(port, tls=certificates):
        trusted = f"rediss://:{SECRET}@localhost:{port}/0?ssl_ca_certs={certificates.ca}"
        untrusted = f"rediss://:{SECRET}@localhost:{port}/0"
        plain = f"redis://:{SECRET}@localhost:{port}/0"
        for url, works in ((trusted, True), (untrusted, False), (plain, False)):
            store = RedisStore(url, ttl_seconds=60, timeout_seconds=1)
            key = session_key("tenant", url)
            try:
                if works:
                    assert await store.compare_and_set(key, 0, b"plan") == 1
                    assert await store.ping() is True
                else:
                    with pytest.raises(StoreUnavailable) as caught:
                        await store.get(key)
                    assert SECRET not in "".join(traceback.format_exception(caught.value))
            finally:
                await store.close()


def test_check_config_accepts_every_form() -> None:
    for url in (
        "redis://cache:6379/0",
        "rediss://:pw@cache:6380/0?ssl_ca_certs=/etc/ca.pem",
        "redis+cluster://a:7000,b:7001",
        "rediss+sentinel://:pw@s1,s2,s3/mymaster/0?sentinel_auth=yes",
    ):
        assert loads(MINIMAL + f"store:\n  url: '{url}'\n").store.url == url
