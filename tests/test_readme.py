"""Every example of the README works as written: each shell and Python block runs, the way a
new user would run it, against the proxy on its own defaults (the repository's `config.yaml`)
in front of the strict fake upstream; each YAML block is a config the proxy loads; the Codex
block is the TOML Codex reads.

The examples say `http://127.0.0.1:8080`; here the proxy listens on a free port and the
address is rewritten, and `.venv/bin/compaction-proxy` is the command of this interpreter. A
block that cannot run here is listed in `NOT_RUN` with the reason and what covers it instead,
so that a new example is run or consciously left out, never silently skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from proxy.config import load, loads
from tests.conftest import merged
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
ADDRESS = "http://127.0.0.1:8080"
ADMIN_TOKEN = "readme-admin-token"

# First line of a block that is not run, and why (what checks it instead).
NOT_RUN = {
    "make serve": "the suite itself runs under `make test`; `make serve`'s command is the "
    "`compaction-proxy serve` this file runs",
    "ANTHROPIC_BASE_URL=": "needs Claude Code; the Anthropic SDK through the proxy is "
    "tests/test_proxy_messages.py",
    "docker build": "needs a Docker engine: scripts/docker-smoke.sh (make docker-smoke)",
    "docker compose": "needs a Docker engine: tests/test_deploy.py checks the compose file",
    "kubectl apply": "needs a cluster: tests/test_deploy.py checks the manifests",
    "make test": "the suite itself",
}


@dataclass(frozen=True)
class Block:
    language: str
    text: str

    @property
    def first_line(self) -> str:
        return self.text.strip().splitlines()[0]


def blocks(language: str) -> list[Block]:
    return [
        Block(m[1], m[2])
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)
        if m[1] == language
    ]


def not_run(block: Block) -> str | None:
    return next((why for start, why in NOT_RUN.items() if block.first_line.startswith(start)), None)


def run_blocks(language: str) -> list[Block]:
    return [b for b in blocks(language) if not_run(b) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Setting:
    """Where the examples run: a folder standing for the repository, the proxy on its defaults
    in front of the fake, and the environment a user would have."""

    folder: Path
    proxy: ServerThread
    upstream: FakeUpstream
    env: dict[str, str]

    def rewritten(self, text: str) -> str:
        return text.replace(ADDRESS, self.proxy.url).replace("/tmp/", f"{self.folder}/")

    def shell(self, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def defaults_towards(upstream: FakeUpstream) -> str:
    """The repository's config.yaml, its upstream the fake."""
    text = (ROOT / "config.yaml").read_text()
    assert "https://api.openai.com/v1" in text
    return text.replace("https://api.openai.com/v1", upstream.base_url)


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setting]:
    folder = tmp_path_factory.mktemp("readme")
    command = folder / ".venv" / "bin" / "compaction-proxy"
    command.parent.mkdir(parents=True)
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m proxy "$@"\n')
    command.chmod(command.stat().st_mode | stat.S_IEXEC)
    (folder / "tests").symlink_to(ROOT / "tests")
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-readme",
        "COMPACTION_PROXY_ADMIN_TOKEN": ADMIN_TOKEN,
        "PROXY_KEY": "a-proxy-key",
        "PYTHONPATH": str(ROOT),
        "OPENAI_AGENTS_DISABLE_TRACING": "1",  # the Agents SDK's traces go to OpenAI's servers
    }
    env.pop("OPENAI_BASE_URL", None)
    with FakeUpstream(windows={"gpt-4o-mini": 128_000}, api_key="sk-readme") as upstream:
        (folder / "my-config.yaml").write_text(defaults_towards(upstream))
        os.environ["COMPACTION_PROXY_ADMIN_TOKEN"] = ADMIN_TOKEN
        try:
            config = loads(defaults_towards(upstream))
        finally:
            del os.environ["COMPACTION_PROXY_ADMIN_TOKEN"]
        with proxy_server(config) as proxy:
            yield Setting(folder, proxy, upstream, env)


def test_every_example_is_run_or_said_why_not() -> None:
    kinds = {b.language for b in blocks("sh") + blocks("python") + blocks("yaml")}
    assert kinds == {"sh", "python", "yaml"}
    left_out = {b.first_line for b in blocks("sh") + blocks("python") if not_run(b)}
    assert len(left_out) == len(NOT_RUN), "a NOT_RUN entry matches no example any more"
    assert len(run_blocks("sh")) >= 4 and len(run_blocks("python")) == 2


@pytest.mark.subprocess
@pytest.mark.parametrize("index", range(len(run_blocks("python"))))
def test_python_example(setting: Setting, index: int) -> None:
    block = run_blocks("python")[index]
    env = dict(setting.env)
    if block.first_line.startswith("# OPENAI_BASE_URL="):  # as its first line says to run it
        env["OPENAI_BASE_URL"] = setting.rewritten(block.first_line.split("=", 1)[1].split()[0])
    before = len(setting.upstream.requests)
    result = subprocess.run(
        [sys.executable, "-c", setting.rewritten(block.text)],
        cwd=setting.folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(setting.upstream.requests) > before, "the example never reached the upstream"


def sh_block(start: str) -> Block:
    [block] = [b for b in run_blocks("sh") if b.first_line.startswith(start)]
    return block


@pytest.mark.subprocess
def test_curl_example_is_answered_with_the_compaction_headers(setting: Setting) -> None:
    result = setting.shell(setting.rewritten(sh_block("curl").text))
    assert result.returncode == 0, result.stderr
    assert re.search(r"^x-compaction-action: none", result.stdout, re.M | re.I), result.stdout
    assert '"choices"' in result.stdout


@pytest.mark.subprocess
def test_replay_example_writes_its_chart_outside_the_repository(setting: Setting) -> None:
    block = sh_block(".venv/bin/compaction-proxy replay")
    assert "/tmp/turns.svg" in block.text
    result = setting.shell(setting.rewritten(block.text), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "compactions" in result.stdout
    assert (setting.folder / "turns.svg").read_text().startswith("<svg")


@pytest.mark.subprocess
def test_sessions_example_shows_the_session_of_an_answer(setting: Setting) -> None:
    result = setting.shell(setting.rewritten(sh_block("SESSION_KEY=").text))
    assert result.returncode == 0, result.stderr
    shown: dict[str, Any] = yaml.safe_load(result.stdout)  # JSON is YAML
    assert "branches" in shown, result.stdout


@pytest.mark.subprocess
def test_config_commands_example(setting: Setting) -> None:
    """check-config and hash-key as written; `serve` on a free port, until it is ready."""
    lines = sh_block(".venv/bin/compaction-proxy check-config").text.strip().splitlines()
    commands = [line.split("  #")[0].strip() for line in lines]
    check, serve, hash_key = commands
    result = setting.shell(check)
    assert result.returncode == 0, result.stderr
    assert "upstreams" in result.stdout
    result = setting.shell(hash_key)
    assert result.returncode == 0 and re.fullmatch(r"[0-9a-f]{64}\n", result.stdout)

    port = free_port()
    assert "--port 8080" in serve
    with serving(setting, "exec " + serve.replace("--port 8080", f"--port {port}"), port):
        pass


@pytest.mark.subprocess
def test_trying_it_on_the_fake_upstream(setting: Setting) -> None:
    """The fake and the proxy as the example starts them (on free ports), a chat answered
    through both, and the dashboard behind the token it sets."""
    fake, port = free_port(), free_port()
    script = sh_block(".venv/bin/python -m tests.fakes.openai").text
    assert "8001" in script and script.rstrip().endswith("make serve CONFIG=try.yaml")
    serve = f"exec .venv/bin/compaction-proxy serve --config try.yaml --port {port}"
    script = script.replace("8001", str(fake)).replace("make serve CONFIG=try.yaml", serve)
    python = setting.folder / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    with serving(setting, script, port, f"http://127.0.0.1:{fake}/v1/models") as url:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}
        reply = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Session-Id": "t"})
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-compaction-action"] == "none"
        token = re.search(r"admin: \{token: ([\w-]+)\}", script)
        assert token is not None
        admin = {"Authorization": f"Bearer {token[1]}"}
        assert httpx.get(url + "/admin/dashboard/api/sessions", headers=admin).status_code == 200


@contextlib.contextmanager
def serving(setting: Setting, script: str, port: int, *also: str) -> Iterator[str]:
    """`script` run in a session of its own (what it starts in the background goes with it),
    until the proxy it starts on `port` is ready and the URLs `also` answer: its URL."""
    ready = [f"http://127.0.0.1:{port}/readyz", *also]
    process = subprocess.Popen(
        ["bash", "-c", script],
        cwd=setting.folder,
        env=setting.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        for url in ready:  # the proxy's, then any other its script starts
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url).status_code < 500:  # the fake asks for a key
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, f"{url} did not answer"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def test_every_shell_example_that_runs_has_its_test() -> None:
    tested = ("curl", ".venv/bin/compaction-proxy replay", "SESSION_KEY=")
    tested += (".venv/bin/compaction-proxy check-config", ".venv/bin/python -m tests.fakes.openai")
    starts = [next(s for s in tested if b.first_line.startswith(s)) for b in run_blocks("sh")]
    assert sorted(starts) == sorted(tested)


@pytest.mark.parametrize("index", range(len(blocks("yaml"))))
def test_yaml_example_is_a_config_the_proxy_loads(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each YAML example, added to the default config as a user would add it."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-readme")
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    example = yaml.safe_load(blocks("yaml")[index].text)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(merged(base, example)))
    config = load(path)
    assert set(example["upstreams"]) <= set(config.upstreams)


def test_codex_examples_point_codex_at_the_proxy() -> None:
    """The built-in provider at the proxy, and a Responses provider of its own."""
    built_in, own = (tomllib.loads(block.text) for block in blocks("toml"))
    assert built_in["openai_base_url"] == f"{ADDRESS}/v1"
    provider = own["model_providers"][own["model_provider"]]
    assert provider["base_url"] == f"{ADDRESS}/v1"
    assert provider["wire_api"] == "responses"


def test_the_commands_examples_use_exist() -> None:
    for command in ("curl", "bash", "awk"):
        assert shutil.which(command), f"{command} is needed by the README's examples"
