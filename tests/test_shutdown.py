"""SIGTERM to `compaction-proxy serve`: not ready at once, still accepting for the delay, then
in-flight requests finish within the grace period, endless ones are ended, and the exit is 0."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import websockets

from tests.fakes.scripted import Request, ScriptedUpstream, chunk, event, response, stream_head
from tests.served import accepts, served

pytestmark = pytest.mark.subprocess

DELAY, GRACE = 1.0, 2.0
FINITE_EVENTS, EVENT_SECONDS = 6, 0.2  # a stream that ends within the grace period
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": True}
COMPLETED = '{"type": "response.completed", "response": {"id": "resp_1", "output": []}}'
CREATE = '{"type": "response.create", "model": "gpt-4o-mini", "input": "hi", "store": false}'
BETA = {"OpenAI-Beta": "responses_websockets=2026-02-06"}


async def streams(request: Request, writer: asyncio.StreamWriter) -> bool:
    """`x-act: finite` a stream that ends, `endless` one that never does, else a quick answer.
    A Responses stream ends with `response.completed`, any other with `[DONE]`."""
    act = request.headers.get("x-act")
    if act is None:
        writer.write(response(200))
        return True
    writer.write(stream_head())
    n = 0
    while act == "endless" or n < FINITE_EVENTS:
        n += 1
        writer.write(event(f'{{"type": "response.output_text.delta", "n": {n}}}'))
        await writer.drain()
        await asyncio.sleep(EVENT_SECONDS)
    end = COMPLETED if request.path.endswith("/responses") else "[DONE]"
    writer.write(event(end) + chunk(b""))
    return True


class Reader(threading.Thread):
    """Reads one streamed answer through to its end, or its break."""

    def __init__(self, url: str, act: str) -> None:
        super().__init__(daemon=True)
        self.url, self.act = url, act
        self.body = b""
        self.error: Exception | None = None
        self.ended_at = 0.0
        self.first = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST", self.url, json=BODY, headers={"x-act": self.act}, timeout=20
            ) as answer:
                for part in answer.iter_raw():
                    self.body += part
                    self.first.set()
        except httpx.HTTPError as exc:
            self.error = exc
        self.ended_at = time.monotonic()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, ScriptedUpstream]]:
    with ScriptedUpstream(streams) as up:
        config = {
            "upstreams": {"up": {"base_url": up.base_url}},
            "listen": {"shutdown_delay_seconds": DELAY, "shutdown_grace_seconds": GRACE},
        }
        with served(config, tmp_path) as proxy:
            yield proxy.process, proxy.url, up


def test_sigterm_drains_then_ends_what_is_left_and_exits_0(
    proxy: tuple[subprocess.Popen[bytes], str, ScriptedUpstream],
) -> None:
    process, url, up = proxy
    port = int(url.rsplit(":", 1)[1])
    finite = Reader(url + "/v1/chat/completions", "finite")
    endless = Reader(url + "/v1/chat/completions", "endless")
    for reader in (finite, endless):
        reader.start()
        assert reader.first.wait(5)

    process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    # At once: not ready, so that a load balancer stops sending here ...
    readyz = httpx.get(url + "/readyz", timeout=2)
    assert readyz.status_code == 503 and readyz.json()["status"] == "draining"
    # ... while what it still sends during the delay is served.
    served = httpx.post(url + "/v1/chat/completions", json={**BODY, "stream": False})
    assert served.status_code == 200
    assert time.monotonic() - signalled < DELAY
    # Then no new connection is accepted.
    while accepts(port):
        assert time.monotonic() - signalled < DELAY + 1, "still accepting after the delay"
        time.sleep(0.05)
    assert time.monotonic() - signalled >= DELAY - 0.1

    # The stream that ends within the grace period is relayed whole.
    finite.join(timeout=DELAY + GRACE + 2)
    assert finite.error is None
    assert finite.body.endswith(b"data: [DONE]\n\n")
    assert finite.body.count(b"data: ") == FINITE_EVENTS + 1
    # The endless one is cut off when the grace period is over, its upstream connection closed.
    endless.join(timeout=DELAY + GRACE + 5)
    assert not endless.is_alive()
    assert isinstance(endless.error, httpx.RemoteProtocolError)
    assert b"[DONE]" not in endless.body
    assert DELAY + GRACE - 0.3 <= endless.ended_at - signalled < DELAY + GRACE + 2
    assert up.wait_for(lambda: up.open == 0, timeout=2)

    _, err = process.communicate(timeout=5)
    assert process.returncode == 0, err
    assert b"Traceback" not in err
    assert time.monotonic() - signalled < DELAY + GRACE + 3


async def socket_events(ws: websockets.ClientConnection) -> tuple[list[dict[str, Any]], float]:
    """Every event `ws` gets until it is closed, and when it was."""
    events = []
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            events.append(orjson.loads(await ws.recv()))
    return events, time.monotonic()


def test_sigterm_lets_a_websockets_answer_finish_then_closes_it(
    proxy: tuple[subprocess.Popen[bytes], str, ScriptedUpstream],
) -> None:
    """An idle WebSocket is closed when the listener is, one whose answer is under way once
    the answer is over; one still under way when the grace period is over gets an error."""
    process, url, _ = proxy
    ws_url = url.replace("http://", "ws://") + "/v1/responses"

    async def run() -> tuple[Any, ...]:
        def connect(act: str | None = None) -> Any:
            acted = {"x-act": act} if act else {}
            return websockets.connect(ws_url, additional_headers={**BETA, **acted})

        async with connect() as idle, connect("finite") as busy, connect("endless") as endless:
            await endless.send(CREATE)
            assert orjson.loads(await endless.recv())["n"] == 1
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            # An answer that starts during the delay runs past it, within the grace period.
            await asyncio.sleep(DELAY / 2)
            await busy.send(CREATE)
            return (
                signalled,
                *await asyncio.gather(
                    socket_events(idle), socket_events(busy), socket_events(endless)
                ),
                (idle.close_code, busy.close_code, endless.close_code),
            )

    signalled, (idle, idle_at), (busy, busy_at), (endless, endless_at), codes = asyncio.run(run())
    assert idle == []
    assert DELAY - 0.1 <= idle_at - signalled < DELAY + 1
    assert [e["type"] for e in busy][-1] == "response.completed"
    assert len(busy) == FINITE_EVENTS + 1
    assert idle_at + 0.2 < busy_at < signalled + DELAY + GRACE
    assert endless[-1]["type"] == "error"
    assert (endless[-1]["status"], endless[-1]["error"]["code"]) == (503, "proxy_shutting_down")
    assert DELAY + GRACE - 0.3 <= endless_at - signalled < DELAY + GRACE + 2
    assert codes == (1012, 1012, 1012)  # service restart
    _, err = process.communicate(timeout=5)
    assert process.returncode == 0, err
    assert b"Traceback" not in err
