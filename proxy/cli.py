"""`compaction-proxy serve | check-config | hash-key | replay`."""

from __future__ import annotations

import argparse
import sys

import orjson

from . import config as config_module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="OpenAI-compatible proxy that keeps conversations inside the context window.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="config file (default: the repository's config.yaml)")
    serve.add_argument("--host", help="listen address (overrides listen.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides listen.port)")
    check = commands.add_parser("check-config", help="validate a config and print it resolved")
    check.add_argument("file", nargs="?", help="config file (default: config.yaml)")
    hash_key = commands.add_parser("hash-key", help="print the sha256 of an inbound key")
    hash_key.add_argument("key", help="the key a client will present")
    args = parser.parse_args(argv)

    if args.command == "hash-key":
        from .tenants import hash_key as digest

        print(digest(args.key))
        return 0
    path = args.config if args.command == "serve" else args.file
    listen = {}
    if args.command == "serve":
        listen = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        # Command-line values go through the same checks as the file's (a new host can turn
        # a safe config into an open relay).
        config = config_module.load(path, listen=listen)
    except config_module.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == "check-config":
        sys.stdout.write(orjson.dumps(config.masked(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    return _serve(config)


def _serve(config: config_module.Config) -> int:
    import uvicorn

    from .app import create_app, server_config
    from .logs import configure

    configure(config.logging)
    uvicorn.Server(server_config(create_app(config), config)).run()
    return 0
