"""A Codex-CLI-like client of the Responses API for the tests, on the real openai SDK.

Like Codex it sends stateless requests (`store: false`, the whole history in `input` every
turn, `instructions`, a `shell` function tool, `include: ["reasoning.encrypted_content"]`,
`prompt_cache_key` and a `session_id` header), streams the answer, and echoes every output item
back in the next request without its `id` and `status`, reasoning items with their encrypted
content.

    with codex_servers(anchors=[ANCHOR]) as (up, server):
        agent = Codex(server.url, up)
        turn = agent.send(tool_choice="required")

`SocketCodex` holds the same session over a WebSocket, as Codex's built-in provider does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import openai

from tests.conftest import config_for
from tests.fakes.base import RecordedRequest
from tests.fakes.openai import FakeUpstream, digest, is_summary_request
from tests.servers import ServerThread, proxy_server

MODEL = "gpt-5-16k"  # a reasoning model, counted exactly (o200k_base) by both sides
WINDOW = 16384
RESPONSES = "/v1/responses"
INSTRUCTIONS = "You are Codex, a coding agent running in a terminal. " * 20
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
REASONING_HEADROOM = 2048  # what the proxy adds to a reasoning model's summary cap

Item = dict[str, Any]


def short_summary(body: dict[str, Any]) -> str:
    """The fake summarizer: deterministic, within the summary cap, and it keeps no anchor."""
    text = "\n".join(str(item.get("content")) for item in body.get("input") or [])
    cap = body["max_output_tokens"] - REASONING_HEADROOM
    return " ".join(f"The agent ran the tests, summary {digest(text)}.".split()[: cap // 3])


@contextlib.contextmanager
def codex_servers(
    *, summarizer: Any = short_summary, local: bool = False, **policy: Any
) -> Iterator[tuple[FakeUpstream, ServerThread]]:
    """The strict fake upstream (MODEL at WINDOW) and the proxy in front of it, with `policy`
    merged into the default policy; `local`: an upstream without provider compaction."""
    with FakeUpstream(
        windows={MODEL: WINDOW}, summarizer=summarizer, provider_compaction=not local
    ) as up:
        models = [{"match": MODEL, "context_window": WINDOW}]
        config = config_for(
            up, models=models, policies={"default": policy}, admin={"token": "admin-token"}
        )
        with proxy_server(config) as server:
            yield up, server


@dataclasses.dataclass(frozen=True)
class Turn:
    """One request: what the client got, and the requests the upstream received for it."""

    status: int
    headers: Mapping[str, str]
    output: list[Item]  # the response's output items as received
    forwarded: list[Item]  # bodies of the Responses requests forwarded (no summaries)

    @property
    def action(self) -> str:
        return self.headers["x-compaction-action"]

    @property
    def sent(self) -> list[Item]:
        """The input the upstream answered."""
        return self.forwarded[-1]["input"]


class Codex:
    """One Codex session: its history grows by each answer's items and the tools' outputs.

    With `stateless=False` it behaves as the OpenAI Agents SDK does by default instead: `store`
    unset (true), reasoning items without encrypted content (the upstream has them by id),
    and output items echoed back whole, ids included.
    """

    def __init__(
        self, url: str, up: FakeUpstream, *, model: str = MODEL, stateless: bool = True
    ) -> None:
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        self.up = up
        self.model = model
        self.stateless = stateless
        self.session = f"codex-{uuid.uuid4().hex}"
        self.input: list[Item] = []

    def __enter__(self) -> Codex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def send(self, **extra: Any) -> Turn:
        """The whole history, streamed; the answer's items are added to the history."""
        seen = len(self.up.requests)
        if self.stateless:
            extra |= {"store": False, "include": ["reasoning.encrypted_content"]}
        raw = self.client.responses.with_raw_response.create(
            model=self.model,
            instructions=INSTRUCTIONS,
            input=self.input,
            tools=[SHELL],
            stream=True,
            prompt_cache_key=self.session,
            extra_headers={"session_id": self.session},
            **extra,
        )
        final: Any = None
        for event in raw.parse():
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        output = [item.model_dump(mode="json", exclude_unset=True) for item in final.output]
        self.input += [echoed(item) for item in output] if self.stateless else output
        return Turn(raw.http_response.status_code, raw.headers, output, self.forwarded(seen))

    def forwarded(self, seen: int) -> list[Item]:
        """The bodies of the Responses requests forwarded since the upstream had `seen`."""
        return [
            r.json
            for r in self.up.requests[seen:]
            if r.path == RESPONSES and not is_summary_request(r.headers, r.json)
        ]

    def said(self, text: str) -> None:
        self.input.append({"role": "user", "content": [{"type": "input_text", "text": text}]})

    def answer(self, output: str) -> None:
        """The output of the last call, as the tool's result."""
        call = next(i for i in reversed(self.input) if i["type"] == "function_call")
        self.input.append(
            {"type": "function_call_output", "call_id": call["call_id"], "output": output}
        )


class SocketCodex(Codex):
    """The same session over a WebSocket, as Codex's built-in provider holds it: one
    connection, whose first request is a warm-up (`generate: false`, no input) and each next
    one continues the last response (`previous_response_id`) with the items added since. Its
    turns have no headers: a WebSocket answer has none."""

    def __init__(self, url: str, up: FakeUpstream, *, model: str = MODEL) -> None:
        super().__init__(url, up, model=model)
        beta = {"OpenAI-Beta": "responses_websockets=2026-02-06"}
        self.connection = self.client.responses.connect(extra_headers=beta, max_retries=0).enter()
        self.previous: str | None = None  # the last response
        self.known = 0  # the items of `input` its history holds

    def __exit__(self, *exc: object) -> None:
        self.connection.close()
        super().__exit__()

    def send(self, **extra: Any) -> Turn:
        """The items added since the last response, continuing it; the answer's items are
        added to the history whole, as Codex keeps them."""
        seen = len(self.up.requests)
        if self.previous is not None:
            extra["previous_response_id"] = self.previous
        self.connection.response.create(
            model=self.model,
            instructions=INSTRUCTIONS,
            input=self.input[self.known :],
            tools=[SHELL],
            store=False,
            include=["reasoning.encrypted_content"],
            prompt_cache_key=self.session,
            **extra,
        )
        for event in self.connection:
            if event.type == "error":
                return Turn(event.status, {}, [], self.forwarded(seen))
            if event.type in ("response.completed", "response.incomplete"):
                break
        final: Any = event.response
        output = [item.model_dump(mode="json", exclude_unset=True) for item in final.output]
        self.input += output
        self.previous, self.known = final.id, len(self.input)
        return Turn(200, {}, output, self.forwarded(seen))


def echoed(item: Item) -> Item:
    """An output item as Codex sends it back: without its id and status."""
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def summary_requests(up: FakeUpstream) -> list[RecordedRequest]:
    """The summary requests the upstream received (the proxy's own, marked by their header)."""
    return [r for r in up.requests if r.path == RESPONSES and is_summary_request(r.headers, r.json)]
