"""Redis servers of the tests' own: a free loopback port, and a redis-server started on it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(port: int) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no"),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 5
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
        yield process
    finally:
        process.terminate()
        process.wait(5)
