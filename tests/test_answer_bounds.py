"""An answer the proxy reads whole is bounded (`upstreams.*.max_answer_bytes`; 64 KiB for an
error read to decide on a retry): past the bound it is relayed as it comes, whole, and the
proxy's memory stays as it was. A streamed answer never was held."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.fakes.scripted import Request, ScriptedUpstream
from tests.served import Served, served

MiB = 1 << 20
CHAT = "/v1/chat/completions"
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


async def answers(request: Request, writer: asyncio.StreamWriter) -> bool:
    """`x-status` and `x-size` (bytes) say the answer, sent a MiB at a time."""
    status, size = int(request.headers["x-status"]), int(request.headers["x-size"])
    head = f"HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {size}\r\n\r\n".encode())
    for sent in range(0, size, MiB):
        writer.write(b"a" * min(MiB, size - sent))
        await writer.drain()
    return True


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, ScriptedUpstream]]:
    with ScriptedUpstream(answers) as up:
        upstream = {"base_url": up.base_url, "max_answer_bytes": MiB}
        directory = tmp_path_factory.mktemp("answers")
        with served({"upstreams": {"up": upstream}}, directory) as proxy:
            yield proxy, up


def relayed(proxy: Served, status: int, size: int) -> tuple[int, int]:
    """The status and the body's size of an answer of `size` bytes, read as it comes."""
    headers = {"x-status": str(status), "x-size": str(size)}
    with httpx.stream("POST", proxy.url + CHAT, json=BODY, headers=headers, timeout=30) as answer:
        return answer.status_code, sum(len(part) for part in answer.iter_raw())


@pytest.mark.parametrize("status", [200, 400])
def test_an_answer_past_the_bound_is_relayed_whole_in_bounded_memory(
    proxy: tuple[Served, ScriptedUpstream], status: int
) -> None:
    """An answer read for its usage (200), or to tell an overflow from other errors (400)."""
    served, _ = proxy
    before = served.memory()
    served.reset_peak()
    assert relayed(served, status, 32 * MiB) == (status, 32 * MiB)
    assert served.peak_memory() - before < 12 * MiB


def test_an_answer_within_the_bound_is_read_whole(proxy: tuple[Served, ScriptedUpstream]) -> None:
    served, _ = proxy
    headers = {"x-status": "200", "x-size": str(MiB)}
    answer = httpx.post(served.url + CHAT, json=BODY, headers=headers, timeout=30)
    assert len(answer.content) == MiB
    assert answer.headers["content-length"] == str(MiB)  # the proxy's own: it held it all


def test_a_large_error_that_asks_for_a_retry_is_relayed_not_retried(
    proxy: tuple[Served, ScriptedUpstream],
) -> None:
    """A 429's body is read to tell a spent quota from a rate limit; one past 64 KiB is
    neither read whole nor retried."""
    served, up = proxy
    sent = len(up.requests)
    assert relayed(served, 429, MiB) == (429, MiB)
    assert len(up.requests) == sent + 1
