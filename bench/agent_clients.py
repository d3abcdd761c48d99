"""The real agent clients, end to end: Codex CLI and Claude Code run their tool loop through
`compaction-proxy serve` in front of the test suite's strict fakes, and a report says what the
proxy did to them. Opt-in (`make agents-e2e`, which installs the clients first with
scripts/agents-e2e.sh); docs/agents-e2e.md tells the whole of it.

    scripts/agents-e2e.sh                              # both clients, 30 iterations each
    .venv/bin/python bench/agent_clients.py --clients .agents/node_modules/.bin \\
        --client claude --iterations 12 --subagent-at 5 --fixtures tests/data/clients

For each client: a fake of its API on loopback (tests/fakes/openai for Codex's Responses
requests, tests/fakes/anthropic.py for Claude Code's Messages) whose model is scripted
(bench/agent_model.py): it makes the client run `cat logs/step-NN.log` with its own shell tool
for N iterations, each log a few KB with a fact in the middle, then answer. The proxy, with a
generated config (the fake as its upstream, the client's model at a small window, the memory
store, the admin API, JSON logs), sits between them; a recording relay (bench/recorder.py)
between the client and the proxy keeps what the client sent. The client runs once, in a
temporary directory of its own with a private HOME, non-interactively.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' fakes
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from agent_model import AgentModel, Fact, extractive_summary, make_workspace, task
from agent_report import Run, print_report, report, save_fixtures, save_traffic
from common import ROOT, Server, proxy
from recorder import Recorder

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.base import RECORDING_KEY
from tests.fakes.openai import FakeUpstream

Fake = FakeUpstream | FakeAnthropic

ADMIN_TOKEN = "agents-e2e-admin"
API_KEY = "sk-agents-e2e"  # the fakes take any key: nothing secret is recorded
SEED = 23


@dataclasses.dataclass(frozen=True)
class Client:
    """How one agent client is run: its model, the window the proxy gives it, its fake."""

    name: str
    model: str
    window: int
    dialect: str  # the proxy's: responses or messages
    fake: Callable[..., Fake]
    command: Callable[[Client, Path, str], list[str]]  # (itself, where it is, the prompt)
    # (itself, its home, the proxy's origin, whether it is told the window): its environment
    environment: Callable[[Client, Path, str, bool], dict[str, str]]
    compact_at: int | None = None  # Codex: its own compaction from this many tokens on


def _codex_command(client: Client, clients: Path, prompt: str) -> list[str]:
    return [str(clients / "codex"), "exec", "--json", "--skip-git-repo-check", prompt]


def _codex_environment(client: Client, home: Path, origin: str, told: bool) -> dict[str, str]:
    """A private CODEX_HOME whose config.toml names the proxy as a custom provider."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    window = f"model_context_window = {client.window}\n" if told else ""
    if client.compact_at is not None:  # Codex compacts by itself past this usage
        window += f"model_auto_compact_token_limit = {client.compact_at}\n"
    (codex_home / "config.toml").write_text(
        f'model = "{client.model}"\n'
        'model_provider = "agents-e2e"\n'
        f"{window}"
        "check_for_update_on_startup = false\n"
        "\n[analytics]\nenabled = false\n"
        "\n[model_providers.agents-e2e]\n"
        'name = "compaction-proxy"\n'
        f'base_url = "{origin}/v1"\n'
        'env_key = "AGENTS_E2E_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    return {"CODEX_HOME": str(codex_home), "AGENTS_E2E_API_KEY": API_KEY}


def _claude_command(client: Client, clients: Path, prompt: str) -> list[str]:
    command = [str(clients / "claude"), "-p", "--output-format", "stream-json", "--verbose"]
    return [*command, "--dangerously-skip-permissions", "--model", client.model, prompt]


def _claude_environment(client: Client, home: Path, origin: str, told: bool) -> dict[str, str]:
    # The names are Claude Code's own (its settings docs and its binary's strings). As root,
    # --dangerously-skip-permissions is refused unless IS_SANDBOX says it is a sandbox.
    window = {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(client.window)} if told else {}
    return {
        **window,
        "ANTHROPIC_BASE_URL": origin,
        "ANTHROPIC_API_KEY": API_KEY,
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


CODEX = Client(
    "codex",
    "gpt-5.5",  # a model Codex CLI 0.171 knows (its tools, its prompt)
    16_384,
    "responses",
    FakeUpstream,
    _codex_command,
    _codex_environment,
)
CLAUDE = Client(
    "claude",
    "claude-opus-5-5",  # Claude Code 2.1.332's default
    32_768,  # holds Claude Code's fixed prompt with any of its models (~22k with Sonnet 4.5)
    "messages",
    FakeAnthropic,
    _claude_command,
    _claude_environment,
)
CLIENTS = {client.name: client for client in (CODEX, CLAUDE)}


# --via-litellm: each client on the other vendor's API, through an upstream of kind litellm
# (Codex on Claude, Claude Code on a server with chat completions only): litellm's provider
# model, and the model the fake serves.
VIA_LITELLM = {
    "responses": ("anthropic/claude-sonnet-4-5", "claude-sonnet-4-5"),
    "messages": ("openai/{model}", None),
}


def proxy_config(client: Client, fake: Fake, via_litellm: bool = False) -> str:
    """The proxy's config: the fake as its one upstream, the client's model at its window."""
    upstream: dict[str, Any] = {"base_url": f"{fake.origin}/v1"}
    if via_litellm:
        base_url = fake.base_url  # litellm's api_base: the OpenAI fake's has /v1, Anthropic's not
        provider_model = VIA_LITELLM[client.dialect][0]
        upstream = {"kind": "litellm", "base_url": base_url, "provider_model": provider_model}
        upstream["api_key"] = API_KEY
    elif client.dialect == "messages":
        upstream["kind"] = "anthropic"
    config = {
        "store": {"url": "memory://"},
        "upstreams": {"fake": upstream},
        "default_upstream": "fake",
        "models": [{"match": client.model, "context_window": client.window}],
        "admin": {"token": ADMIN_TOKEN},
        "logging": {"level": "info", "format": "json"},
    }
    return yaml.safe_dump(config)


@contextlib.contextmanager
def _servers(
    client: Client, model: AgentModel, tree: Path | None, via_litellm: bool
) -> Iterator[tuple[Fake, Server, Recorder]]:
    served = (via_litellm and VIA_LITELLM[client.dialect][1]) or client.model
    settings: dict[str, Any] = {
        "windows": {served: client.window},
        "summarizer": extractive_summary,
        "signing_key": RECORDING_KEY,  # the fixtures' reasoning and thinking stay verifiable
    }
    if via_litellm and client.dialect == "messages":
        # Chat completions only; a chat body reads as Messages does.
        fake: Fake = FakeUpstream(chat_only=True, script=model.messages, **settings)
    elif via_litellm:
        fake = FakeAnthropic(script=model.messages, **settings)
    else:
        script = model.responses if client.dialect == "responses" else model.messages
        fake = client.fake(script=script, **settings)
    with fake, proxy(proxy_config(client, fake, via_litellm), tree) as server:
        origin = server.url.removesuffix("/v1")
        with Recorder(origin) as recorder:
            yield fake, server, recorder


def run_client(client: Client, args: argparse.Namespace) -> Run:
    """One run of the client through the proxy: everything recorded, nothing measured yet."""
    with tempfile.TemporaryDirectory(prefix=f"agents-e2e-{client.name}-") as temporary:
        work, home = Path(temporary, "work"), Path(temporary, "home")
        home.mkdir()
        facts: list[Fact] = make_workspace(work, args.iterations, SEED)
        subagent = args.subagent_at if client.name == "claude" else None
        model = AgentModel(args.iterations, subagent)
        with _servers(client, model, args.tree, args.via_litellm) as (fake, server, recorder):
            environment = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(home),
                "LANG": "C.UTF-8",
                **client.environment(client, home, recorder.origin, args.tell_window),
            }
            if args.default_max_tokens:  # the client's own default output (Claude Code's 128k)
                environment.pop("CLAUDE_CODE_MAX_OUTPUT_TOKENS", None)
            command = client.command(client, args.clients.resolve(), task(args.iterations))
            started = time.monotonic()
            try:
                done = subprocess.run(
                    command,
                    cwd=work,
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=args.timeout,
                    check=False,
                )
                exit_code: int | str = done.returncode
                stdout, stderr = done.stdout, done.stderr
            except subprocess.TimeoutExpired as expired:
                exit_code = f"timeout after {args.timeout} s"
                stdout, stderr = expired.stdout or b"", expired.stderr or b""
            took = time.monotonic() - started
            sessions = _sessions(server, recorder)
            log = server.log.read_text()
            return Run(
                client=client.name,
                model=client.model,
                window=client.window,
                iterations=args.iterations,
                facts=facts,
                exit_code=exit_code,
                seconds=took,
                stdout=stdout.decode(errors="replace"),
                stderr=stderr.decode(errors="replace"),
                exchanges=recorder.exchanges,
                forwarded=fake.requests,
                answered=fake.answered,
                rejected=fake.rejected,
                summary_calls=fake.summary_calls,
                log=[orjson.loads(line) for line in log.splitlines() if line.startswith("{")],
                sessions=sessions,
            )


def _sessions(server: Server, recorder: Recorder) -> dict[str, Any]:
    """The admin API's view of every session the client's requests named."""
    origin = server.url.removesuffix("/v1")
    keys = {k for e in recorder.exchanges if (k := e.headers.get("x-compaction-session"))}
    found = {}
    for key in sorted(keys):
        request = urllib.request.Request(
            f"{origin}/admin/sessions/{key}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            found[key] = orjson.loads(answer.read())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--clients",
        type=Path,
        default=ROOT / ".agents/node_modules/.bin",
        help="where the codex and claude commands are (scripts/agents-e2e.sh installs them)",
    )
    parser.add_argument("--client", choices=[*CLIENTS, "all"], default="all")
    parser.add_argument("--iterations", type=int, default=30, help="tool calls in each run")
    parser.add_argument(
        "--subagent-at", type=int, default=None, help="Claude Code: the step a sub-agent does"
    )
    parser.add_argument("--model", default=None, help="the model the client is run with")
    parser.add_argument(
        "--default-max-tokens",
        action="store_true",
        help="Claude Code: its own default max_tokens, not CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096",
    )
    parser.add_argument(
        "--tell-window",
        action="store_true",
        help="tell the client the window (then it compacts by itself near it)",
    )
    parser.add_argument(
        "--codex-compact-at",
        type=int,
        default=None,
        help="Codex's model_auto_compact_token_limit: it compacts by itself past that usage",
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=None,
        help="run the proxy of that checkout (a `git worktree` of another commit): a before",
    )
    parser.add_argument(
        "--via-litellm",
        action="store_true",
        help="Codex on Claude and Claude Code on a chat-completions server, via litellm",
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds for one client run")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench/results/agents-e2e.json", help="the JSON report"
    )
    parser.add_argument(
        "--fixtures", type=Path, default=None, help="save request bodies of the clients here"
    )
    args = parser.parse_args()
    if args.via_litellm:  # the proxy imports litellm at start: seconds, tens on a busy machine
        common.START_TIMEOUT = 120.0
    chosen = list(CLIENTS.values()) if args.client == "all" else [CLIENTS[args.client]]
    if args.model is not None:
        chosen = [dataclasses.replace(client, model=args.model) for client in chosen]
    if args.codex_compact_at is not None:
        chosen = [
            dataclasses.replace(client, compact_at=args.codex_compact_at)
            if client.name == "codex"
            else client
            for client in chosen
        ]
    reports = {}
    for client in chosen:
        run = run_client(client, args)
        reports[client.name] = report(run)
        print_report(reports[client.name])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        saved = save_traffic(run, args.out.with_suffix(""))
        if args.fixtures is not None:
            saved += save_fixtures(run, args.fixtures)
        print("written:", *(str(path) for path in saved))
    args.out.write_bytes(orjson.dumps(reports, option=orjson.OPT_INDENT_2))
    print(f"\nreport written to {args.out}")


if __name__ == "__main__":
    main()
