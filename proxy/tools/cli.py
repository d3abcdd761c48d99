"""`compaction-proxy serve | check-config | hash-key | replay | sessions`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from proxy import config as config_module


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "hash-key":
        from proxy.credentials import hash_key as digest

        print(digest(args.key))
        return 0
    if args.command == "sessions":
        return _sessions(args)
    path = args.file if args.command == "check-config" else args.config
    listen = {}
    if args.command == "serve":
        given = (("host", args.host), ("port", args.port), ("workers", args.workers))
        listen = {k: v for k, v in given if v is not None}
    try:
        # Command-line values go through the same checks as the file's (a new host can turn
        # a safe config into an open relay).
        config = config_module.load(path, listen=listen)
        if any(u.kind == "litellm" for u in config.upstreams.values()):
            # litellm places the provider models (an import of seconds, no network).
            from proxy.upstream.litellm_setup import check_providers

            check_providers(config)
    except config_module.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == "check-config":
        _print_json(config.masked())
        return 0
    if args.command == "replay":
        return _replay(args, config)
    return _serve(config)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="OpenAI-compatible proxy that keeps conversations inside the context window.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="config file (default: the repository's config.yaml)")
    serve.add_argument("--host", help="listen address (overrides listen.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides listen.port)")
    serve.add_argument(
        "--workers", type=int, help="processes serving the port (overrides listen.workers)"
    )
    check = commands.add_parser("check-config", help="validate a config and print it resolved")
    check.add_argument("file", nargs="?", help="config file (default: config.yaml)")
    hash_key = commands.add_parser("hash-key", help="print the sha256 of an inbound key")
    hash_key.add_argument("key", help="the key a client will present")

    replay = commands.add_parser(
        "replay",
        help="replay recorded conversations through a policy, offline",
        description="Replay recorded conversations (JSONL: one conversation with 'messages' "
        "a line, or one request body a line) turn by turn through the proxy's compactor, "
        "offline: the mechanical digest stands in for the summarizer unless --live.",
    )
    replay.add_argument("files", nargs="+", metavar="FILE", help="JSONL file; - for stdin")
    replay.add_argument("--config", help="config file (default: the repository's config.yaml)")
    replay.add_argument("--policy", help="the policy to use (default: as the config routes)")
    replay.add_argument("--model", help="the model of every request (conversations need one)")
    replay.add_argument("--window", type=_positive, help="the model's context window, in tokens")
    replay.add_argument("--join", type=_positive, default=1, help="conversations per session")
    replay.add_argument("--chart", help="draw the turns to this .svg, .html or .png file")
    replay.add_argument("--title", help="the chart's title (default: the files and the model)")
    replay.add_argument("--json", action="store_true", help="print the turns as JSON")
    replay.add_argument("--quiet", action="store_true", help="print only the totals")
    replay.add_argument(
        "--live",
        action="store_true",
        help="ask the configured summarizer for summaries (real upstream calls)",
    )

    sessions = commands.add_parser("sessions", help="inspect, reset or compact a session")
    sessions.add_argument("--url", default="http://127.0.0.1:8080", help="the proxy's address")
    sessions.add_argument(
        "--token", help="the admin token (default: $COMPACTION_PROXY_ADMIN_TOKEN)"
    )
    actions = sessions.add_subparsers(dest="action", required=True)
    for name, text in (("show", "print a session's state"), ("reset", "forget a session")):
        actions.add_parser(name, help=text).add_argument("key", help="x-compaction-session")
    compact = actions.add_parser("compact", help="compact a session on its next request")
    compact.add_argument("key", help="the session's key (x-compaction-session)")
    compact.add_argument("--instructions", default="", help="for the summarizer")
    key = actions.add_parser("key", help="the key of a tenant's session")
    key.add_argument("--tenant", required=True)
    key.add_argument("--session", required=True)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _print_json(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def _serve(config: config_module.Config) -> int:
    from proxy.server.workers import serve

    return serve(config, _startup(config))


def _startup(config: config_module.Config) -> dict[str, Any]:
    """What an operator wants to see at start-up: never a secret (store URLs lose their
    credentials, upstreams are named, not shown)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("compaction-proxy")
    except PackageNotFoundError:
        release = "unknown"
    return {
        "version": release,
        "store": config.store.url.split("://", 1)[0],
        "upstreams": {name: u.kind for name, u in config.upstreams.items()},
        "policies": sorted(config.policies),
        "auth": "inbound keys" if config.auth.keys else "client credentials",
        "admin_api": "on" if config.admin.token else "off (set admin.token to turn it on)",
    }


def _replay(args: argparse.Namespace, config: config_module.Config) -> int:
    from proxy.tools import chart, replay
    from proxy.tools.recordings import RecordingError, read_requests

    if args.window:
        config = replay.with_window(config, args.window)
    try:
        if args.chart:
            chart.check(args.chart)  # before a replay that may be long
        recorded = read_requests(args.files, model=args.model, join=args.join)
        turns = replay.run(recorded, config, policy=args.policy, live=args.live)
        if args.chart:
            chart.write(args.chart, turns, args.title or _title(args))
    except (RecordingError, chart.ChartError) as exc:
        print(f"compaction-proxy replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(replay.as_json(turns).decode() + "\n")
    elif args.quiet:
        print("\n".join(replay.summary(replay.Totals.of(turns))))
    else:
        print(replay.table(turns))
    return 0


def _title(args: argparse.Namespace) -> str:
    names = ", ".join("standard input" if f == "-" else Path(f).name for f in args.files)
    model = f", {args.model}" if args.model else ""
    window = f" at a {args.window}-token window" if args.window else ""
    return f"{names}{model}{window}"


def _sessions(args: argparse.Namespace) -> int:
    from proxy.tools.admin_client import TOKEN_VARIABLE, AdminCallFailed, AdminClient

    token = args.token or os.environ.get(TOKEN_VARIABLE)
    if not token:
        print(f"give the admin token with --token or ${TOKEN_VARIABLE}", file=sys.stderr)
        return 2
    try:
        client = AdminClient(args.url, token)
        if args.action == "show":
            answer = client.show(args.key)
        elif args.action == "reset":
            answer = client.reset(args.key)
        elif args.action == "compact":
            answer = client.compact(args.key, args.instructions)
        else:
            answer = client.key(args.tenant, args.session)
    except AdminCallFailed as exc:
        print(f"compaction-proxy sessions: {exc}", file=sys.stderr)
        return 1
    _print_json(answer)
    return 0
