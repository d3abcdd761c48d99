"""What /metrics says an operator can slice and alert on: the labels of a routed request (policy,
upstream, and a model label that stays bounded whatever names clients send), the tokens
compaction saved, the proxy's own refusals by reason, and no `_created` series."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import loads
from proxy.credentials import hash_key
from proxy.models.catalog import ModelCatalog
from proxy.observability import metrics
from proxy.observability.labels import MAX_MODELS, OTHER, ModelLabels
from proxy.observability.worker_metrics import Worker, WorkerMetrics
from tests.conftest import ConfigFactory, examples, metric
from tests.fakes.openai import FakeUpstream, count_prompt_tokens
from tests.harness import harness
from tests.servers import ServerThread, proxy_server

CHAT = "/v1/chat/completions"
PROXY_KEY = "proxy-key-of-the-metrics-tests"


def samples(http: httpx.Client, server: ServerThread) -> list[tuple[str, dict[str, str]]]:
    text = http.get(server.url + "/metrics").text
    return [
        (sample.name, sample.labels)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def chat(model: str, text: str = "hi") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


@pytest.fixture
def routed(proxy_config: ConfigFactory, upstream: FakeUpstream) -> Iterator[ServerThread]:
    """Two upstreams (`fake`, and `team` for models `team-*` with the policy `tight`), a model
    the config names (`small-8k`) and one it names by a glob (`team-*`)."""
    config = proxy_config(
        upstreams={"team": {"base_url": upstream.base_url}},
        default_upstream="fake",
        models=[{"match": "small-8k", "context_window": 8192}],
        policies={"default": {}, "tight": {"compact_at": 0.8, "target": 0.5}},
        routes=[{"model": "team-*", "policy": "tight", "upstream": "team"}],
    )
    with proxy_server(config) as server:
        yield server


def test_request_metrics_carry_policy_upstream_and_a_bounded_model(
    http: httpx.Client, routed: ServerThread, upstream: FakeUpstream
) -> None:
    sent = ["small-8k", "gpt-4o-mini", "team-alpha", "team-beta", "mystery-1", "mystery-2"]
    for model in sent:
        assert http.post(routed.url + CHAT, json=chat(model)).status_code == 200
    expected = {
        ("default", "fake", "small-8k"): ["small-8k"],  # the config names it
        ("default", "fake", "gpt-4o-mini"): ["gpt-4o-mini"],  # the model map knows it
        ("tight", "team", "team-*"): ["team-alpha", "team-beta"],  # a route's glob
        ("default", "fake", OTHER): ["mystery-1", "mystery-2"],  # nobody knows them
    }
    for (policy, up, model), models in expected.items():
        labels = {"dialect": "chat", "policy": policy, "upstream": up, "model": model}
        requests = {"route": "chat", "status": "200", "policy": policy, "upstream": up}
        prompt = sum(count_prompt_tokens(chat(m)) for m in models)
        count = len(models)
        answered = metric(http, routed, "compaction_proxy_requests_total", **requests, model=model)
        assert answered == count
        assert metric(http, routed, "compaction_proxy_tokens_before_count", **labels) == count
        assert metric(http, routed, "compaction_proxy_overhead_seconds_count", **labels) == count
        actions = {**labels, "action": "none"}
        assert metric(http, routed, "compaction_proxy_compaction_actions_total", **actions) == count
        # The upstream's own count, and its cache: the fake reports 0 cached, which is a series.
        upstream_prompt = "compaction_proxy_upstream_prompt_tokens_total"
        assert metric(http, routed, upstream_prompt, **labels) == prompt
        cached = "compaction_proxy_cached_prompt_tokens_total"
        assert (cached, labels) in samples(http, routed)
    models = {labels["model"] for _, labels in samples(http, routed) if "model" in labels}
    assert models == {"small-8k", "gpt-4o-mini", "team-*", OTHER}


def test_a_passthrough_names_its_upstream(
    http: httpx.Client, routed: ServerThread, upstream: FakeUpstream
) -> None:
    assert http.get(routed.url + "/v1/models").status_code == 200
    labels = {"route": "passthrough", "status": "200", "policy": "", "upstream": "fake"}
    assert metric(http, routed, "compaction_proxy_requests_total", **labels, model="") == 1


def test_tokens_saved_are_what_compaction_took_off() -> None:
    with harness() as h:
        conversation = h.conversation()
        saved = 0
        for _ in range(60):
            headers = conversation.say()
            before = int(headers["x-compaction-tokens-before"])
            after = int(headers["x-compaction-tokens-after"])
            saved += before - after
            if headers["x-compaction-action"] == "compacted":
                break
        assert headers["x-compaction-action"] == "compacted" and before > after
        labels = {"dialect": "chat", "policy": "default", "upstream": "fake", "model": "gpt-4"}
        assert h.metric("compaction_proxy_tokens_saved_total", **labels) == saved
        before_sum = h.metric("compaction_proxy_tokens_before_sum", **labels)
        after_sum = h.metric("compaction_proxy_tokens_after_sum", **labels)
        assert before_sum - after_sum == saved


def test_refusals_are_counted_by_reason(
    http: httpx.Client, proxy_config: ConfigFactory, upstream: FakeUpstream
) -> None:
    config = proxy_config(
        listen={"max_body_bytes": 64_000},
        auth={"header": "X-Proxy-Key", "keys": [{"id": "ops", "sha256": hash_key(PROXY_KEY)}]},
        models=[{"match": "gpt-4", "context_window": 4096}],
    )
    key = {"x-proxy-key": PROXY_KEY}
    refusals = {
        # status, reason: how many requests to refuse so
        ("400", "invalid_request_error"): lambda: http.post(url + CHAT, content=b"{", headers=key),
        ("400", "invalid_type"): lambda: http.post(
            url + CHAT,
            json={"model": "gpt-4", "messages": [{"role": "user", "content": 5}]},
            headers=key,
        ),
        # Even the current turn alone cannot fit the model's window (counted exactly).
        ("400", "context_length_exceeded"): lambda: http.post(
            url + CHAT, json=chat("gpt-4", "word " * 5000), headers=key
        ),
        ("401", "invalid_api_key"): lambda: http.post(url + CHAT, json=chat("gpt-4")),
        ("404", "not_found"): lambda: http.get(url + "/nowhere", headers=key),
        ("413", "request_too_large"): lambda: http.post(
            url + CHAT, json=chat("gpt-4", "x" * 70_000), headers=key
        ),
    }
    with proxy_server(config) as server:
        url = server.url
        for (status, reason), send in refusals.items():
            response = send()
            assert str(response.status_code) == status, reason
            assert response.json()["error"]["code"] in (reason, None), reason
            assert metric(http, server, "compaction_proxy_refusals_total", reason=reason) == 1
        found = {
            (labels["status"], labels["reason"])
            for name, labels in samples(http, server)
            if name == "compaction_proxy_refusals_total"
        }
        assert found == set(refusals)
        assert metric(http, server, "compaction_proxy_requests_total", route="error") == 6
    assert upstream.requests == []


def test_unreachable_upstreams_are_counted_by_name(http: httpx.Client, closed_port: int) -> None:
    config = loads(f"upstreams:\n  gone:\n    base_url: http://127.0.0.1:{closed_port}/v1\n")
    with proxy_server(config) as server:
        assert http.post(server.url + CHAT, json=chat("small-8k")).status_code == 502
        assert http.get(server.url + "/v1/models").status_code == 502
        errors = {"upstream": "gone", "kind": "unreachable"}
        assert metric(http, server, "compaction_proxy_upstream_errors_total", **errors) == 2
        refusals = {"status": "502", "reason": "upstream_unreachable"}
        assert metric(http, server, "compaction_proxy_refusals_total", **refusals) == 2


def test_no_created_series(
    http: httpx.Client, routed: ServerThread, upstream: FakeUpstream
) -> None:
    http.post(routed.url + CHAT, json=chat("small-8k"))
    text = http.get(routed.url + "/metrics").text
    assert "compaction_proxy_requests_total{" in text
    assert "_created" not in text
    # Left as they are in any other registry of the process.
    other = CollectorRegistry()
    Counter("elsewhere", "A counter of another registry.", registry=other).inc()
    assert b"elsewhere_created" in generate_latest(other)


BOUNDS = (0.5, 1, 2.5, 100)
WITH_INF = (0.5, 1, float("inf"))
amounts = st.one_of(
    st.sampled_from([0, *BOUNDS]),  # on a bound: in that bucket, as prometheus_client has it
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.integers(min_value=0, max_value=2**40),
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), amounts), max_size=40))
def test_the_series_are_exposed_as_prometheus_client_exposes_its_own(
    updates: list[tuple[str, float]],
) -> None:
    """The proxy's counters and histograms (lock-free series of plain numbers) give the
    exposition of prometheus_client's, but for its `_created` series."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    ours_histogram = metrics.Histogram("h", "A histogram.", ["x"], buckets=BOUNDS, registry=ours)
    ours_counter = metrics.Counter("c", "A counter.", ["x"], registry=ours)
    ours_total = metrics.Counter("t", "An unlabelled counter.", registry=ours)
    their_histogram = Histogram("h", "A histogram.", ["x"], buckets=BOUNDS, registry=theirs)
    their_counter = Counter("c", "A counter.", ["x"], registry=theirs)
    their_total = Counter("t", "An unlabelled counter.", registry=theirs)
    # Buckets that name +Inf themselves get no second one.
    ours_inf = metrics.Histogram("i", "Ending in +Inf.", ["x"], buckets=WITH_INF, registry=ours)
    their_inf = Histogram("i", "Ending in +Inf.", ["x"], buckets=WITH_INF, registry=theirs)
    for label, amount in updates:
        for histogram, counter, total in (
            (ours_histogram, ours_counter, ours_total),
            (their_histogram, their_counter, their_total),
        ):
            histogram.labels(label).observe(amount)
            counter.labels(label).inc(amount)
            total.inc(amount)
        for inf in (ours_inf, their_inf):
            inf.labels(label).observe(amount)
    expected = [line for line in generate_latest(theirs).splitlines() if b"_created" not in line]
    assert generate_latest(ours).splitlines() == expected


def test_a_counter_refuses_to_go_down_wrong_labels_and_a_name_taken() -> None:
    registry = CollectorRegistry()
    counter = metrics.Counter("c", "A counter.", ["x", "y"], registry=registry)
    with pytest.raises(ValueError):
        counter.labels("a", "b").inc(-1)
    with pytest.raises(ValueError):
        counter.labels("a")
    with pytest.raises(ValueError):
        metrics.Histogram("c", "Another.", buckets=(1,), registry=registry)


# -- the model label ---------------------------------------------------------------------------

CONFIG = """
upstreams:
  openai: {base_url: "http://127.0.0.1:9/v1"}
  claude: {kind: litellm, provider_model: "anthropic/{model}"}
default_upstream: openai
models:
  - {match: "house-model", context_window: 8192}
  - {match: "ft:*", context_window: 16384}
routes:
  - {model: "claude-*", policy: default, upstream: claude}
"""


@pytest.fixture(scope="module")
def model_labels() -> Iterator[ModelLabels]:
    yield ModelLabels(loads(CONFIG), ModelCatalog())


@pytest.mark.parametrize(
    ("model", "upstream", "label"),
    [
        ("house-model", "openai", "house-model"),  # named by the config
        ("gpt-4o", "openai", "gpt-4o"),  # a name of the model map
        ("azure/eu/gpt-4o", "openai", "azure/eu/gpt-4o"),  # the map has it under that name
        ("made-up/gpt-4o", "openai", "gpt-4o"),  # a prefix the map does not know: tried off
        ("gpt-4o-2099-01-01", "openai", "gpt-4o"),  # an unknown snapshot of a known model
        ("ft:gpt-4o:acme:42", "openai", "ft:*"),  # a config glob
        ("claude-next-9", "claude", "claude-*"),  # a route's glob, unknown to the map
        ("mystery", "openai", OTHER),
    ],
)
def test_the_model_label(model_labels: ModelLabels, model: str, upstream: str, label: str) -> None:
    config = model_labels.config
    assert model_labels.label(model, config.upstreams[upstream]) == label


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.text(min_size=1, max_size=30), max_size=20))
def test_labels_are_known_names_whatever_clients_send(names: list[str]) -> None:
    config = loads(CONFIG)
    labels = ModelLabels(config, ModelCatalog())
    known = {"house-model", "ft:*", "claude-*", OTHER}
    for name in names:
        label = labels.label(name, config.upstreams["openai"])
        assert label in known or labels.catalog.name(label) == label


def test_past_max_models_names_collapse_into_other(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    names = [f"model-{n}" for n in range(MAX_MODELS + 5)]
    path.write_bytes(orjson.dumps({name: {"max_input_tokens": 8_000} for name in names}))
    config = loads(CONFIG)
    labels = ModelLabels(config, ModelCatalog(path))
    openai = config.upstreams["openai"]
    given = [labels.label(name, openai) for name in names]
    assert given == names[:MAX_MODELS] + [OTHER] * 5
    # The names labelled first keep their label; the config's are known names like any other.
    assert labels.label(names[0], openai) == names[0]
    assert labels.label("house-model", openai) == OTHER


async def test_workers_metrics_are_summed_and_one_that_does_not_answer_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three workers of one parent, the third not serving: the first's scrape shows its own
    and the second's requests, summed, and says that the third's are missing."""
    parent = 4_000_000_000 + os.getpid()  # above any pid: no real parent's sockets
    first, second = metrics.Metrics(), metrics.Metrics()
    first.answered("chat", 200)
    for _ in range(2):
        second.answered("chat", 200)
    second.in_flight.inc()
    workers = [WorkerMetrics(m, Worker(i, 3, parent)) for i, m in enumerate((first, second))]
    for worker in workers:
        await worker.start()
    try:
        with caplog.at_level("WARNING", logger="compaction_proxy"):
            text = (await workers[0].render()).decode()
    finally:
        for worker in workers:
            await worker.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (requests,) = families["compaction_proxy_requests"].samples
    assert requests.labels["route"] == "chat" and requests.value == 3
    assert families["compaction_proxy_requests_in_flight"].samples[0].value == 1
    assert [r.worker for r in caplog.records] == [2]  # type: ignore[attr-defined]
