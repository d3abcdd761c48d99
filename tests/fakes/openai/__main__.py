"""``python -m tests.fakes.openai --port 8001 --window small-8k=8192``: serve until Ctrl-C."""

from __future__ import annotations

import argparse
import threading

from tests.fakes.openai.server import FakeUpstream


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the fake OpenAI upstream until Ctrl-C.")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--window", action="append", default=[], metavar="MODEL=TOKENS")
    parser.add_argument("--behavior", default="")
    args = parser.parse_args()
    windows = {m: int(n) for m, _, n in (w.partition("=") for w in args.window)}
    with FakeUpstream(windows=windows, behavior=args.behavior, record=False, port=args.port) as up:
        print(up.base_url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
