"""Exact counts near the compaction level (a policy's `exact_count: {via: count_tokens}`): the
official `anthropic` SDK as the client, the strict fake Anthropic API as the upstream, whose
`count_tokens` counts as its own window check does (unlike the proxy's estimate)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
import yaml

from proxy.config import Config, ConfigError, loads
from proxy.dialects.anthropic.messages import COUNT_FIELDS, Messages
from proxy.models.limits import ModelLimits
from tests.conftest import merged, metric
from tests.conversations import words
from tests.fakes.anthropic import FakeAnthropic
from tests.servers import ServerThread, proxy_server

KEY = "sk-ant-api03-test"
SMALL = "claude-small"  # 8k for the proxy and the fake
WINDOW = 8192
MAX_TOKENS = 500
COUNT_PATH = "/v1/messages/count_tokens"
EXACT = {"policies": {"default": {"exact_count": {"via": "count_tokens"}}}}
CJK = "中文测试文本"  # the estimate counts it about four times too low
LONG_WORDS = "internationalization "  # and this about twice too high
COUNTER = ModelLimits(loads("upstreams: {u: {base_url: 'http://127.0.0.1:1/v1'}}"))


def config(up: FakeAnthropic, **sections: Any) -> Config:
    data = {
        "upstreams": {"claude": {"base_url": up.base_url + "/v1", "kind": "anthropic"}},
        "models": [{"match": SMALL, "context_window": WINDOW}],
        "admin": {"token": "admin-token"},
    }
    return loads(yaml.safe_dump(merged(data, sections)))


@pytest.fixture(scope="module")
def up() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(windows={SMALL: WINDOW}) as fake:
        yield fake


@pytest.fixture(autouse=True)
def fresh(up: FakeAnthropic) -> None:
    up.reset()
    up.count_behavior = ""


def client_of(server: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def send(server: ServerThread, messages: list[dict[str, Any]], session: str) -> httpx.Headers:
    """A Messages request through the proxy; the answer's headers."""
    with client_of(server) as client:
        raw = client.messages.with_raw_response.create(
            model=SMALL,
            max_tokens=MAX_TOKENS,
            messages=messages,
            extra_headers={"X-Session-Id": session},
        )
    assert raw.http_response.status_code == 200
    return raw.headers


def counts(up: FakeAnthropic) -> list[dict[str, Any]]:
    """The count_tokens requests that reached the fake."""
    return [r.json for r in up.requests if r.path == COUNT_PATH]


def texts(messages: list[dict[str, Any]]) -> list[str]:
    """The text of each message, whatever its form (the proxy may add breakpoints)."""
    return [
        m["content"]
        if isinstance(m["content"], str)
        else "".join(b.get("text", "") for b in m["content"])
        for m in messages
    ]


def compact_level(cfg: Config) -> int:
    """The compaction level of a session the proxy has not calibrated yet."""
    policy = cfg.policies["default"].compaction
    return policy.budget(WINDOW, None, MAX_TOKENS).compact_tokens


def estimate(messages: list[dict[str, Any]]) -> int:
    """The proxy's own (uncalibrated) count of a request (Claude models: the estimate)."""
    dialect = Messages()
    parsed = dialect.parse(orjson.dumps({"model": SMALL, "max_tokens": 1, "messages": messages}))
    counter = COUNTER.limits(SMALL).counter
    return dialect.fixed_tokens(parsed, counter) + sum(counter.message(m) for m in parsed.messages)


def crafted(
    cfg: Config,
    up: FakeAnthropic,
    share: float,
    filler: str,
    wanted: Callable[[float, float], bool],
) -> list[dict[str, Any]]:
    """A conversation whose estimate and exact count, as shares of the compaction level,
    are `wanted`: rounds of English up to `share` of the level by the estimate, and the
    question padded with `filler`."""
    level = compact_level(cfg)
    base: list[dict[str, Any]] = []
    while estimate(base) < share * level:
        turn = len(base) // 2
        base += [
            {"role": "user", "content": f"Turn {turn}: {words(150, turn)}"},
            {"role": "assistant", "content": "Noted."},
        ]
    repeats = 0
    while True:
        messages = [*base, {"role": "user", "content": f"What now? {filler * repeats}"}]
        guess = estimate(messages) / level
        if guess > 1.2:
            raise AssertionError("no conversation of that kind")
        if wanted(guess, up.count({"model": SMALL, "messages": messages}) / level):
            return messages
        repeats += 4


def near_but_under(cfg: Config, up: FakeAnthropic) -> list[dict[str, Any]]:
    """Estimated within the margin under the level, counted over it (and within the fake's
    window, so that it is answered uncompacted)."""
    return crafted(
        cfg,
        up,
        0.82,
        CJK,
        lambda guess, exact: (
            0.9 <= guess < 0.97 and exact >= 1.03 and exact * compact_level(cfg) < WINDOW - 600
        ),
    )


def test_a_count_over_the_level_compacts_what_the_estimate_would_forward(
    up: FakeAnthropic,
) -> None:
    on = config(up, **EXACT)
    messages = near_but_under(on, up)
    with proxy_server(config(up)) as proxy:  # off: the estimate decides
        assert send(proxy, messages, "off")["x-compaction-action"] == "none"
    assert counts(up) == []

    with proxy_server(on) as proxy:
        headers = send(proxy, messages, "on")
        assert headers["x-compaction-action"] in ("compacted", "degraded")
        admin = {"authorization": "Bearer admin-token"}
        key = headers["x-compaction-session"]
        session = httpx.get(f"{proxy.url}/admin/sessions/{key}", headers=admin).json()
    (counted,) = counts(up)
    # The request as it would have gone: only the fields count_tokens takes, its credential.
    assert counted.keys() <= COUNT_FIELDS and counted["model"] == SMALL
    assert texts(counted["messages"]) == texts(messages)
    request = next(r for r in up.requests if r.path == COUNT_PATH)
    sent = request.headers
    assert KEY in (sent.get("x-api-key"), sent.get("authorization", "").removeprefix("Bearer "))
    assert "anthropic-version" in sent
    # The exact count calibrated the session: the upstream's count over the proxy's.
    exact = up.count({"model": SMALL, "messages": messages})
    assert session["calibration"] == pytest.approx(exact / estimate(messages), rel=0.01)


def test_a_count_under_the_level_forwards_what_the_estimate_would_compact(
    up: FakeAnthropic,
) -> None:
    on = config(up, **EXACT)
    messages = crafted(
        on, up, 0.6, LONG_WORDS, lambda guess, exact: 1.03 <= guess < 1.1 and exact < 0.95
    )
    with proxy_server(config(up)) as proxy:
        assert send(proxy, messages, "off")["x-compaction-action"] in ("compacted", "degraded")
    with proxy_server(on) as proxy:
        assert send(proxy, messages, "on")["x-compaction-action"] == "none"
    assert len(counts(up)) == 1
    assert texts(up.requests[-1].json["messages"]) == texts(messages)  # forwarded whole


def test_counts_are_asked_near_the_level_only_and_once_per_prefix(up: FakeAnthropic) -> None:
    cfg = config(up, **EXACT)
    level = compact_level(cfg)
    asked: list[int] = []  # the estimates of the requests that were counted
    repeated = 0
    with proxy_server(cfg) as proxy, httpx.Client() as http:
        messages: list[dict[str, Any]] = []
        for turn in range(80):
            messages.append({"role": "user", "content": f"Turn {turn}: {words(100, turn)}"})
            before = len(counts(up))
            headers = send(proxy, messages, "growing")
            action = headers["x-compaction-action"]
            if len(counts(up)) > before:
                asked.append(int(headers["x-compaction-tokens-before"]))
                if action == "none":  # the same request again: its count is known
                    assert send(proxy, messages, "growing")["x-compaction-action"] == "none"
                    assert len(counts(up)) == before + 1
                    repeated += 1
            messages.append({"role": "assistant", "content": "Noted."})
            if action in ("compacted", "degraded"):
                break
        else:
            raise AssertionError("never compacted")
        cached = metric(http, proxy, "compaction_proxy_exact_counts_total", outcome="cached")
    # One count while the session crossed the margin below the level; far from it, none.
    assert len(asked) == 1 and asked[0] >= 0.8 * level
    assert repeated == 1
    assert cached >= 2  # the repeat, and the turns that extended the counted prefix


@pytest.mark.parametrize(("behavior", "outcome"), [("status:500", "error"), ("hang", "timeout")])
def test_a_count_that_fails_or_is_late_leaves_the_estimate_to_decide(
    up: FakeAnthropic, behavior: str, outcome: str
) -> None:
    cfg = config(
        up, policies={"default": {"exact_count": {"via": "count_tokens", "timeout_seconds": 0.5}}}
    )
    messages = near_but_under(cfg, up)
    up.count_behavior = behavior
    with proxy_server(cfg) as proxy, httpx.Client() as http:
        assert send(proxy, messages, outcome)["x-compaction-action"] == "none"
        # The upstream's count endpoint cools down: another session near the level is not
        # counted (nor waits for a count), the estimate decides at once.
        assert send(proxy, messages, f"{outcome}-2")["x-compaction-action"] == "none"
        failed = metric(http, proxy, "compaction_proxy_exact_counts_total", outcome=outcome)
        cooling = metric(http, proxy, "compaction_proxy_exact_counts_total", outcome="cooling")
    assert len(counts(up)) == 1 and failed == 1 and cooling == 1


def test_a_failing_count_cools_its_model_only(up: FakeAnthropic) -> None:
    """One caller's model that the upstream cannot count does not leave every other model of
    it on the estimate."""
    other = "claude-other"
    cfg = config(
        up,
        models=[{"match": m, "context_window": WINDOW} for m in (SMALL, other)],
        **EXACT,
    )
    messages = near_but_under(cfg, up)
    up.count_behavior = "status:500"
    with proxy_server(cfg) as proxy, httpx.Client() as http:
        send(proxy, messages, "small")
        with client_of(proxy) as client:
            client.messages.create(
                model=other,
                max_tokens=MAX_TOKENS,
                messages=messages,  # type: ignore[arg-type]
                extra_headers={"X-Session-Id": "other-model"},
            )
        assert metric(http, proxy, "compaction_proxy_exact_counts_total", outcome="cooling") == 0
        send(proxy, messages, "small-again")
        cooling = metric(http, proxy, "compaction_proxy_exact_counts_total", outcome="cooling")
    assert [c["model"] for c in counts(up)] == [SMALL, other] and cooling == 1


@pytest.mark.parametrize(("behavior", "asked"), [("status:400", 3), ("status:429", 2)])
def test_a_refused_count_cools_its_credential_only_or_nothing_for_its_body(
    up: FakeAnthropic, behavior: str, asked: int
) -> None:
    """429 (or 401, 403): the credential's counts cool down, not another's. 400: the body was
    at fault, nothing cools down."""
    cfg = config(up, **EXACT)
    messages = near_but_under(cfg, up)
    up.count_behavior = behavior
    with proxy_server(cfg) as proxy, httpx.Client() as http:
        send(proxy, messages, "first")
        send(proxy, messages, "same-key")
        with anthropic.Anthropic(base_url=proxy.url, api_key=KEY + "-other", max_retries=0) as c:
            c.messages.create(
                model=SMALL,
                max_tokens=MAX_TOKENS,
                messages=messages,  # type: ignore[arg-type]
                extra_headers={"X-Session-Id": "other-key"},
            )
        cooling = metric(http, proxy, "compaction_proxy_exact_counts_total", outcome="cooling")
    assert len(counts(up)) == asked and cooling == 3 - asked


def test_the_settings_are_checked_at_start_up(up: FakeAnthropic) -> None:
    for settings, problem in [
        ({"margin": 0}, r"exact_count\.margin.*must be above 0 and at most 1"),
        ({"margin": 1.5}, r"exact_count\.margin.*must be above 0 and at most 1"),
        ({"timeout_seconds": 0}, r"exact_count\.timeout_seconds.*must be positive"),
        ({"cooldown_seconds": -1}, r"exact_count\.cooldown_seconds.*must not be negative"),
        ({"via": "tokenizer"}, r"exact_count\.via"),
    ]:
        with pytest.raises(ConfigError, match=problem):
            config(up, policies={"default": {"exact_count": settings}})
