"""`compaction-proxy` / `python -m proxy`: serve, check-config, hash-key."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from proxy.tools.cli import main

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "compaction-proxy"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.subprocess
def test_check_config_prints_the_resolved_config() -> None:
    result = run("check-config", "config.yaml")
    assert result.returncode == 0, result.stderr
    resolved = orjson.loads(result.stdout)
    assert resolved["listen"]["host"] == "127.0.0.1"
    assert resolved["upstreams"]["openai"]["base_url"] == "https://api.openai.com/v1"
    assert resolved["store"]["url"] == "memory://"


@pytest.mark.subprocess
def test_check_config_masks_secrets(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(
        "upstreams:\n"
        "  main:\n"
        "    base_url: https://api.openai.com/v1\n"
        "    api_key: ${CP_TEST_CLI_KEY}\n"
        "store:\n"
        "  url: redis://:${CP_TEST_CLI_REDIS}@127.0.0.1:6379/0\n"
        "admin:\n"
        "  token: admin-secret-2\n"
    )
    secrets = {"CP_TEST_CLI_KEY": "sk-cli-secret-1", "CP_TEST_CLI_REDIS": "redis-secret-3"}
    result = run("check-config", str(file), env=secrets)
    assert result.returncode == 0, result.stderr
    for secret in [*secrets.values(), "admin-secret-2"]:
        assert secret not in result.stdout + result.stderr
    resolved = orjson.loads(result.stdout)
    assert resolved["upstreams"]["main"]["api_key"] == "***"
    assert resolved["admin"]["token"] == "***"


def test_check_config_reports_every_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(
        "upstreams:\n  main:\n    base_url: http://127.0.0.1:1/v1\nlisten:\n  prot: 80\n"
        "  host: [1]\n"
    )
    assert main(["check-config", str(file)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"listen.prot ({file}, line 5): unknown key" in err
    assert f"listen.host ({file}, line 6): expected a string" in err


def test_hash_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "pk-team-a"]) == 0
    assert capsys.readouterr().out.strip() == hashlib.sha256(b"pk-team-a").hexdigest()


@pytest.mark.subprocess
def test_serve_refuses_to_become_an_open_relay(tmp_path: Path) -> None:
    file = tmp_path / "relay.yaml"
    file.write_text("upstreams:\n  main:\n    base_url: http://127.0.0.1:1/v1\n    api_key: k\n")
    result = run("serve", "--config", str(file), "--host", "0.0.0.0")
    assert result.returncode == 2
    assert "auth" in result.stderr and "0.0.0.0" in result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.subprocess
def test_serve_starts_on_the_repository_config() -> None:
    port = free_port()
    server = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port)],
        cwd="/",  # the repository's config.yaml is found from anywhere
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "COMPACTION_PROXY_ADMIN_TOKEN"},
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert server.poll() is None, server.communicate()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the proxy did not start"
                time.sleep(0.05)
        assert health.json() == {"status": "ok"}
        # Ready once the tokenizer has loaded in the background.
        while httpx.get(f"http://127.0.0.1:{port}/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the proxy did not become ready"
            time.sleep(0.05)
        missing = httpx.get(f"http://127.0.0.1:{port}/nowhere")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        # Without an admin token the admin API is off, and its paths say how to turn it on.
        off = httpx.get(f"http://127.0.0.1:{port}/admin/dashboard").json()["error"]["message"]
        assert "admin API is off" in off and "COMPACTION_PROXY_ADMIN_TOKEN" in off
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C: no delay for a load balancer to notice
        _, err = server.communicate(timeout=10)
    assert server.returncode == 0, err
    assert b"Traceback" not in err
    # Where it listens, said once it does.
    said = [orjson.loads(line) for line in err.splitlines() if b'"listening"' in line]
    assert [event["url"] for event in said] == [f"http://127.0.0.1:{port}"]
    # What it serves with, and nothing secret.
    assert said[0]["store"] == "memory"
    assert said[0]["upstreams"] == {"openai": "openai"}
    assert said[0]["policies"] == ["default"] and said[0]["version"]
    assert said[0]["admin_api"] == "off (set admin.token to turn it on)"
    # The proxy's own refusals are logged, in its own words.
    refused = [orjson.loads(line) for line in err.splitlines() if b'"request refused"' in line]
    assert [(e["status"], e["code"]) for e in refused] == [(404, "not_found")] * 2
