"""Prometheus metrics, one registry per app so that several apps can live in one process.

Every metric of a routed request carries the same labels (`RequestLabels`), each of a bounded
set of values: the API, the config's policy and upstream names, and the model as
`proxy.labels.ModelLabels` names it (names clients make up collapse into one value).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Generic, NamedTuple, TypeVar

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

from proxy.errors import APIError

__all__ = ["CONTENT_TYPE_LATEST", "Counter", "Metrics", "RequestLabels"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
_TOKEN_BUCKETS = tuple(2**i for i in range(8, 22))


class RequestLabels(NamedTuple):
    """The labels of every metric of a routed request, in this order before its own."""

    dialect: str  # the API: chat, responses, messages
    policy: str  # the route's policy, by its name in the config
    upstream: str  # the upstream, by its name in the config
    model: str  # proxy.labels.ModelLabels: a known model's name, else "other"


class CounterSeries:
    """One series of a counter."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class HistogramSeries:
    """One series of a histogram: the observations in each bucket (not yet cumulative) and
    their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1  # the first bound >= amount
        self.sum += amount


S = TypeVar("S", CounterSeries, HistogramSeries)


class _Family(Collector, Generic[S]):
    """A metric's series by their label values, exposed as prometheus_client's own.

    prometheus_client's metrics check and convert the label values at every `labels()` and
    check and lock at every update: a dozen times a request, 6% of a small request's
    instructions (bench/README.md). Here a series is looked up by its values, and updated as a
    plain number: only the event loop's thread updates them (every label has a bounded set of
    values, so the series are bounded too)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], S] = {}
        if not self.labelnames:
            self.labels()  # shown from the start, at 0, as prometheus_client does
        registry.register(self)

    def labels(self, *values: str) -> S:
        found = self._series.get(values)
        if found is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} has the labels {self.labelnames}, not {values}")
            found = self._series[values] = self._new()
        return found

    def describe(self) -> Iterator[Metric]:
        """The metric without its samples: the registry refuses a name registered twice."""
        yield self._family()

    def _new(self) -> S:
        raise NotImplementedError

    def _family(self) -> Metric:
        raise NotImplementedError


class Counter(_Family[CounterSeries]):
    def _new(self) -> CounterSeries:
        return CounterSeries()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def inc(self, amount: float = 1) -> None:
        """The unlabelled counter's inc."""
        self.labels().inc(amount)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, series in self._series.items():
            family.add_metric(values, series.value)
        yield family


class Histogram(_Family[HistogramSeries]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(bound) for bound in buckets]
        self.bounds = (*bounds, INF) if not bounds or bounds[-1] != INF else tuple(bounds)
        self._les = [_le(bound) for bound in self.bounds]
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new(self) -> HistogramSeries:
        return HistogramSeries(self.bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, series in self._series.items():
            total, buckets = 0, []
            for le, count in zip(self._les, series.counts, strict=True):
                total += count
                buckets.append((le, float(total)))
            family.add_metric(values, buckets, series.sum)
        yield family


def _le(bound: float) -> str:
    """A bucket's `le` label, as prometheus_client writes it."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]


REQUEST_LABELS = list(RequestLabels._fields)
# A request answered before it was routed (refused, or not of any API): no policy, upstream
# or model (a passthrough has its upstream).
UNROUTED = RequestLabels("", "", "", "")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "compaction_proxy_requests",
            "Requests handled, by route kind and status code, and the policy, upstream and model"
            " of those routed (empty for the others).",
            ["route", "status", "policy", "upstream", "model"],
            registry=r,
        )
        self.refusals = Counter(
            "compaction_proxy_refusals",
            "Requests the proxy refused or failed itself (not the upstream's errors), by status"
            " and reason: the error's code, else its type.",
            ["status", "reason"],
            registry=r,
        )
        self.actions = Counter(
            "compaction_proxy_compaction_actions",
            "Requests by what the proxy did to the conversation.",
            [*REQUEST_LABELS, "action"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "compaction_proxy_upstream_first_byte_seconds",
            "Time from sending upstream to the upstream's response head.",
            REQUEST_LABELS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "compaction_proxy_overhead_seconds",
            "Time the proxy spent on a request before forwarding it.",
            REQUEST_LABELS,
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.tokens_before = Histogram(
            "compaction_proxy_tokens_before",
            "Prompt tokens of incoming requests (proxy count).",
            REQUEST_LABELS,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens_after = Histogram(
            "compaction_proxy_tokens_after",
            "Prompt tokens forwarded upstream (proxy count).",
            REQUEST_LABELS,
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens_saved = Counter(
            "compaction_proxy_tokens_saved",
            "Prompt tokens received minus those forwarded upstream (proxy count; a request"
            " forwarded larger than it came counts 0).",
            REQUEST_LABELS,
            registry=r,
        )
        self.store_errors = Counter(
            "compaction_proxy_store_errors",
            "Session store operations that failed (the request was served fail-open).",
            ["operation"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "compaction_proxy_upstream_errors",
            "Upstream failures seen by the proxy: unreachable, or an answer broken off.",
            ["upstream", "kind"],
            registry=r,
        )
        self.upstream_prompt_tokens = Counter(
            "compaction_proxy_upstream_prompt_tokens",
            "Prompt tokens of forwarded requests as the upstream counted them (its usage).",
            REQUEST_LABELS,
            registry=r,
        )
        self.cached_prompt_tokens = Counter(
            "compaction_proxy_cached_prompt_tokens",
            "Of those, the tokens the upstream served from its prompt cache (its usage).",
            REQUEST_LABELS,
            registry=r,
        )
        self.cache_creation_tokens = Counter(
            "compaction_proxy_cache_creation_tokens",
            "Of those, the tokens the upstream wrote to its prompt cache (Anthropic's usage).",
            REQUEST_LABELS,
            registry=r,
        )
        self.exact_counts = Counter(
            "compaction_proxy_exact_counts",
            "Exact counts of requests near the compaction level (policy exact_count), by"
            " outcome: counted (asked of the upstream), cached (a prefix the upstream counted,"
            " plus the estimate of what followed), timeout, error (the estimate decided),"
            " cooling (not asked after a recent failure: the estimate decided).",
            ["outcome"],
            registry=r,
        )
        self.held_upstream = Counter(
            "compaction_proxy_held_upstream",
            "Requests forwarded unchanged because their history is held upstream, by reason "
            "(previous_response_id, conversation).",
            [*REQUEST_LABELS, "reason"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "compaction_proxy_upstream_retries",
            "Upstream requests tried again, by reason: before any byte reached the client, or"
            " compacted harder after the upstream said the prompt is too long (overflow).",
            ["upstream", "reason"],
            registry=r,
        )
        self.upstream_timeouts = Counter(
            "compaction_proxy_upstream_timeouts",
            "Upstream requests that timed out, by the phase that took too long.",
            ["upstream", "phase"],
            registry=r,
        )
        self.in_flight = Gauge(
            "compaction_proxy_requests_in_flight",
            "Requests being handled now (health, readiness and metrics probes aside).",
            registry=r,
        )
        self.websockets = Gauge(
            "compaction_proxy_websockets_open",
            "WebSocket connections to the Responses API open now.",
            registry=r,
        )
        self.websocket_histories_dropped = Counter(
            "compaction_proxy_websocket_histories_dropped",
            "Histories a WebSocket connection did not keep, over listen.websocket_history_bytes:"
            " the next request that continues one is answered previous_response_not_found.",
            registry=r,
        )
        self.target_unreachable = Counter(
            "compaction_proxy_target_unreachable",
            "Compactions that left the view at the compact level (fixed part and current turn"
            " over it: compacted), and turns replayed as they were rather than compacted again.",
            ["event"],
            registry=r,
        )
        self.summaries = Counter(
            "compaction_proxy_summaries",
            "Summarizer calls by outcome.",
            ["outcome"],
            registry=r,
        )
        self.compaction_summaries = Counter(
            "compaction_proxy_compaction_summaries",
            "Compactions that summarised evicted history, by what stood for it: llm (a summary"
            " on the request path), prepared (made ahead of time), digest (the summarizer failed"
            " or was late), settled (a late summary took the digest's place afterwards).",
            ["summary"],
            registry=r,
        )
        self.cooldowns = Counter(
            "compaction_proxy_summarizer_cooldowns",
            "Summarizer breakers tripped after repeated failure, by what was cooled: one"
            " credential (refused or rate-limited) or one upstream (errors, timeouts).",
            ["scope"],
            registry=r,
        )
        self.shadow_actions = Counter(
            "compaction_proxy_shadow_actions",
            "Requests under shadow mode (forwarded unchanged), by what the proxy would have"
            " done to the conversation (refused: context_length_exceeded).",
            ["action"],
            registry=r,
        )
        self.shadow_tokens_saved = Counter(
            "compaction_proxy_shadow_tokens_saved",
            "Prompt tokens that shadow mode would have saved (proxy count, before - after).",
            registry=r,
        )
        self.hook_calls = Counter(
            "compaction_proxy_hook_calls",
            "Compaction hook calls by hook (pre_compact, post_compact) and outcome (ok,"
            " timeout, error, dropped: too many under way).",
            ["hook", "outcome"],
            registry=r,
        )
        self.max_tokens_lowered = Counter(
            "compaction_proxy_max_tokens_lowered",
            "Requests sent with max_tokens lowered before their first try (policy"
            " max_tokens_overflow: lower): the prompt leaves the window less than they asked.",
            registry=r,
        )
        self.provider_compactions = Counter(
            "compaction_proxy_provider_compactions",
            "Provider compactions of the Responses API the proxy served itself (policy"
            " provider_compaction: serve), by how they were asked (compact: the compact"
            " endpoint, trigger: a compaction_trigger item) and what stands for the history"
            " (llm, digest: the summarizer failed).",
            ["via", "summary"],
            registry=r,
        )
        self.compaction_items_expanded = Counter(
            "compaction_proxy_compaction_items_expanded",
            "The proxy's own compaction items expanded into their summary before forwarding.",
            registry=r,
        )

    def answered(self, route: str, status: int, routed: RequestLabels = UNROUTED) -> None:
        """One request answered, with the policy, upstream and model it was routed to."""
        self.requests.labels(route, str(status), routed.policy, routed.upstream, routed.model).inc()

    def forwarded(
        self, labels: RequestLabels, action: str, tokens_before: int, tokens_after: int
    ) -> None:
        """What the proxy did to a request it forwarded, and the prompt tokens it saved."""
        self.actions.labels(*labels, action).inc()
        self.tokens_before.labels(*labels).observe(tokens_before)
        self.tokens_after.labels(*labels).observe(tokens_after)
        self.tokens_saved.labels(*labels).inc(max(0, tokens_before - tokens_after))

    def refused(self, route: str, error: APIError) -> None:
        """A request answered with an error of the proxy's own, and why: the error's code (one
        of the proxy's: a provider's error through litellm is relayed as the upstream's,
        never raised), else its type."""
        self.answered(route, error.status_code)
        self.refusals.labels(str(error.status_code), error.code or error.error_type).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
