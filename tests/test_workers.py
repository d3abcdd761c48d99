"""`compaction-proxy serve --workers 2` on loopback with the real Redis: both workers serve
from one port and share sessions through the store, /metrics sums every worker's series, and
SIGTERM drains both as it drains one process, exit 0; memory:// is refused."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from proxy.observability.worker_metrics import Worker
from tests.conversations import words
from tests.fakes.openai import FakeUpstream
from tests.served import Served, accepts, served

pytestmark = pytest.mark.subprocess

WORKERS, DELAY = 2, 3.0
REQUESTS = 'compaction_proxy_requests_total{model="small-8k",policy="default",route="chat"'


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[Served, FakeUpstream]]:
    with FakeUpstream(windows={"small-8k": 8192}) as up:
        config = {
            "upstreams": {"up": {"base_url": up.base_url}},
            "models": [{"match": "small-8k", "context_window": 8192}],
            "store": {"url": "redis://127.0.0.1:6379/0", "key_prefix": f"workers-{uuid.uuid4()}"},
            "listen": {"workers": WORKERS, "shutdown_delay_seconds": DELAY},
        }
        # Each worker a fresh interpreter: on a loaded machine two start slower than one.
        with served(config, tmp_path, ready_within=90) as proxy:
            yield proxy, up


def history(turns: int) -> list[dict[str, str]]:
    messages = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}: {words(120, i)}"})
        messages.append({"role": "assistant", "content": f"answer {i}: {words(120, 1000 + i)}"})
    return [*messages, {"role": "user", "content": "and now?"}]


def ask(url: str, session: str, messages: list[dict[str, str]]) -> str:
    """One request on a connection of its own (so that either worker may take it): the
    proxy's action."""
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0) as client:
        answer = client.chat.completions.with_raw_response.create(
            model="small-8k", messages=messages, extra_headers={"X-Session-Id": session}
        )
    return answer.headers["x-compaction-action"]


def worker_requests(parent: int) -> list[float]:
    """The chat requests each worker counted, asked of its own socket as its siblings ask."""
    counts = []
    for index in range(WORKERS):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(Worker(index, WORKERS, parent).socket(index))
            data = b"".join(iter(lambda: sock.recv(65536), b""))
        families = {name: samples for name, _, _, samples in orjson.loads(data)}
        counts.append(
            sum(
                v
                for s, labels, v in families["compaction_proxy_requests"]
                if s.endswith("_total") and labels.get("route") == "chat"
            )
        )
    return counts


def spawned(parent: int) -> list[int]:
    """The workers of the process `parent` (multiprocessing's spawned interpreters)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_two_workers_serve_share_sessions_and_sum_their_metrics(
    proxy: tuple[Served, FakeUpstream],
) -> None:
    served_proxy, _ = proxy
    url, session = served_proxy.url, str(uuid.uuid4())
    messages = history(30)  # about 15k tokens: over the 8k window
    assert ask(url, session, messages) == "compacted"
    # Later turns replay the plan stored in Redis, whichever worker takes them; requests come
    # in bursts until both workers have served some.
    sent, actions = 1, set()
    with ThreadPoolExecutor(8) as pool:
        for _ in range(20):
            actions |= set(pool.map(lambda _: ask(url, session, messages), range(16)))
            sent += 16
            if all(worker_requests(served_proxy.process.pid)):
                break
    counts = worker_requests(served_proxy.process.pid)
    assert all(counts), f"a worker served nothing: {counts}"
    assert actions == {"replayed"}
    assert sum(counts) == sent
    # /metrics, whichever worker answers, says every worker's requests.
    for _ in range(4):
        text = httpx.get(url + "/metrics").text
        line = next(line for line in text.splitlines() if line.startswith(REQUESTS))
        assert float(line.rsplit(" ", 1)[1]) == sent
        assert "compaction_proxy_requests_in_flight 0.0" in text


def test_sigterm_drains_every_worker_and_exits_0(
    proxy: tuple[Served, FakeUpstream],
) -> None:
    served_proxy, _ = proxy
    process, url = served_proxy.process, served_proxy.url
    workers = spawned(process.pid)
    assert len(workers) == WORKERS
    process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    # Every worker is draining: whichever takes it, /readyz says 503 ...
    for _ in range(4):
        readyz = httpx.get(url + "/readyz", headers={"connection": "close"}, timeout=2)
        assert readyz.status_code == 503 and readyz.json()["status"] == "draining"
    # ... while what still comes during the delay is served.
    assert ask(url, str(uuid.uuid4()), history(1)) == "none"
    assert time.monotonic() - signalled < DELAY
    # Then the port is closed, as one process's is.
    while accepts(served_proxy.port):
        assert time.monotonic() - signalled < DELAY + 2, "still accepting after the delay"
        time.sleep(0.05)
    _, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert b"Traceback" not in err
    assert err.count(b'"shutting down"') == WORKERS
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as sock:
        sock.connect(Worker(0, WORKERS, process.pid).socket(0))  # the sockets are gone


def test_memory_store_is_refused_with_workers(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text('upstreams: {up: {base_url: "http://127.0.0.1:1/v1"}}\n')
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", str(file), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert result.returncode == 2
    assert "listen.workers: more than one worker needs a session store the workers share" in (
        result.stderr
    )
    assert "memory:// keeps sessions inside one process" in result.stderr
