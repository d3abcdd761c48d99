"""The metrics of `serve --workers N` as one: a scrape reaches whichever worker the kernel
hands its connection to, so each answers with the sum of every worker's series. Per-process
series would make each scrape show another worker's counters, which Prometheus reads as
resets.

Each worker answers its siblings on a Unix socket of its own with its samples (JSON); the
worker a scrape reaches asks them all at once and adds theirs to its own: counters and
histograms are the workers' sums, gauges (requests in flight, WebSockets open) the sum over
the workers now. Nothing is written between scrapes, and a scrape costs each sibling one
collection. A sibling that does not answer within `timeout_seconds` (gone, or stuck) is left
out of that scrape, with a log line."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from proxy.observability.metrics import Metrics

log = logging.getLogger("compaction_proxy")

# A family's samples by (sample name, label pairs): what is summed between workers.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclasses.dataclass(frozen=True)
class Worker:
    """Which of `count` workers this process is, of the parent process `parent`."""

    index: int
    count: int
    parent: int  # its pid: the workers' sockets are named after it

    def socket(self, index: int) -> str:
        """The worker's socket, in Linux's abstract namespace: no file to leave behind, and
        no directory whose length could pass a socket path's bound (108 bytes)."""
        return f"\0compaction-proxy-{self.parent}-worker-{index}"


class WorkerMetrics:
    def __init__(self, metrics: Metrics, worker: Worker, timeout_seconds: float = 2.0) -> None:
        self.metrics = metrics
        self.worker = worker
        self.timeout_seconds = timeout_seconds
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = self.worker.socket(self.worker.index)
        self._server = await asyncio.start_unix_server(self._answer, path=path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def render(self) -> bytes:
        """Every worker's series, summed, in Prometheus's text format."""
        others = range(self.worker.count)
        asked = [self._ask(i) for i in others if i != self.worker.index]
        answers = await asyncio.gather(*asked)
        own = _samples(self.metrics.registry.collect())
        return generate_latest(_Merged([own, *(a for a in answers if a is not None)]))

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(orjson.dumps(_samples(self.metrics.registry.collect())))
            await writer.drain()
        except OSError:
            pass  # the asking worker gave up waiting
        finally:
            writer.close()

    async def _ask(self, index: int) -> list[Any] | None:
        try:
            async with asyncio.timeout(self.timeout_seconds):
                # Connected first: uvloop's open_unix_connection refuses an abstract name.
                sock = socket.socket(socket.AF_UNIX)
                sock.setblocking(False)
                try:
                    await asyncio.get_running_loop().sock_connect(sock, self.worker.socket(index))
                except BaseException:
                    sock.close()
                    raise
                reader, writer = await asyncio.open_unix_connection(sock=sock)
                try:
                    answer: list[Any] = orjson.loads(await reader.read())
                finally:
                    writer.close()
                return answer
        except (OSError, TimeoutError, orjson.JSONDecodeError) as exc:
            log.warning(
                "a worker's metrics are left out of this scrape",
                extra={"worker": index, "error": type(exc).__name__},
            )
            return None


def _samples(families: Iterable[Metric]) -> list[Any]:
    """A worker's families as JSON: [name, type, help, [[sample, labels, value], ...]]."""
    return [
        [f.name, f.type, f.documentation, [[s.name, s.labels, s.value] for s in f.samples]]
        for f in families
    ]


class _Merged:
    """The workers' families with their samples summed, as a registry that can be exposed."""

    def __init__(self, workers: list[list[Any]]) -> None:
        self._families: dict[str, tuple[str, str, Samples]] = {}
        for families in workers:
            for name, kind, documentation, samples in families:
                summed = self._families.setdefault(name, (kind, documentation, {}))[2]
                for sample, labels, value in samples:
                    key = (sample, tuple(labels.items()))
                    summed[key] = summed.get(key, 0.0) + value

    def collect(self) -> Iterator[Metric]:
        for name, (kind, documentation, samples) in self._families.items():
            family = Metric(name, documentation, kind)
            for (sample, labels), value in samples.items():
                family.add_sample(sample, dict(labels), value)
            yield family
