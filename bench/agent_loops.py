"""Prefix stability of agent loops through the running proxy: the share of turns whose
forwarded conversation starts with the turn before's (providers' prompt caches read it back),
the compactions, and the tokens forwarded, for the default policy and the settings given.

    .venv/bin/python bench/agent_loops.py                       # about 30 s
    .venv/bin/python bench/agent_loops.py --set headroom_turns=6 --set target_floor=0.2

- chat: tests/test_long_sessions.py's 45 tool iterations with 1.5k-4k-token results at 16k,
  streamed (chat completions, 256 tokens of output reserved);
- responses: tests/test_responses_sessions.py's 40-iteration Codex-like loop at 16k with
  encrypted reasoning (the Responses API).

Each runs the proxy (memory store) in front of the test suite's strict fake, with its own
summarizer; "tokens forwarded" is the sum over the turns of `x-compaction-tokens-after`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.codex import Codex, codex_servers  # noqa: E402
from tests.conversations import ANCHOR  # noqa: E402
from tests.replay import replay, replay_servers, stability  # noqa: E402
from tests.test_long_sessions import agent_loop  # noqa: E402
from tests.test_responses_sessions import ITERATIONS, result, stable_share  # noqa: E402


def chat(policy: dict[str, Any]) -> tuple[int, int, float, int]:
    with replay_servers(anchors=[ANCHOR], **policy) as (up, client):
        turns = replay(client, up, agent_loop(45), model="gpt-4o-16k", stream=True)
    share = stability([[(t.sent, t.view) for t in turns]]).share
    compactions = sum(t.action in ("compacted", "degraded") for t in turns)
    return len(turns), compactions, share, sum(t.tokens_after for t in turns)


def responses(policy: dict[str, Any]) -> tuple[int, int, float, int]:
    with codex_servers(anchors=[ANCHOR], **policy) as (up, server), Codex(server.url, up) as agent:
        agent.said("Fix the failing booking tests.")
        turns = [agent.send(tool_choice="required")]
        for i in range(ITERATIONS):
            agent.answer(result(i))
            turns.append(agent.send(tool_choice="required" if i < ITERATIONS - 1 else "none"))
    compactions = sum(t.action in ("compacted", "degraded") for t in turns)
    forwarded = sum(int(t.headers["x-compaction-tokens-after"]) for t in turns)
    return len(turns), compactions, stable_share(turns), forwarded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--set", action="append", default=[], help="a policy key=value (YAML), repeatable"
    )
    args = parser.parse_args()
    policy = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    print(f"policy: {policy or 'default'}")
    print("| loop | turns | compactions | stable | tokens forwarded |")
    print("|---|---|---|---|---|")
    loops = {"chat, 45 iterations, 16k": chat, "responses, 40 iterations, 16k": responses}
    for name, run in loops.items():
        turns, compactions, share, forwarded = run(policy)
        print(f"| {name} | {turns} | {compactions} | {share:.1%} | {forwarded:,} |")


if __name__ == "__main__":
    main()
