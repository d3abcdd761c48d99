"""The retrieval tool's metrics, in the app's registry beside the others."""

from __future__ import annotations

from proxy.observability.metrics import Counter, Metrics


class RetrievalMetrics:
    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.retrievals = Counter(
            "compaction_proxy_retrievals",
            "Calls of the retrieval tool the proxy answered, by outcome (served, unknown: no"
            " such handle in the session, gone: evicted, invalid: bad arguments, unavailable:"
            " the store failed).",
            ["outcome"],
            registry=r,
        )
        self.bytes_served = Counter(
            "compaction_proxy_retrieval_bytes",
            "Bytes of kept originals the retrieval tool returned.",
            registry=r,
        )
        self.rounds = Counter(
            "compaction_proxy_retrieval_rounds",
            "Hidden rounds: upstream calls the proxy made to continue after answering its tool,"
            " by API.",
            ["dialect"],
            registry=r,
        )
        self.mixed = Counter(
            "compaction_proxy_retrieval_dropped_calls",
            "Calls of the retrieval tool taken out of an answer (beside client tools' calls, or"
            " past max_rounds), by API.",
            ["dialect"],
            registry=r,
        )
