"""Prometheus metrics, one registry per app so that several apps can live in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
_TOKEN_BUCKETS = tuple(2**i for i in range(8, 22))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "compaction_proxy_requests",
            "Requests handled, by route kind and status code.",
            ["route", "status"],
            registry=r,
        )
        self.actions = Counter(
            "compaction_proxy_compaction_actions",
            "Chat completions by what the proxy did to the conversation.",
            ["action"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "compaction_proxy_upstream_first_byte_seconds",
            "Time from sending upstream to the upstream's response head.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "compaction_proxy_overhead_seconds",
            "Time the proxy spent on a chat request before forwarding it.",
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.tokens_before = Histogram(
            "compaction_proxy_tokens_before",
            "Prompt tokens of incoming chat requests (proxy count).",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.tokens_after = Histogram(
            "compaction_proxy_tokens_after",
            "Prompt tokens forwarded upstream (proxy count).",
            buckets=_TOKEN_BUCKETS,
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
            "Upstream failures seen by the proxy.",
            ["kind"],
            registry=r,
        )
        self.upstream_prompt_tokens = Counter(
            "compaction_proxy_upstream_prompt_tokens",
            "Prompt tokens of forwarded requests as the upstream counted them (its usage).",
            ["dialect"],
            registry=r,
        )
        self.cached_prompt_tokens = Counter(
            "compaction_proxy_cached_prompt_tokens",
            "Of those, the tokens the upstream served from its prompt cache (its usage).",
            ["dialect"],
            registry=r,
        )
        self.cache_creation_tokens = Counter(
            "compaction_proxy_cache_creation_tokens",
            "Of those, the tokens the upstream wrote to its prompt cache (Anthropic's usage).",
            ["dialect"],
            registry=r,
        )
        self.held_upstream = Counter(
            "compaction_proxy_held_upstream",
            "Requests forwarded unchanged because their history is held upstream, by reason "
            "(previous_response_id, conversation).",
            ["dialect", "reason"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "compaction_proxy_upstream_retries",
            "Upstream requests tried again before any byte reached the client, by reason.",
            ["reason"],
            registry=r,
        )
        self.upstream_timeouts = Counter(
            "compaction_proxy_upstream_timeouts",
            "Upstream requests that timed out, by the phase that took too long.",
            ["phase"],
            registry=r,
        )
        self.in_flight = Gauge(
            "compaction_proxy_requests_in_flight",
            "Requests being handled now (health, readiness and metrics probes aside).",
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
            " done to the conversation.",
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
