"""`compaction-proxy serve` in a process of its own, as it runs in production: for what a
thread of the tests' process cannot show (signals, the process's own memory)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.redis_servers import free_port

SCRIPT = Path(sys.executable).parent / "compaction-proxy"


@dataclasses.dataclass(frozen=True)
class Served:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def memory(self) -> int:
        """The memory the process holds (its resident set), in bytes."""
        return self._status("VmRSS")

    def peak_memory(self) -> int:
        """The most memory the process has held since `reset_peak` (or its start)."""
        return self._status("VmHWM")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def _status(self, field: str) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024


@contextlib.contextmanager
def served(config: dict[str, Any], directory: Path, ready_within: float = 20) -> Iterator[Served]:
    """The proxy serving `config` (written to `directory`), once it is ready (within
    `ready_within` seconds); killed after, unless it has ended."""
    port = free_port()
    file = directory / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--config", str(file), "--port", str(port)],
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within
        while not ready(url):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the proxy did not become ready"
            time.sleep(0.05)
        yield Served(process, port)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
