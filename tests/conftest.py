"""Shared fixtures: the strict fake upstream and the proxy in front of it, both on loopback.

One fake upstream and one proxy serve the whole session (`upstream` resets the fake for each
test); tests whose config differs build their own proxy with `proxy_config` and `proxy_server`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml
from hypothesis import settings
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import Config, loads
from proxy.models.tokens import configure_offline_encodings
from tests.fakes.openai import FakeUpstream
from tests.redis_servers import (
    Certificates,
    Cluster,
    Sentinels,
    make_certificates,
    redis_cluster,
    redis_sentinels,
)
from tests.servers import ServerThread, proxy_server

configure_offline_encodings()  # before any test asks tiktoken for an encoding

# Hypothesis profiles. `ci` (where CI is set, as .ci/run does) runs every property's full count
# of examples, the same ones each run (derandomized: a failure is the commit's, not the seed's)
# and without a deadline (a loaded runner is slow, not wrong). `dev`, elsewhere, runs a fifth
# of them, new ones each run; a failing example is kept in .hypothesis/ and tried first next
# time. HYPOTHESIS_PROFILE=ci|dev chooses one.
FULL_EXAMPLES = 100  # Hypothesis's default count
settings.register_profile("ci", max_examples=FULL_EXAMPLES, derandomize=True, deadline=None)
settings.register_profile("dev", max_examples=FULL_EXAMPLES // 5)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


def examples(full: int) -> int:
    """A property's count of examples: `full` under the `ci` profile, the profile's share of it
    under another."""
    return max(1, full * settings.default.max_examples // FULL_EXAMPLES)


WINDOWS = {"small-8k": 8192, "gpt-4o-mini": 128_000, "gpt-4": 8192}

ConfigFactory = Callable[..., Config]
SDK = Callable[[ServerThread, list[httpx.Request]], openai.OpenAI]


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in, mappings key by key."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def config_for(up: FakeUpstream, **sections: Any) -> Config:
    """A config whose one upstream, `fake`, is `up`; `sections` are merged into it."""
    data = merged({"upstreams": {"fake": {"base_url": up.base_url}}}, sections)
    return loads(yaml.safe_dump(data))


def metric(http: httpx.Client, server: ServerThread, name: str, **labels: str) -> float:
    """The sum of the proxy's /metrics samples of `name` that have these label values, as
    PromQL's `sum(name{labels})` (0 when there is none)."""
    text = http.get(server.url + "/metrics").text
    return math.fsum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


@contextlib.contextmanager
def captured(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The proxy's log records in `caplog`, whether or not its logger propagates."""
    logger = logging.getLogger("compaction_proxy")
    logger.addHandler(caplog.handler)
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)


@pytest.fixture(scope="session")
def shared_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(windows=WINDOWS) as up:
        yield up


@pytest.fixture
def upstream(shared_upstream: FakeUpstream) -> Iterator[FakeUpstream]:
    """The session's fake upstream, with no requests recorded and its default settings."""
    up = shared_upstream
    up.reset()
    yield up
    up.behavior, up.api_key = "", None


@pytest.fixture(scope="session")
def shared_server(shared_upstream: FakeUpstream) -> Iterator[ServerThread]:
    with proxy_server(config_for(shared_upstream)) as server:
        yield server


@pytest.fixture
def server(shared_server: ServerThread, upstream: FakeUpstream) -> ServerThread:
    """The proxy on the default config, in front of `upstream`."""
    return shared_server


@pytest.fixture
def proxy_config(upstream: FakeUpstream) -> ConfigFactory:
    """`proxy_config(listen={...}, ...)`: a config in front of `upstream`, sections merged in."""
    return lambda **sections: config_for(upstream, **sections)


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def http() -> Iterator[httpx.Client]:
    """One HTTP client for the session: making a client costs tens of milliseconds."""
    with httpx.Client(timeout=10) as client:
        yield client


@pytest.fixture
def sdk() -> Iterator[SDK]:
    """`sdk(server, sent)`: the sync SDK pointed at a proxy, recording every request it sends
    in `sent`; closed when the test ends."""
    with contextlib.ExitStack() as stack:

        def client(server: ServerThread, sent: list[httpx.Request]) -> openai.OpenAI:
            http = httpx.Client(event_hooks={"request": [sent.append]})
            url = server.url + "/v1"
            sdk = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0, http_client=http)
            return stack.enter_context(sdk)

        yield client


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A CA and a server certificate for 127.0.0.1, for the tests' TLS servers."""
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def tls_cluster(certificates: Certificates) -> Iterator[Cluster]:
    """A Redis Cluster over TLS (3 masters, a replica each) the whole session shares; tests
    that break servers start their own."""
    with redis_cluster(tls=certificates) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def tls_sentinels(certificates: Certificates) -> Iterator[Sentinels]:
    """A master, a replica and 3 Sentinels over TLS, shared like `tls_cluster`."""
    with redis_sentinels(tls=certificates) as sentinels:
        yield sentinels
