"""The scripted model that drives the real agent clients in bench/agent_clients.py, and the
workspace it makes them read.

The workspace holds `logs/step-NN.log`, a few KB each, with one fact (`FACT-07: the build cache
key is 9f3a1c2e.`) in the middle and a step marker (`== agents-e2e step 07 of 30 ==`) on its
first and last lines. The model reads the newest turn of each request it is sent: the task
(marker `AGENTS-E2E-TASK`) starts step 1; a tool output with the marker of step n asks for
step n + 1, a call of the client's shell tool (`cat logs/step-NN.log`), until the last step,
answered by a final text (marker `AGENTS-E2E-DONE`) that lists the facts the request still
shows. It keeps no state: what it answers depends on the request alone, as a model's does, so
a compacted history changes what it can recall but not where it is (the newest tool output is
never compacted away).

Claude Code can be asked for one sub-agent (its `Agent` tool, at step `subagent_at`): the
sub-agent's conversation (marker `AGENTS-E2E-SUBTASK`) reads that step's log and reports its
fact with the step marker, so that the parent goes on from there. Compaction requests of the
clients themselves (Claude Code's "create a detailed summary" prompt) are answered with a
summary that keeps the task, the facts and the progress, as a good model would; so are the
proxy's own summary requests (`extractive_summary`, the fakes' summarizer hook).
"""

from __future__ import annotations

import dataclasses
import random
import re
import string
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.fakes.base import Scripted

TASK_MARKER = "AGENTS-E2E-TASK"
SUBTASK_MARKER = "AGENTS-E2E-SUBTASK"
DONE_MARKER = "AGENTS-E2E-DONE"
INSTRUCTIONS_MARKER = "AGENTS-E2E-INSTRUCTIONS"  # in AGENTS.md and CLAUDE.md
# The clients' own compaction prompts: Claude Code 2.1.332's, from its binary's strings, and
# Codex's local compaction (codex-rs/core/templates/compact/prompt.md).
CLIENT_SUMMARY_PROMPTS = (
    "Your task is to create a detailed summary",
    "You are performing a CONTEXT CHECKPOINT COMPACTION",
)
LOG_LINES = 48  # about 3.3 KB a log, ~1,000 tokens
_STEP = re.compile(r"== agents-e2e step (\d+) of (\d+) ==")
_SUBTASK_STEP = re.compile(SUBTASK_MARKER + r" step (\d+)")
_FACT = re.compile(r"FACT-\d+: [^\n]*?\.(?=\s|$)")
_FACT_FORMS = (
    "the build cache key is {v}.",
    "the failing test's random seed is {v}.",
    "the release branch is named rel-{v}.",
    "the staging token lives under vault path kv/{v}.",
    "the migration to revert is {v}.",
    "the flaky host is node-{v}.",
)
_MODULES = ("parser", "lexer", "cache", "http", "store", "auth", "queue", "render", "index")
_SHELL_TOOLS = ("exec_command", "shell_command", "shell", "Bash")  # Codex's, Claude Code's


@dataclasses.dataclass(frozen=True)
class Fact:
    step: int
    value: str  # unique in the workspace: the fact is visible where this is
    line: str  # the whole line, as the log has it


def step_marker(step: int, steps: int) -> str:
    return f"== agents-e2e step {step:02d} of {steps} =="


def task(steps: int) -> str:
    """The prompt the client is started with."""
    return (
        f"{TASK_MARKER}: read the build logs logs/step-01.log to logs/step-{steps:02d}.log with"
        " the shell, one file per command, in order. Each holds one line starting with FACT:"
        " keep every one of them, and when all are read, answer with all the facts."
    )


def make_workspace(root: Path, steps: int, seed: int) -> list[Fact]:
    """The logs, AGENTS.md and CLAUDE.md under `root`; the facts planted in the logs."""
    rng = random.Random(seed)
    (root / "logs").mkdir(parents=True)
    instructions = (
        f"# Project instructions ({INSTRUCTIONS_MARKER})\n\nRead files with plain `cat`; never"
        " edit the logs.\n"
    )
    for name in ("AGENTS.md", "CLAUDE.md"):
        (root / name).write_text(instructions)
    facts = []
    used: set[str] = set()
    for step in range(1, steps + 1):
        value = _code(rng, used)
        line = f"FACT-{step:02d}: " + _FACT_FORMS[step % len(_FACT_FORMS)].format(v=value)
        facts.append(Fact(step, value, line))
        lines = [_log_line(rng, step, n) for n in range(LOG_LINES)]
        lines.insert(LOG_LINES // 2, line)
        marker = step_marker(step, steps)
        (root / "logs" / f"step-{step:02d}.log").write_text("\n".join([marker, *lines, marker]))
    return facts


def _code(rng: random.Random, used: set[str]) -> str:
    """Eight hex digits, some a letter: no log line has such a word."""
    while True:
        value = "".join(rng.choices("0123456789abcdef", k=8))
        if value not in used and any(c.isalpha() for c in value):
            used.add(value)
            return value


def _log_line(rng: random.Random, step: int, number: int) -> str:
    module = rng.choice(_MODULES)
    took = rng.randint(3, 900)
    word = "".join(rng.choices(string.ascii_uppercase, k=5))
    cache = rng.choice(["hit", "miss"])
    return (
        f"[build {step:02d}.{number:03d}] compiling module {module}/{word} in {took} ms:"
        f" {rng.randint(1, 60)} files, {rng.randint(0, 9)} warnings, cache {cache}"
    )


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys left out."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)


def visible_facts(texts: Iterable[str]) -> list[str]:
    """The fact lines in these texts, each once, in the order of their numbers."""
    found = {m.group(0) for text in texts for m in _FACT.finditer(text)}
    return sorted(found, key=lambda line: int(line[5 : line.index(":")]))


def extractive_summary(body: dict[str, Any]) -> str:
    """The proxy's summary requests answered as a model that keeps every fact would: the fact
    lines of what it was given (the fakes' summarizer hook)."""
    facts = visible_facts(strings(body.get("messages") or body.get("input")))
    return "Work so far: the agent read build logs.\n" + "\n".join(facts)


@dataclasses.dataclass(frozen=True)
class Turn:
    """What the model reads of a request: its newest turn, the whole of it, its tools."""

    newest: str  # what came since the model's last output (tool outputs, user turns)
    whole: str
    tools: frozenset[str]


def responses_turn(body: Mapping[str, Any]) -> Turn:
    """A Responses request as the model reads it."""
    items = body.get("input")
    items = items if isinstance(items, list) else [items]
    last = max(
        (n for n, item in enumerate(items) if isinstance(item, dict) and _is_output(item)),
        default=-1,
    )
    tools = frozenset(str(t.get("name")) for t in body.get("tools") or [])
    everything = [body.get("instructions"), items]
    return Turn(" ".join(strings(items[last + 1 :])), " ".join(strings(everything)), tools)


def _is_output(item: Mapping[str, Any]) -> bool:
    """An item the model produced."""
    kind = item.get("type", "message")
    return kind in ("reasoning", "function_call", "custom_tool_call") or (
        kind == "message" and item.get("role") == "assistant"
    )


def messages_turn(body: Mapping[str, Any]) -> Turn:
    """A Messages (or chat completions) request as the model reads it."""
    messages = body.get("messages") or []
    last = max((n for n, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    # Anthropic's tools, or chat completions' functions: a chat body reads as Messages does.
    tools = frozenset(
        str(t.get("name") or t.get("function", {}).get("name")) for t in body.get("tools") or []
    )
    everything = [body.get("system"), messages]
    return Turn(" ".join(strings(messages[last + 1 :])), " ".join(strings(everything)), tools)


@dataclasses.dataclass(frozen=True)
class AgentModel:
    """The scripted model; `responses` and `messages` are the fakes' scripts."""

    steps: int
    subagent_at: int | None = None  # the step a Claude Code sub-agent reads

    def responses(self, headers: Mapping[str, str], body: dict[str, Any]) -> Scripted:
        return self.answer(responses_turn(body))

    def messages(self, headers: Mapping[str, str], body: dict[str, Any]) -> Scripted:
        return self.answer(messages_turn(body))

    def answer(self, turn: Turn) -> Scripted:
        if any(prompt in turn.newest for prompt in CLIENT_SUMMARY_PROMPTS):
            return Scripted(text=self._client_summary(turn))
        shell = next((name for name in _SHELL_TOOLS if name in turn.tools), None)
        reached = [int(m.group(1)) for m in _STEP.finditer(turn.newest)]
        if SUBTASK_MARKER in turn.whole and TASK_MARKER not in turn.whole:
            return self._subagent(turn, shell, reached)
        if shell is None or TASK_MARKER not in turn.whole:
            return Scripted(text="OK.")  # a request of the client's own (a title, a check)
        if not reached and TASK_MARKER not in turn.newest:
            return Scripted(text="OK.")
        step = max(reached, default=0) + 1
        if step > self.steps:
            facts = visible_facts([turn.whole])
            return Scripted(text=f"{DONE_MARKER}: all {self.steps} logs read. " + " ".join(facts))
        if step == self.subagent_at and "Agent" in turn.tools:
            arguments = {
                "description": f"Read build log {step}",
                "prompt": f"{SUBTASK_MARKER} step {step}: read logs/step-{step:02d}.log and"
                " report its FACT line.",
                "subagent_type": "general-purpose",
                "run_in_background": False,
            }
            return Scripted(tool="Agent", arguments=arguments)
        return Scripted(tool=shell, arguments=_shell_arguments(shell, step))

    def _subagent(self, turn: Turn, shell: str | None, reached: list[int]) -> Scripted:
        """A sub-agent: read the one log it was given, then report its fact and step."""
        if reached:
            step = max(reached)
            facts = " ".join(visible_facts([turn.newest]))
            return Scripted(text=f"{SUBTASK_MARKER} done: {facts}\n{step_marker(step, self.steps)}")
        asked = _SUBTASK_STEP.search(turn.whole)
        if shell is None or asked is None:
            return Scripted(text="OK.")
        return Scripted(tool=shell, arguments=_shell_arguments(shell, int(asked.group(1))))

    def _client_summary(self, turn: Turn) -> str:
        reached = [int(m.group(1)) for m in _STEP.finditer(turn.whole)]
        progress = step_marker(max(reached), self.steps) if reached else "no log read yet"
        facts = "\n".join(visible_facts([turn.whole]))
        return (
            "<analysis>The user asked for the facts of the build logs.</analysis>\n<summary>\n"
            f"1. Primary request: {task(self.steps)}\n2. Facts found so far:\n{facts}\n"
            f"3. Progress: {progress}\n</summary>"
        )


def _shell_arguments(shell: str, step: int) -> Any:
    command = f"cat logs/step-{step:02d}.log"
    if shell == "exec_command":
        return {"cmd": command}
    if shell == "shell":
        return {"command": ["bash", "-lc", command]}
    if shell == "Bash":
        return {"command": command, "description": f"Show build log {step}"}
    return {"command": command}  # shell_command
