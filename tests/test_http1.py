"""proxy.upstream.pool and proxy.upstream.http1, the client towards the upstreams, against
servers on loopback that answer with exactly the bytes each case needs: keep-alive, chunks,
bodies that end at the connection's end or break off, informational answers, HEAD, the pool's
bound, flow control, TLS."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

import pytest

from proxy.errors import StreamBroken
from proxy.upstream import http1
from proxy.upstream.answer import read_whole
from proxy.upstream.connect import ConnectFailed
from proxy.upstream.http1 import _HIGH_WATER, MAX_HEAD, BadAnswer, Disconnected, Response
from proxy.upstream.pool import Pool, Progress
from tests.fakes.scripted import TLS, server_tls

# Bodies are read whole as the proxy reads them (answer.read_whole), with no bound to speak of.
BODY_LIMIT = 1 << 30
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback server running `handler` on each connection, counting connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.port = 0
        self.open: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open[asyncio.current_task()] = writer  # type: ignore[index]
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.open.pop(asyncio.current_task())  # type: ignore[arg-type]

    def pool(self, max_connections: int = 1, **settings: float) -> Pool:
        return Pool(f"http://127.0.0.1:{self.port}", max_connections, **settings)

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """One request's head and body (by its Content-Length)."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return head + await reader.readexactly(length)


@contextlib.asynccontextmanager
async def serving(
    handler: Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[Server]:
    server = Server(lambda r, w: handler(server, r, w))
    listening = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=tls)
    server.port = listening.sockets[0].getsockname()[1]
    async with listening:
        try:
            yield server
        finally:  # the connections still open end, and their handlers with them
            for writer in server.open.values():
                writer.transport.abort()
            await asyncio.gather(*server.open, return_exceptions=True)


async def keep_answering(server: Server, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    while True:
        await server.read_request(r)
        w.write(OK)
        await w.drain()


def answering(
    first: bytes, then: Literal["close", "hold", "keep"] = "close"
) -> Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A server's handler: the first request is answered with the bytes `first`, then the
    connection is closed, held until the client hangs up, or kept answering `OK`."""

    async def handler(server: Server, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await server.read_request(r)
        w.write(first)
        await w.drain()
        if then == "hold":
            await r.read()
        elif then == "keep":
            await keep_answering(server, r, w)

    return handler


async def get(pool: Pool, progress: Progress | None = None) -> Response:
    return await pool.request("POST", "/chat", [("X-A", "1")], b"{}", progress or Progress())


async def test_a_connection_serves_one_request_after_another() -> None:
    async with serving(keep_answering) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}/v1", 4)
        for turn in range(3):
            progress = Progress()
            response = await get(pool, progress)
            assert (response.status, await read_whole(response, 1, BODY_LIMIT)) == (200, b"ok")
            assert response.headers == [("Content-Length", "2")]
            response.release()
            assert progress.reused is (turn > 0)
        assert server.connections == 1
        head = server.heads[0]
        assert head.startswith(b"POST /v1/chat HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nX-A: 1\r\nContent-Length: 2\r\n\r\n" in head
        pool.close()


async def test_a_chunked_body_comes_chunk_by_chunk() -> None:
    events = [b"data: %d\n\n" % i for i in range(5)]

    async def stream(server: Server, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await server.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in events:
            w.write(b"%x\r\n%s\r\n" % (len(event), event))
            await w.drain()
            await asyncio.sleep(0.01)
        w.write(b"0\r\n\r\n")
        await keep_answering(server, r, w)

    async with serving(stream) as server:
        pool = server.pool()
        response = await get(pool)
        got = [chunk async for chunk in response.chunks(1)]
        assert got == events  # each as it came, not gathered
        response.release()
        again = await get(pool)
        assert await read_whole(again, 1, BODY_LIMIT) == b"ok"
        again.release()
        assert server.connections == 1  # the stream's connection served the next request
        pool.close()


async def test_a_body_without_a_length_ends_with_the_connection() -> None:
    async with serving(answering(b"HTTP/1.0 200 OK\r\n\r\nall of it")) as server:
        pool = server.pool()
        response = await get(pool)
        assert await read_whole(response, 1, BODY_LIMIT) == b"all of it"
        response.release()
        again = await get(pool)
        await read_whole(again, 1, BODY_LIMIT)
        again.release()
        assert server.connections == 2  # never reused
        assert pool._open == 0


@pytest.mark.parametrize("cut", [b"", b"HTTP/1.1 200 OK\r\nContent-Le", b"HTTP/1.1 200 OK\r\n"])
async def test_a_connection_closed_before_the_head_says_whether_the_answer_had_begun(
    cut: bytes,
) -> None:
    async with serving(answering(cut)) as server:
        pool = server.pool()
        with pytest.raises(Disconnected) as closed:
            await get(pool)
        assert closed.value.answer_begun is bool(cut)
        assert pool._open == 0  # its place is free again


@pytest.mark.parametrize("framing", [b"Content-Length: 100", b"Transfer-Encoding: chunked"])
async def test_a_body_that_breaks_off_is_a_broken_stream(framing: bytes) -> None:
    body = b"5\r\nhello\r\n" if b"chunked" in framing else b"hello"
    async with serving(answering(b"HTTP/1.1 200 OK\r\n" + framing + b"\r\n\r\n" + body)) as server:
        pool = server.pool()
        response = await get(pool)
        with pytest.raises(StreamBroken):
            await read_whole(response, 1, BODY_LIMIT)
        assert pool._open == 0


async def test_a_stalled_body_is_a_broken_stream_after_the_idle_timeout() -> None:
    half = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"
    async with serving(answering(half, "hold")) as server:
        pool = server.pool()
        response = await get(pool)
        chunks = response.chunks(0.2)
        assert await anext(chunks) == b"half"
        with pytest.raises(StreamBroken, match=r"no data for 0\.2 s"):
            await anext(chunks)
        response.close()
        assert pool._open == 0


async def test_informational_answers_are_skipped_and_head_gets_no_body() -> None:
    async def hints(server: Server, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await server.read_request(r)
        w.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
        w.write(OK)
        request = await server.read_request(r)
        assert request.startswith(b"HEAD ")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12345\r\n\r\n")
        await w.drain()
        await r.read()  # until the client hangs up

    async with serving(hints) as server:
        pool = server.pool()
        response = await get(pool)
        assert (response.status, response.headers) == (200, [("Content-Length", "2")])
        assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
        response.release()
        head = await pool.request("HEAD", "/", [], None, Progress())
        assert (head.status, await read_whole(head, 1, BODY_LIMIT)) == (200, b"")
        head.release()
        assert pool._open == 0  # an answer to HEAD leaves its connection unsure: closed


async def test_the_pool_holds_requests_beyond_its_bound_until_a_connection_is_free() -> None:
    async with serving(keep_answering) as server:
        pool = server.pool()
        first = await get(pool)
        gives_up = asyncio.create_task(get(pool))
        woken = asyncio.create_task(get(pool))
        waiting = Progress()
        second = asyncio.create_task(get(pool, waiting))
        await asyncio.sleep(0.05)
        assert waiting.phase == "pool" and not second.done()
        gives_up.cancel()  # a waiter that leaves takes no one's turn
        await read_whole(first, 1, BODY_LIMIT)
        first.release()  # the turn of the first one waiting...
        woken.cancel()  # ...who leaves before taking it: it goes on to the next
        answer = await asyncio.wait_for(second, 1)
        assert waiting.reused and await read_whole(answer, 1, BODY_LIMIT) == b"ok"
        answer.release()
        assert server.connections == 1
        pool.close()


async def test_those_waiting_are_served_in_the_order_they_came() -> None:
    """One connection, 100 requests waiting for it: each, once served, asks again at once as
    a newcomer, while the one it woke has not run yet. No newcomer overtakes one waiting."""
    async with serving(keep_answering) as server:
        pool = server.pool(1)
        served: list[str] = []

        async def request(name: str, again: bool) -> None:
            response = await get(pool)
            served.append(name)
            await read_whole(response, 1, BODY_LIMIT)
            response.release()  # hands the connection on...
            if again:
                await request(f"newcomer {name}", again=False)  # ...before this asks again

        held = await get(pool)
        waiting = [asyncio.create_task(request(str(i), again=True)) for i in range(100)]
        await asyncio.sleep(0.05)  # all in line, in the order they came
        await read_whole(held, 1, BODY_LIMIT)
        held.release()
        await asyncio.wait_for(asyncio.gather(*waiting), 10)
        assert served == [str(i) for i in range(100)] + [f"newcomer {i}" for i in range(100)]
        assert server.connections == 1
        pool.close()


async def test_a_dropped_connection_frees_its_place_for_one_waiting() -> None:
    async with serving(keep_answering) as server:
        pool = server.pool()
        first = await get(pool)
        second = asyncio.create_task(get(pool))
        await asyncio.sleep(0.05)
        first.close()
        answer = await asyncio.wait_for(second, 1)
        assert await read_whole(answer, 1, BODY_LIMIT) == b"ok"
        answer.release()
        assert server.connections == 2
        pool.close()


async def test_a_fast_body_is_read_from_the_socket_only_as_fast_as_it_is_taken() -> None:
    size = 16 * _HIGH_WATER

    async def flood(server: Server, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await server.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            w.write(b"x" * 65536)
            await w.drain()

    async with serving(flood) as server:
        pool = server.pool()
        response = await get(pool)
        taken = 0
        async for chunk in response.chunks(5):
            taken += len(chunk)
            await asyncio.sleep(0.001)
            # What is held: up to the high-water mark, and what one read brings on top.
            assert response._held <= _HIGH_WATER + 512 * 1024
        assert taken == size
        response.release()
        pool.close()


async def test_what_is_not_http_is_a_bad_answer() -> None:
    async with serving(answering(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "hold")) as server:
        pool = server.pool()
        with pytest.raises(BadAnswer):
            await get(pool)
        assert pool._open == 0


@pytest.mark.parametrize("upgrade", [b"Connection: Upgrade\r\nUpgrade: websocket\r\n", b""])
async def test_switching_protocols_unasked_is_a_bad_answer(
    upgrade: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    switching = b"HTTP/1.1 101 Switching Protocols\r\n" + upgrade + b"\r\n\x81\x02hi"
    async with serving(answering(switching, "hold")) as server:
        pool = server.pool()
        with pytest.raises(BadAnswer, match="101 Switching Protocols"):
            await asyncio.wait_for(get(pool), 1)
        await asyncio.sleep(0.01)
        assert pool._open == 0
    assert "Fatal error" not in caplog.text  # httptools' upgrade did not escape the protocol


async def test_bytes_after_an_answer_drop_its_connection() -> None:
    async def chatty(server: Server, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await server.read_request(r)
        w.write(OK)
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra")
        await w.drain()
        await keep_answering(server, r, w)

    async with serving(chatty) as server:
        pool = server.pool()
        response = await get(pool)
        assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
        response.release()
        await asyncio.sleep(0.1)
        again = await get(pool)
        assert await read_whole(again, 1, BODY_LIMIT) == b"ok"
        again.release()
        assert server.connections == 2
        pool.close()


async def test_no_line_break_gets_into_the_request() -> None:
    pool = Pool("http://127.0.0.1:9", 1)
    for target, headers in [("/a\r\nX-Evil: 1", []), ("/a", [("X-A", "1\r\nX-Evil: 1")])]:
        with pytest.raises(ValueError, match="line break"):
            await pool.request("POST", target, headers, b"", Progress())
    assert pool._open == 0


@pytest.mark.parametrize("name", ["X A", "X:A", "", "X(A)", "Ä", "X\x00"])
async def test_a_header_name_that_is_not_a_token_is_refused(name: str) -> None:
    pool = Pool("http://127.0.0.1:9", 1)
    with pytest.raises(ValueError, match="not a token"):
        await pool.request("POST", "/a", [(name, "1")], b"", Progress())
    assert pool._open == 0


async def test_the_pool_frames_each_request_itself() -> None:
    """Whatever a caller gives: the pool's own Host and Content-Length, nothing that speaks
    for the connection (a chunked body or an upgrade it would not carry out)."""
    given = [
        ("Host", "elsewhere"),
        ("Content-Length", "99"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "Upgrade"),
        ("Upgrade", "h2c"),
        ("Keep-Alive", "timeout=1"),
        ("TE", "trailers"),
        ("Proxy-Authorization", "Basic c2VjcmV0"),
        ("X-A", "1"),
    ]
    async with serving(keep_answering) as server:
        pool = server.pool()
        response = await pool.request("POST", "/a", given, b"{}", Progress())
        assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
        response.release()
        assert server.heads == [
            b"POST /a HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-A: 1\r\nContent-Length: 2\r\n\r\n"
            % server.port
        ]
        pool.close()


async def test_a_refused_connection_says_nothing_was_sent() -> None:
    with socket.socket() as bound:  # bound, not listening: refused
        bound.bind(("127.0.0.1", 0))
        pool = Pool(f"http://127.0.0.1:{bound.getsockname()[1]}", 1)
        with pytest.raises(ConnectFailed):
            await get(pool)
    assert pool._open == 0
    # (A connect timeout, `ConnectTimeout`, is tested through the proxy, with its metric:
    # tests/test_upstream_resilience.py.)


async def test_an_address_that_never_answers_costs_a_moment_not_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Happy eyeballs: a name whose first address is blackholed (as an IPv6 address without
    a route often is) is reached at its next one."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        blackholed = listener.getsockname()[1]
        # One connection fills its queue: the next is never answered.
        with socket.create_connection(("127.0.0.1", blackholed)):
            async with serving(keep_answering) as server:

                async def resolve(host: str, port: int, **_: object) -> list[object]:
                    assert host == "upstream.test"
                    tcp = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
                    return [(*tcp, ("127.0.0.1", blackholed)), (*tcp, ("127.0.0.1", server.port))]

                loop = asyncio.get_running_loop()
                monkeypatch.setattr(loop, "getaddrinfo", resolve)
                pool = Pool(f"http://upstream.test:{server.port}", 1, connect_timeout=2)
                started = loop.time()
                response = await get(pool)
                assert loop.time() - started < 1
                assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
                response.release()
                pool.close()


async def test_https_is_verified(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(keep_answering, server_tls()) as server:
        with pytest.raises(ConnectFailed):  # not a certificate this machine trusts
            await get(Pool(f"https://localhost:{server.port}", 1))
        monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "cert.pem"))
        pool = Pool(f"https://localhost:{server.port}", 1)
        response = await get(pool)
        assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
        response.release()
        assert b"\r\nHost: localhost:%d\r\n" % server.port in server.heads[-1]
        pool.close()


async def test_a_request_cancelled_at_any_step_frees_its_place_once() -> None:
    """Cancelled while waiting, connecting (as asyncio makes the connection, too), sending or
    waiting for the head: the pool's count of connections stays true, so its bound holds."""
    async with serving(keep_answering) as server:
        pool = server.pool(2)
        for turns in range(16):
            requests = [asyncio.create_task(get(pool)) for _ in range(3)]
            for _ in range(turns):
                await asyncio.sleep(0)
            for request in requests:
                request.cancel()
            for done in await asyncio.gather(*requests, return_exceptions=True):
                if isinstance(done, Response):
                    await read_whole(done, 1, BODY_LIMIT)
                    done.release()
            await asyncio.sleep(0.01)  # connections closed meanwhile are forgotten
            assert len(pool._idle) <= pool._open <= 2
        requests = [asyncio.create_task(get(pool)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert len(server.open) <= 2 and sum(r.done() for r in requests) == 2  # the bound held
        for request in requests:
            answer = await asyncio.wait_for(request, 1)
            await read_whole(answer, 1, BODY_LIMIT)
            answer.release()  # (a place for the third)
        pool.close()


async def test_an_idle_connection_is_not_used_after_its_time() -> None:
    async with serving(keep_answering) as server:
        pool = server.pool(1, idle_seconds=0.1)
        for pause in (0, 0.2):
            await asyncio.sleep(pause)
            response = await get(pool)
            await read_whole(response, 1, BODY_LIMIT)
            response.release()
        assert server.connections == 2  # the first was idle too long for the second
        pool.close()


@pytest.mark.parametrize(
    "stray",
    [b"}\n", b"H", b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n", b"\x00garbage"],
)
async def test_bytes_after_an_answer_in_the_same_read_keep_it_and_drop_the_connection(
    stray: bytes,
) -> None:
    async with serving(answering(OK + stray, "keep")) as server:  # one write: one read
        pool = server.pool()
        response = await get(pool)
        assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
        response.release()
        again = await get(pool)
        assert await asyncio.wait_for(read_whole(again, 1, BODY_LIMIT), 1) == b"ok"
        again.release()
        assert server.connections == 2
        pool.close()


async def test_trailer_fields_are_no_headers() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
    body = b"2\r\nok\r\n0\r\nX-Checksum: abc\r\nSet-Cookie: s=1\r\n\r\n"
    async with serving(answering(head + body, "keep")) as server:
        pool = server.pool()
        response = await get(pool)
        assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
        names = [name.lower() for name, _ in response.headers]
        assert names == ["transfer-encoding", "trailer"]
        response.release()
        pool.close()


async def test_a_head_beyond_its_bound_is_a_bad_answer() -> None:
    async def huge(server: Server, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await server.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nX-Big: ")
        for _ in range(4 * MAX_HEAD // 4096):
            w.write(b"x" * 4096)
            await w.drain()
        await r.read()

    async with serving(huge) as server:
        pool = server.pool()
        with pytest.raises(BadAnswer, match="larger than"):
            await asyncio.wait_for(get(pool), 5)
        assert pool._open == 0


@pytest.mark.parametrize("size", [MAX_HEAD - 1024, MAX_HEAD + 1024, 4 * MAX_HEAD])
async def test_a_whole_head_over_its_bound_is_a_bad_answer(size: int) -> None:
    """Sent at once, however the reads split it: the bound is of the head's fields."""

    head = b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * size + b"\r\n"
    async with serving(answering(head + OK.split(b"\r\n", 1)[1], "keep")) as server:
        pool = server.pool()
        if size < MAX_HEAD:
            response = await asyncio.wait_for(get(pool), 5)
            assert await read_whole(response, 1, BODY_LIMIT) == b"ok"
            response.release()
        else:
            with pytest.raises(BadAnswer, match="larger than"):
                await asyncio.wait_for(get(pool), 5)
            assert pool._open == 0
        pool.close()


async def test_a_body_read_whole_after_reading_was_held_back_leaves_a_usable_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1, "_HIGH_WATER", 1000)  # a body of 3000 bytes in one read is over

    big = b"HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n" + b"x" * 3000
    async with serving(answering(big, "keep")) as server:
        pool = server.pool()
        response = await get(pool)
        while not response.complete:
            await asyncio.sleep(0.01)
        assert response._paused  # complete, and reading held back by the same read
        assert len(await read_whole(response, 1, BODY_LIMIT)) == 3000
        response.release()
        again = await asyncio.wait_for(get(pool), 1)
        assert await read_whole(again, 1, BODY_LIMIT) == b"ok"
        again.release()
        assert server.connections == 1
        pool.close()


async def test_a_target_is_always_a_path() -> None:
    async with serving(keep_answering) as server:
        pool = server.pool()
        response = await pool.request("GET", "%2F@elsewhere/x", [], None, Progress())
        response.release()
        assert server.heads[0].startswith(b"GET /%2F@elsewhere/x HTTP/1.1\r\n")
        pool.close()
