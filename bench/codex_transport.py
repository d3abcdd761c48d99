"""Codex CLI's built-in provider pointed at the proxy (`openai_base_url`): how long from its
start to its first model call, by how the proxy answers the WebSocket it opens first.

    .venv/bin/python bench/codex_transport.py --clients .agents/node_modules/.bin \\
        [--before TREE] [--runs 3]

The built-in provider always tries a WebSocket (`supports_websockets` cannot be turned off
for it): the proxy serves it (the default), or refuses it with a 426 (`listen.websockets:
false`), on which Codex falls back to HTTP at once; `--before TREE` adds the proxy of that
checkout (one from before the 426, e.g. `git archive f4044cb^`), which refused it with a 403,
retried about five times. Each run is `codex exec` of a task of `--steps` tool calls
(bench/agent_model.py, as bench/agent_clients.py runs it) against the test suite's fake
upstream behind the proxy, the time to the first model call being when the fake receives its
first `/v1/responses` request (the WebSocket's warm-up, which the proxy answers, is none); the
proxy's log says what it did to each request.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_clients import API_KEY, CODEX, proxy_config
from agent_model import AgentModel, extractive_summary, make_workspace, task
from common import ROOT, proxy

from tests.fakes.base import RECORDING_KEY
from tests.fakes.openai import FakeUpstream

# The proxy's log lines that tell how the client's WebSockets went.
_COUNTED = ("websocket upgrade refused", "websocket opened")


def _home(root: Path, origin: str, clients: Path) -> dict[str, str]:
    """A private HOME and CODEX_HOME: the built-in provider at the proxy, logged in with a key."""
    codex_home = root / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        f'model = "{CODEX.model}"\n'
        f'openai_base_url = "{origin}/v1"\n'
        "check_for_update_on_startup = false\n"
        "\n[analytics]\nenabled = false\n"
    )
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "LANG": "C.UTF-8",
        "CODEX_HOME": str(codex_home),
    }
    login = [str(clients / "codex"), "login", "--with-api-key"]
    subprocess.run(login, input=API_KEY.encode(), env=environment, capture_output=True, check=True)
    return environment


def run_once(
    clients: Path, steps: int, listen: dict[str, Any], tree: Path | None
) -> dict[str, Any]:
    """One `codex exec` of a task of `steps` tool calls through a proxy with `listen` (from
    `tree`, when given)."""
    fake = FakeUpstream(
        windows={CODEX.model: CODEX.window},
        script=AgentModel(steps).responses,
        summarizer=extractive_summary,
        signing_key=RECORDING_KEY,
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake)
        config = {**yaml.safe_load(proxy_config(CODEX, fake)), "listen": listen}
        server = stack.enter_context(proxy(yaml.safe_dump(config), tree))
        temporary = stack.enter_context(tempfile.TemporaryDirectory(prefix="codex-transport-"))
        work, home = Path(temporary, "work"), Path(temporary, "home")
        home.mkdir()
        make_workspace(work, steps, 23)
        environment = _home(home, server.url.removesuffix("/v1"), clients)
        command = [str(clients / "codex"), "exec", "--json", "--skip-git-repo-check", task(steps)]
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=work,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        first = None
        while first is None and process.poll() is None:
            if any(r.path == "/v1/responses" for r in fake.requests):
                first = time.monotonic() - started
            time.sleep(0.005)
        process.wait(timeout=600)
        took = time.monotonic() - started
        lines = server.log.read_text().splitlines()
        logged = [orjson.loads(line) for line in lines if line.startswith("{")]
        events = collections.Counter(line.get("event") for line in logged)
        actions = collections.Counter(
            line["action"] for line in logged if line.get("event") == "request forwarded"
        )
        return {
            "exit": process.returncode,
            "first_call_s": first,
            "total_s": took,
            "model_calls": sum(r.path == "/v1/responses" for r in fake.requests),
            "rejected": fake.rejected,
            "actions": ", ".join(f"{name} {n}" for name, n in sorted(actions.items())),
            **{name: events[name] for name in _COUNTED},
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=Path, default=ROOT / ".agents/node_modules/.bin")
    parser.add_argument("--before", type=Path, default=None, help="a checkout before the 426")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1, help="tool calls in each run")
    args = parser.parse_args()
    settings: list[tuple[str, dict[str, Any], Path | None]] = [
        ("WebSocket served", {}, None),
        ("426, then HTTP", {"websockets": False}, None),
    ]
    if args.before is not None:
        settings.append(("403 (before the 426)", {}, args.before))
    print(
        "| the proxy's answer to the WebSocket | first model call | whole run | upgrades refused"
        " (logged) | WebSockets served | model calls | rejected upstream | actions | exit |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, listen, tree in settings:
        runs = [
            run_once(args.clients.resolve(), args.steps, listen, tree) for _ in range(args.runs)
        ]
        first = statistics.median(r["first_call_s"] or math.nan for r in runs)
        total = statistics.median(r["total_s"] for r in runs)
        last = runs[-1]
        print(
            f"| {name} | {first:.2f} s | {total:.2f} s | {last['websocket upgrade refused']} |"
            f" {last['websocket opened']} | {last['model_calls']} | {last['rejected']} |"
            f" {last['actions']} | {','.join(str(r['exit']) for r in runs)} |"
        )


if __name__ == "__main__":
    main()
