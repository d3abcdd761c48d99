"""What a single-task agent loop keeps of what its tools found, in the three APIs (issue 23).

    .venv/bin/python bench/loop_summaries.py [--steps 30] [--before TREE]

A client of each API (chat completions, Responses, Messages; the real `openai` and
`anthropic` SDKs) runs one task of `--steps` tool calls through the proxy in front of the test
suite's fake upstream at a 16k window: each call reads a build log of bench/agent_model.py
(about 1,000 tokens, one `FACT-NN:` line in its middle), as bench/agent_clients.py's real
clients do. The proxy's summaries are the fakes' extractive summarizer (it keeps every fact
line it is given, as a good model would); `digest only`: the summarizer fails, so the
mechanical digest stands for what was evicted. Counted from the proxy's log and the fake:
requests the upstream rejected, compactions, those that made a summary (or digest) and those
that ended in `trim_head`; and the facts visible in the last forwarded request, verbatim or in
its summary (and, of them, those in the summary or digest itself, not in the block of lines
kept verbatim beside it). `--summarizer-url URL --summarizer-model NAME`: a row more per
API, labelled with that model, whose summaries that OpenAI-compatible endpoint writes through
the proxy's summarizer config (bench/real_summarizer.py). `--before TREE`: the same runs
through the proxy of that checkout as well (`git archive main | tar -x -C TREE`), in the same
run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' fakes
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_model import Fact, extractive_summary, make_workspace, strings, visible_facts
from common import proxy
from real_summarizer import RealSummarizer, add_arguments, from_arguments

from policies.plan import ANCHOR_HEADING, HEADINGS
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.openai import FakeUpstream, is_summary_request

WINDOW = 16_384
CHAT_MODEL, RESPONSES_MODEL, MESSAGES_MODEL = "gpt-4o-16k", "gpt-5-16k", "claude-loop-16k"
TASK = "Read the build logs one by one with the shell and keep every FACT line you find."
FAKE_TOOL_CALL = {"x-fake-behavior": "tool-call"}
Item = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Run:
    """One loop's figures."""

    rejected: int
    compactions: int
    summarized: int
    trimmed: int
    facts: int
    summarised: int  # of them, in the summary or digest itself (not the anchor block)
    planted: int


def failing_summary(body: dict[str, Any]) -> str:
    raise RuntimeError("no summary: the digest stands in")


class Loop:
    """One API's client: `step` sends the history and adds the answer and the tool's output."""

    def __init__(self, url: str, logs: list[str]) -> None:
        self.url, self.logs = url, logs

    def step(self, output: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ChatLoop(Loop):
    def __init__(self, url: str, logs: list[str]) -> None:
        super().__init__(url, logs)
        self.client = openai.OpenAI(base_url=url, api_key="sk-bench", max_retries=0)
        self.messages: list[Item] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": TASK},
        ]

    def step(self, output: str) -> None:
        answer = self.client.chat.completions.create(
            model=CHAT_MODEL,
            messages=self.messages,
            tools=[SHELL_CHAT],  # type: ignore[arg-type]
            extra_headers=FAKE_TOOL_CALL,
        )
        message = answer.choices[0].message.model_dump(mode="json", exclude_none=True)
        self.messages.append(message)
        for call in message.get("tool_calls") or []:
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})

    def close(self) -> None:
        self.client.close()


class ResponsesLoop(Loop):
    """As Codex sends them: stateless, reasoning items echoed back with their encrypted
    content, output items without id and status."""

    def __init__(self, url: str, logs: list[str]) -> None:
        super().__init__(url, logs)
        self.client = openai.OpenAI(base_url=url, api_key="sk-bench", max_retries=0)
        self.input: list[Item] = [
            {"role": "user", "content": [{"type": "input_text", "text": TASK}]}
        ]

    def step(self, output: str) -> None:
        answer = self.client.responses.create(
            model=RESPONSES_MODEL,
            instructions="You are a coding agent.",
            input=self.input,  # type: ignore[arg-type]
            tools=[SHELL_RESPONSES],
            store=False,  # type: ignore[list-item]
            include=["reasoning.encrypted_content"],
            extra_headers=FAKE_TOOL_CALL,
        )
        for item in answer.output:
            data = item.model_dump(mode="json", exclude_unset=True)
            self.input.append({k: v for k, v in data.items() if k not in ("id", "status")})
            if data["type"] == "function_call":
                self.input.append(
                    {"type": "function_call_output", "call_id": data["call_id"], "output": output}
                )

    def close(self) -> None:
        self.client.close()


class MessagesLoop(Loop):
    """As Claude Code sends them: thinking on, the whole history every turn."""

    def __init__(self, url: str, logs: list[str]) -> None:
        super().__init__(url, logs)
        self.client = anthropic.Anthropic(
            base_url=url.removesuffix("/v1"), api_key="sk-ant-bench", max_retries=0
        )
        self.messages: list[Item] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]

    def step(self, output: str) -> None:
        answer = self.client.messages.create(
            model=MESSAGES_MODEL,
            max_tokens=2048,
            system="You are a coding agent.",
            messages=self.messages,
            tools=[SHELL_MESSAGES],  # type: ignore[arg-type,list-item]
            thinking={"type": "enabled", "budget_tokens": 1024},
            extra_headers=FAKE_TOOL_CALL,
        )
        content = [block.model_dump(mode="json", exclude_none=True) for block in answer.content]
        self.messages.append({"role": "assistant", "content": content})
        results = [
            {"type": "tool_result", "tool_use_id": block["id"], "content": output}
            for block in content
            if block["type"] == "tool_use"
        ]
        self.messages.append({"role": "user", "content": results})

    def close(self) -> None:
        self.client.close()


_COMMAND = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
SHELL_CHAT = {"type": "function", "function": {"name": "shell", "parameters": _COMMAND}}
SHELL_RESPONSES = {"type": "function", "name": "shell", "parameters": _COMMAND}
SHELL_MESSAGES = {"name": "shell", "input_schema": _COMMAND}


@dataclasses.dataclass(frozen=True)
class Api:
    name: str
    model: str
    loop: Callable[[str, list[str]], Loop]
    fake: Callable[..., Any]
    kind: str | None  # the upstream's kind in the proxy's config

    def forwarded(self, fake: Any) -> list[Item]:
        """The bodies of the model requests the fake received (the proxy's summaries left
        out)."""
        path = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}.get(
            self.name, "/v1/messages"
        )
        return [
            r.json
            for r in fake.requests
            if r.path == path and not is_summary_request(r.headers, r.json)
        ]


APIS = (
    Api("chat", CHAT_MODEL, ChatLoop, FakeUpstream, None),
    Api("responses", RESPONSES_MODEL, ResponsesLoop, FakeUpstream, None),
    Api("messages", MESSAGES_MODEL, MessagesLoop, FakeAnthropic, "anthropic"),
)


# The default layers, and a policy that summarises before it clears or drops anything.
LAYER_SETS: dict[str, list[Any] | None] = {
    "default": None,
    "summarize first": [{"compress_tool_results": {}}, {"summarize": {}}, {"trim_head": {}}],
}


def config(
    api: Api, fake: Any, layers: list[Any] | None, real: RealSummarizer | None = None
) -> str:
    upstream: dict[str, Any] = {"base_url": f"{fake.origin}/v1"}
    if api.kind is not None:
        upstream["kind"] = api.kind
    data = {
        "store": {"url": "memory://"},
        "upstreams": {"fake": upstream},
        "default_upstream": "fake",
        "models": [{"match": api.model, "context_window": WINDOW}],
        "logging": {"level": "info", "format": "json"},
        "policies": {"default": {} if layers is None else {"layers": layers}},
    }
    return yaml.safe_dump(data if real is None else real.with_summaries(data))


@contextlib.contextmanager
def workspace(steps: int) -> Iterator[tuple[list[str], list[Fact]]]:
    with tempfile.TemporaryDirectory(prefix="loop-summaries-") as root:
        facts = make_workspace(Path(root), steps, 23)
        logs = sorted(Path(root, "logs").iterdir())
        yield [log.read_text() for log in logs], facts


def run(
    api: Api,
    steps: int,
    summarizer: Callable[..., str],
    layers: list[Any] | None,
    tree: Path | None,
    real: RealSummarizer | None = None,
) -> Run:
    with (
        workspace(steps) as (logs, facts),
        api.fake(windows={api.model: WINDOW}, summarizer=summarizer) as fake,
    ):
        with proxy(config(api, fake, layers, real), tree) as server:
            loop = api.loop(server.url, logs)
            try:
                for log in logs:
                    loop.step(log)
                loop.step("All logs read.")  # the last request shows what was kept
            finally:
                loop.close()
            lines = [orjson.loads(line) for line in server.log.read_text().splitlines()]
        forwarded = [
            line for line in lines if line.get("event") == "request forwarded" and line["decisions"]
        ]
        layers = [{d["layer"] for d in line["decisions"]} for line in forwarded]
        last = api.forwarded(fake)[-1]
        seen = {line.split(":")[0] for line in visible_facts(strings(last))}
        headers = [text for text in strings(last) if text.startswith(HEADINGS[:2])]
        summary = [text.split(ANCHOR_HEADING)[0] for text in headers]
        in_summary = {line.split(":")[0] for line in visible_facts(summary)}
        failed_summaries = fake.summary_calls if summarizer is failing_summary else 0
        return Run(
            rejected=fake.rejected - failed_summaries,
            compactions=len(layers),
            summarized=sum("summarize" in names for names in layers),
            trimmed=sum("trim_head" in names for names in layers),
            facts=sum(f"FACT-{fact.step:02d}" in seen for fact in facts),
            summarised=sum(f"FACT-{fact.step:02d}" in in_summary for fact in facts),
            planted=len(facts),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--before", type=Path, default=None, help="a checkout to compare with")
    add_arguments(parser)
    args = parser.parse_args()
    real = from_arguments(parser, args)
    trees: list[tuple[str, Path | None]] = [("after", None)]
    if args.before is not None:
        trees.insert(0, ("before", args.before))
    print(
        f"{args.steps} tool calls at a {WINDOW} window\n\n"
        "| layers | API | summaries | proxy | rejected | compactions | with a summary |"
        " trim_head | facts visible at the end | of them in the summary |"
        "\n|---|---|---|---|---|---|---|---|---|---|"
    )
    summarizers: list[tuple[str, Callable[..., str], RealSummarizer | None]] = [
        ("extractive", extractive_summary, None),
        ("digest only", failing_summary, None),
    ]
    if real is not None:  # the fake's own summarizer is then never asked
        summarizers.append((real.model, extractive_summary, real))
    for label, layers in LAYER_SETS.items():
        for api in APIS:
            for kind, summarizer, endpoint in summarizers:
                for name, tree in trees:
                    figures = run(api, args.steps, summarizer, layers, tree, endpoint)
                    row(label, api, kind, name, figures)


def row(label: str, api: Api, kind: str, name: str, r: Run) -> None:
    share = f"{r.trimmed} ({r.trimmed / r.compactions:.0%})" if r.compactions else "0"
    print(
        f"| {label} | {api.name} | {kind} | {name} | {r.rejected} | {r.compactions} |"
        f" {r.summarized} | {share} | {r.facts} of {r.planted} ({r.facts / r.planted:.0%}) |"
        f" {r.summarised} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
