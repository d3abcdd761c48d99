"""Conversations for tests: a chars/4 counter, hypothesis strategies, the recorded traces, and a
checker of the invariants every compacted view keeps (docs/compaction.md, "Invariants").

Reusable by any test: `conversations()` draws valid OpenAI chat histories (tools, parallel
calls, images, empty and null contents, system messages in the middle, unknown fields);
`load_traces()` reads tests/data; `view_problems(messages, view)` says what a view
breaks.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from policies import (
    Budget,
    ClearToolResultsParams,
    Message,
    Policy,
    content_text,
    current_turn,
    is_system,
    media_tokens,
    outside_chain,
    tool_pair_problems,
)
from policies.compress import PREFIX
from policies.plan import ANCHOR_HEADING, DIGEST_HEADING, SUMMARY_HEADING

TRACES = Path(__file__).resolve().parent / "data"
ANCHOR = r"ORDER-\d{4}"
TRUNCATED = "\n[TRUNCATED original~"
COMPRESSED = PREFIX
JSON_COMPRESSED = '{"compressed":"' + PREFIX
CLEARED = ClearToolResultsParams().placeholder
MEDIA_CLEARED = ClearToolResultsParams().media_placeholder


class CharCounter:
    """A real, simple counter: four characters a token, four tokens a message."""

    def text(self, text: str) -> int:
        return -(-len(text) // 4)

    def head(self, text: str, tokens: int) -> str:
        return text[: max(0, tokens) * 4]

    def message(self, message: Message) -> int:
        total = 4
        for key, value in message.items():
            if key == "content" and isinstance(value, list):
                total += sum(
                    self.text(part.get("text", "")) if part.get("type") == "text" else 0
                    for part in value
                )
                total += sum(media_tokens(part) for part in value)
            elif key == "tool_calls" and isinstance(value, list):
                total += sum(
                    3 + self.text(call["function"]["name"] + call["function"]["arguments"])
                    for call in value
                )
            elif isinstance(value, str):
                total += self.text(value)
        return total


# --- random conversations ---------------------------------------------------------------

_SENTENCE = (
    "the flight to Seattle leaves at 9 and the user asked about baggage rules while "
    "I will check the reservation details; error: not found in file src/app.py line 42 "
    "TODO refactor the parser we decided to keep tabs let's retry payment failed "
    "confirmed booking for Mia with certificate 7447 and insurance declined because "
    "invalid argument Traceback (most recent call last) done next step pending review"
)
WORDS = tuple(_SENTENCE.split())
TOOLS = ("get_user", "search_flights", "read_file", "bash", "update_booking")


def words(count: int, seed: int) -> str:
    """`count` words of plausible text, with an anchor-like order number now and then."""
    out = [WORDS[(seed + i * 7) % len(WORDS)] for i in range(count)]
    if count and seed % 3 == 0:
        out.insert(seed % len(out), f"ORDER-{seed % 10_000:04d}")
    return " ".join(out)


def png_data_url(width: int, height: int) -> str:
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", width, height)
    return "data:image/png;base64," + base64.b64encode(header + b"\0" * 32).decode()


@st.composite
def texts(draw: st.DrawFn, max_words: int = 120) -> str:
    return words(draw(st.integers(0, max_words)), draw(st.integers(0, 10_000)))


@st.composite
def user_contents(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["text", "text", "text", "empty", "parts"]))
    if kind == "text":
        return draw(texts())
    if kind == "empty":
        return ""
    parts: list[dict[str, Any]] = [{"type": "text", "text": draw(texts(40))}]
    for _ in range(draw(st.integers(1, 2))):
        media = draw(st.sampled_from(["image", "big_image", "low_image", "audio", "file"]))
        if media == "image":
            parts.append({"type": "image_url", "image_url": {"url": "https://x.test/a.png"}})
        elif media == "big_image":
            url = png_data_url(draw(st.integers(600, 4000)), draw(st.integers(600, 4000)))
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": "high"}})
        elif media == "low_image":
            url = png_data_url(2000, 2000)
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": "low"}})
        elif media == "audio":
            data = base64.b64encode(b"\0" * draw(st.integers(100, 40_000))).decode()
            parts.append({"type": "input_audio", "input_audio": {"data": data, "format": "mp3"}})
        else:
            data = base64.b64encode(b"%PDF" + b"\0" * draw(st.integers(100, 40_000))).decode()
            uri = f"data:application/pdf;base64,{data}"
            parts.append({"type": "file", "file": {"filename": "a.pdf", "file_data": uri}})
    return parts


EXTRA_FIELDS = st.sampled_from(
    [{}, {}, {"name": "mia"}, {"x_client_meta": {"trace": 1}}, {"refusal": None, "annotations": []}]
)


class _Ids:
    def __init__(self) -> None:
        self.next = 0

    def __call__(self) -> str:
        self.next += 1
        return f"call_{self.next}"


@st.composite
def tool_block(draw: st.DrawFn, ids: Callable[[], str]) -> list[Message]:
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        size = draw(st.sampled_from([2, 10, 40, 900]))
        arguments = {
            "query": words(size, draw(st.integers(0, 999))),
            "limit": draw(st.integers(1, 9)),
        }
        calls.append(
            {
                "id": ids(),
                "type": "function",
                "function": {
                    "name": draw(st.sampled_from(TOOLS)),
                    "arguments": json.dumps(arguments),
                },
            }
        )
    content = draw(st.sampled_from([None, "", "Let me look that up."]))
    block: list[Message] = [
        {"role": "assistant", "content": content, "tool_calls": calls, **draw(EXTRA_FIELDS)}
    ]
    answers = draw(st.permutations(calls))
    for call in answers:
        text = words(draw(st.sampled_from([0, 5, 60, 300, 1500])), draw(st.integers(0, 999)))
        result: Any = [{"type": "text", "text": text}] if draw(st.booleans()) else text
        extra = {"name": call["function"]["name"]} if draw(st.booleans()) else {}
        block.append({"role": "tool", "tool_call_id": call["id"], "content": result, **extra})
    return block


@st.composite
def conversations(draw: st.DrawFn, max_rounds: int = 8) -> list[Message]:
    """A valid chat request: it ends with a user message or with tool results."""
    ids = _Ids()
    messages: list[Message] = [
        {"role": draw(st.sampled_from(["system", "developer"])), "content": draw(texts(80))}
        for _ in range(draw(st.integers(0, 2)))
    ]
    count = draw(st.integers(1, max_rounds))
    agent_loop = draw(st.booleans())
    for round_number in range(count):
        last = round_number == count - 1
        if round_number or draw(st.integers(0, 9)):  # now and then no user message first
            messages.append(
                {"role": "user", "content": draw(user_contents()), **draw(EXTRA_FIELDS)}
            )
        # An agent loop ends with tool results, a chat with the user's message.
        steps = draw(st.integers(int(last), 4)) if agent_loop or not last else 0
        for step in range(steps):
            if (last and step == steps - 1) or draw(st.booleans()):
                messages += draw(tool_block(ids))
            else:
                text = draw(st.one_of(texts(), st.just("")))
                messages.append({"role": "assistant", "content": text, **draw(EXTRA_FIELDS)})
        if not last and draw(st.integers(0, 5)) == 0:
            messages.append({"role": "system", "content": draw(texts(20))})
    return messages


# --- recorded traces --------------------------------------------------------------------


def load_traces() -> list[tuple[str, list[Message]]]:
    """(id, messages) of every recorded conversation in tests/data."""
    found = []
    for path in (TRACES / "swe_agent.jsonl", TRACES / "tau_airline_gpt4o.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            found.append((f"{path.stem}/{record['id']}", record["messages"]))
    return found


# --- the invariants of a view -----------------------------------------------------------


def unmarked(value: Any) -> Any:
    """`value` without its cache_control keys, at any depth (the proxy moves and adds
    breakpoints, by design)."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def is_header(message: Message) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(
        (SUMMARY_HEADING, DIGEST_HEADING, ANCHOR_HEADING)
    )


def view_problems(messages: Sequence[Message], view: Sequence[Message]) -> list[str]:
    """Which invariants `view` breaks as a compaction of `messages` (empty when none):
    system messages verbatim and in place, the current turn unchanged, tool pairs whole,
    order kept, nothing invented but one header, placeholders and truncation markers."""
    problems = [f"tool pairing: {p}" for p in tool_pair_problems(view)]
    headers = [i for i, m in enumerate(view) if is_header(m)]
    if len(headers) > 1:
        problems.append(f"{len(headers)} header messages")
    # Before the header: system messages and the clients' context, and the task of an agent
    # loop whose rounds the summary stands for (a user message kept verbatim).
    if headers and len([m for m in view[: headers[0]] if not outside_chain(m)]) > 1:
        problems.append("more than a task between the system messages and the header")
    if headers and not all(outside_chain(m) or m.get("role") == "user" for m in view[: headers[0]]):
        problems.append("the header is not right after the system messages (and the task)")
    # Matched from the end: identical messages (two empty user messages) then pair up with
    # the newest originals, which is where the current turn is.
    origin, exact = len(messages), set()
    for message in reversed([m for m in view if not is_header(m)]):
        origin -= 1
        while origin >= 0 and not _from(messages[origin], message):
            if is_system(messages[origin]) and not _repeated_later(messages, origin):
                problems.append(f"system message {origin} missing or moved")
            origin -= 1
        if origin < 0:
            problems.append(f"invented or out of order: {message.get('role')} message")
            break
        if message == messages[origin]:
            exact.add(origin)
    if not _systems_kept([m for m in view if is_system(m) and not is_header(m)], messages):
        problems.append("system messages changed")
    changed = [i for i in current_turn(messages) if i not in exact]
    if changed:
        problems.append(f"current turn changed at {changed}")
    return problems


def _repeated_later(messages: Sequence[Message], index: int) -> bool:
    """Whether system message `index` comes again, word for word, later in `messages`: a copy
    a view may leave out where a compaction displaced it."""
    return any(_same_text(m, messages[index]) for m in messages[index + 1 :] if is_system(m))


def _systems_kept(shown: Sequence[Message], messages: Sequence[Message]) -> bool:
    """Whether the view's system messages are the request's, in order, verbatim, but for
    copies of ones that come again later."""
    systems = [m for m in messages if is_system(m)]
    at = len(shown)  # matched from the end: the newest copy is the one a view keeps
    for index in reversed(range(len(systems))):
        if at > 0 and shown[at - 1] == systems[index]:
            at -= 1
        elif not any(_same_text(later, systems[index]) for later in systems[index + 1 :]):
            return False
    return at == 0


def _same_text(one: Message, other: Message) -> bool:
    """Whether two messages say the same (a string or text blocks of it)."""
    return content_text(one.get("content")) == content_text(other.get("content"))


def _from(original: Message, message: Message) -> bool:
    """Whether `message` is `original` or an allowed edit of it."""
    if message == original:
        return True
    if is_system(original) or original.get("role") != message.get("role"):
        return False
    rest = ("content", "tool_calls")
    if {k: v for k, v in message.items() if k not in rest} != {
        k: v for k, v in original.items() if k not in rest
    }:
        return False
    if "tool_calls" not in message and "tool_calls" in original:
        return message.get("content") == original.get("content") and bool(
            content_text(message.get("content")).strip()
        )
    calls, old_calls = message.get("tool_calls"), original.get("tool_calls")
    if calls != old_calls and not (
        isinstance(calls, list)
        and isinstance(old_calls, list)
        and len(calls) == len(old_calls)
        and all(_call_from(old, new) for old, new in zip(old_calls, calls, strict=True))
    ):
        return False
    return _content_from(original, message.get("content"))


def _call_from(old: dict[str, Any], new: dict[str, Any]) -> bool:
    if new == old:
        return True
    same = {k: v for k, v in new.items() if k != "function"} == {
        k: v for k, v in old.items() if k != "function"
    }
    return same and _truncation_of(old["function"]["arguments"], new["function"]["arguments"])


def _content_from(original: Message, content: Any) -> bool:
    old = original.get("content")
    if content == old:
        return True
    tool = original.get("role") == "tool"
    if tool and isinstance(content, str) and _cleared(content_text(old), content):
        return True
    if isinstance(content, str) and _truncation_of(content_text(old), content):
        return True
    if tool and isinstance(content, str) and _compression_of(content_text(old), content):
        return True
    if isinstance(content, list) and isinstance(old, list) and len(content) == len(old):
        return all(
            new == part
            or (
                new == {"type": "text", "text": MEDIA_CLEARED}
                and part.get("type") in ("image_url", "file")
            )
            or (
                tool
                and new.get("type") == part.get("type") == "text"
                and _compression_of(part["text"], new["text"])
            )
            for new, part in zip(content, old, strict=True)
        )
    return False


def _cleared(original: str, text: str) -> bool:
    """The placeholder, then salient lines of the original (verbatim pieces of it, or records
    of a JSON original)."""
    placeholder, *kept = text.split("\n")
    return placeholder == CLEARED and all(
        line in original or original.lstrip().startswith(("[", "{")) for line in kept
    )


def _compression_of(original: str, text: str) -> bool:
    return text.startswith((COMPRESSED, JSON_COMPRESSED)) and len(text) < len(original)


def _truncation_of(original: str, text: str) -> bool:
    head, marker, _ = text.partition(TRUNCATED)
    return bool(marker) and original.startswith(head) and len(head) < len(original)


def budget_for(window: int, target: float = 0.45, reserved: int = 1024) -> Budget:
    """A budget as the proxy's defaults make it, at a small window."""
    policy = Policy(
        reserved_output_tokens=reserved,
        safety_margin_tokens=64,
        prepare_at=0.6,
        compact_at=0.85,
        target=target,
    )
    return policy.budget(window, None, None)
