"""What the benchmarks share: the fake upstream and the proxy as separate processes, loopback
HTTP timing, memory readings and long histories built from the recorded traces.

Each server runs in its own process, so that it has its own GIL and the scheduler may give it
its own core, as in production.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TRACES = ROOT / "tests/data"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes.openai import count_prompt_tokens  # noqa: E402  (needs ROOT on the path)

START_TIMEOUT = 20.0


@dataclass
class Server:
    """A server process and the URL it answers on."""

    process: subprocess.Popen[bytes]
    url: str
    spawned: float  # time.perf_counter() when the process was spawned
    started_in: float  # seconds from spawning the process to its first good answer
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _process(
    args: Sequence[str], name: str, cwd: Path = ROOT
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """Run `args`, its output in a log file (a pipe nobody reads would block it when full)."""
    with tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False) as log:
        path = Path(log.name)
        process = subprocess.Popen(args, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process, path
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.returncode in (0, -15):
            path.unlink(missing_ok=True)


def _wait_until_up(
    process: subprocess.Popen[bytes],
    url: str,
    log: Path,
    started: float,
    headers: Mapping[str, str],
) -> float:
    """Poll `url` until it answers 200; seconds since `started`."""
    deadline = started + START_TIMEOUT
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited: {log.read_text()[-2000:]}")
        with (
            # A timeout: the port is bound but nothing accepts yet (`serve --workers N`).
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
            urllib.request.urlopen(
                urllib.request.Request(url, headers={**headers}), timeout=1
            ) as response,
        ):
            if response.status == 200:
                return time.perf_counter() - started
        time.sleep(0.002)
    raise RuntimeError(f"{url} did not answer within {START_TIMEOUT:g} s")


@contextlib.contextmanager
def serve(
    args: Sequence[str],
    name: str,
    port: int,
    ready_path: str,
    cwd: Path = ROOT,
    headers: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """Run a server process listening on `port` until it answers `ready_path` (sent with
    `headers`) with a 200."""
    started = time.perf_counter()
    with _process(args, name, cwd) as (process, log):
        origin = f"http://127.0.0.1:{port}"
        took = _wait_until_up(process, origin + ready_path, log, started, headers or {})
        yield Server(process, f"{origin}/v1", started, took, log)


@contextlib.contextmanager
def fake_upstream(windows: Mapping[str, int]) -> Iterator[Server]:
    """The test suite's fake upstream (tests/fakes/openai) on a free port, recording nothing."""
    port = free_port()
    args = [sys.executable, "-m", "tests.fakes.openai", "--port", str(port)]
    args += [f"--window={model}={tokens}" for model, tokens in windows.items()]
    with serve(args, "fake", port, "/v1/models") as server:
        yield server


@contextlib.contextmanager
def fake_anthropic(windows: Mapping[str, int]) -> Iterator[Server]:
    """The test suite's fake Anthropic Messages API (tests/fakes/anthropic.py) on a free port,
    recording nothing; its `url` has no /v1 (what Anthropic's clients and litellm take)."""
    port = free_port()
    args = [sys.executable, "-m", "tests.fakes.anthropic", "--port", str(port)]
    args += [f"--window={model}={tokens}" for model, tokens in windows.items()]
    headers = {"anthropic-version": "2023-06-01"}
    with serve(args, "anthropic", port, "/v1/models", headers=headers) as up:
        up.url = up.url.removesuffix("/v1")
        yield up


@contextlib.contextmanager
def proxy(config_yaml: str, tree: Path | None = None) -> Iterator[Server]:
    """`compaction-proxy serve --config FILE` on a free port; started_in is its cold start.

    `tree`: the proxy's code from that checkout instead (`python -m proxy` run there), for an
    A/B of two versions in one run.
    """
    port = free_port()
    with tempfile.NamedTemporaryFile("w", prefix="bench-", suffix=".yaml", delete=False) as file:
        file.write(config_yaml)
    config = Path(file.name)
    command = [str(BIN / "compaction-proxy")] if tree is None else [sys.executable, "-m", "proxy"]
    args = [*command, "serve", "--config", str(config), "--port", str(port)]
    try:
        with serve(args, "proxy", port, "/healthz", tree or ROOT) as server:
            yield server
    finally:
        config.unlink(missing_ok=True)


@contextlib.contextmanager
def bare_relay(upstream: str) -> Iterator[Server]:
    """bench/relay.py, the floor: a relay with nothing of the proxy's own work."""
    port = free_port()
    args = [sys.executable, "bench/relay.py", "--port", str(port), "--upstream", upstream]
    with serve(args, "relay", port, "/healthz") as server:
        yield server


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) of a process, in MB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) / 1024
    return found


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) a process has used so far; this process when pid is None."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float:
    """CPU time the whole machine has spent outside idle and iowait so far, all cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def load_traces() -> list[list[dict[str, Any]]]:
    """The recorded conversations, longest files last (tau-bench, then SWE-agent)."""
    conversations = []
    for name in ("tau_airline_gpt4o.jsonl", "swe_agent.jsonl"):
        for line in (TRACES / name).read_text().splitlines():
            conversations.append(orjson.loads(line)["messages"])
    return conversations


def long_history(tokens: int, model: str = "gpt-4o") -> list[dict[str, Any]]:
    """One session of at least `tokens` prompt tokens: recorded conversations joined whole.

    Whole conversations keep every tool pair valid; only the first system prompt is kept, as
    in one long agent session, and a last user message asks for the next answer.
    """
    messages: list[dict[str, Any]] = []
    last = {"role": "user", "content": "Please go on with the next step."}
    for conversation in load_traces():
        messages += [m for m in conversation if m["role"] != "system" or not messages]
        if count_prompt_tokens({"model": model, "messages": [*messages, last]}) >= tokens:
            return [*messages, last]
    raise ValueError(f"the traces hold fewer than {tokens} tokens")


def as_responses_items(
    messages: list[dict[str, Any]], encrypted: str = "gAAAAA" * 200
) -> list[dict[str, Any]]:
    """A chat history as a Codex-like Responses input: system as developer messages, tool
    calls as function_call items after a reasoning item (`encrypted` its encrypted content),
    results as outputs."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        text = content if isinstance(content, str) else str(content)
        if role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message["tool_call_id"], "output": text}
            )
            continue
        if role == "assistant" and message.get("tool_calls"):
            items.append({"type": "reasoning", "summary": [], "encrypted_content": encrypted})
        if text:
            kind = "output_text" if role == "assistant" else "input_text"
            role = "developer" if role == "system" else role
            items.append(
                {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}
            )
        for call in message.get("tool_calls") or []:
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items


def as_messages_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat history as a Claude Code-like Messages request: system apart, tool calls as
    `tool_use` blocks after the assistant's text, each run of results as one user turn of
    `tool_result` blocks."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    turns: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        text = content if isinstance(content, str) else str(content)
        if role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": text,
            }
            if turns and turns[-1]["role"] == "user" and turns[-1].get("results"):
                turns[-1]["content"].append(result)
            else:
                turns.append({"role": "user", "content": [result], "results": True})
            continue
        if role == "system":
            continue
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        for call in message.get("tool_calls") or []:
            function = call["function"]
            try:
                arguments = json.loads(function["arguments"])
            except ValueError:
                arguments = {"raw": function["arguments"]}
            use = {"type": "tool_use", "id": call["id"], "name": function["name"]}
            blocks.append({**use, "input": arguments if isinstance(arguments, dict) else {}})
        turns.append({"role": role, "content": blocks or text})
    for turn in turns:
        turn.pop("results", None)
    return {"max_tokens": 4096, "system": "\n\n".join(system), "messages": turns}


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GB RAM, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )
