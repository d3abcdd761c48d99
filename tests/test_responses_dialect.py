"""The Responses dialect's mapping of input items to the engine's messages and back: examples of
each kind of item and edit, and properties over random item lists compacted by the real engine."""

from __future__ import annotations

import asyncio
import copy
import json
import operator
from collections.abc import Sequence
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import policies
from policies import (
    DEFAULT_LAYERS,
    ClearToolResultsParams,
    DropToolBlocksParams,
    LayerSpec,
    Plan,
    Policy,
    TruncateToolFieldsParams,
    media_tokens,
    render_entries,
)
from policies.conversation import current_turn, is_system
from policies.plan import ANCHOR_HEADING, DIGEST_HEADING, SUMMARY_HEADING
from proxy.dialects.base import Parsed
from proxy.dialects.openai.responses import Responses
from proxy.dialects.openai.responses_items import CALLS, OPAQUE_ITEM_TOKENS, OUTPUTS, item_type
from proxy.errors import InvalidRequest, SummaryFailed
from proxy.memo import content_keys
from proxy.models.tokens import counter_for
from tests.conftest import examples
from tests.conversations import words
from tests.fakes.openai import validate_responses
from tests.fakes.openai.responses_input import check_pairs
from tests.test_raw_items import written

DIALECT = Responses()
COUNTER = counter_for("gpt-4o")
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA"
    "hKmMIQAAAABJRU5ErkJggg=="
)
ENCRYPTED = "gAAAAA" + "x" * 600  # encrypted content: long, unreadable

Item = dict[str, Any]


def parse(items: list[Item] | str, **body: Any) -> Parsed:
    return DIALECT.parse(orjson.dumps({"model": "gpt-4o", "input": items, **body}))


def rendered(parsed: Parsed, entries: Sequence[tuple[int | None, policies.Message]]) -> Any:
    return orjson.loads(DIALECT.render(parsed, entries))


def reasoning(n: int) -> Item:
    return {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": f"thinking {n}"}],
        "encrypted_content": ENCRYPTED,
    }


def call(n: int, arguments: str = '{"cmd": "ls"}') -> Item:
    return {
        "type": "function_call",
        "call_id": f"call_{n}",
        "name": "shell",
        "arguments": arguments,
    }


def answer(n: int, output: Any = "ok") -> Item:
    return {"type": "function_call_output", "call_id": f"call_{n}", "output": output}


def user(text: str) -> Item:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> Item:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


CODEX = [
    {"type": "message", "role": "developer", "content": "<permissions>"},
    user("fix the tests"),
    reasoning(1),
    call(1),
    answer(1, "a.py b.py"),
    reasoning(2),
    assistant("Running them."),
    call(2, '{"cmd": "pytest"}'),
    {"type": "custom_tool_call", "call_id": "call_3", "name": "apply_patch", "input": "*** Begin"},
    answer(2, "2 failed"),
    {"type": "custom_tool_call_output", "call_id": "call_3", "output": "patched"},
    {"type": "compaction_trigger"},
]


def test_a_string_input_is_one_user_message() -> None:
    parsed = parse("hello", instructions="Be brief.")
    assert parsed.messages == [{"role": "user", "content": "hello"}]
    assert parsed.native(0) == [{"role": "user", "content": "hello"}]


def test_codex_items_map_to_messages_and_tool_blocks() -> None:
    parsed = parse(CODEX)
    roles = [m["role"] for m in parsed.messages]
    assert roles == ["developer", "user", "assistant", "tool", "assistant", "tool", "tool"]
    first, second = parsed.messages[2], parsed.messages[4]
    assert [c["id"] for c in first["tool_calls"]] == ["call_1"]
    assert first["content"][0] == {"type": "opaque", "tokens": OPAQUE_ITEM_TOKENS}
    assert policies.content_text(second["content"]) == "Running them."
    assert [c["function"]["arguments"] for c in second["tool_calls"]] == [
        '{"cmd": "pytest"}',
        "*** Begin",
    ]
    # A reasoning item travels with the calls after it; the trigger stays with the last turn.
    assert [item_type(i) for i in parsed.native(4)] == [
        "reasoning",
        "message",
        "function_call",
        "custom_tool_call",
    ]
    assert item_type(parsed.native(6)[-1]) == "compaction_trigger"
    assert policies.tool_pair_problems(parsed.messages) == []


def test_encrypted_content_costs_the_constant_not_its_length() -> None:
    plain = parse([user("hi"), {**reasoning(1), "encrypted_content": "gAAAAA"}, assistant("yo")])
    long = parse([user("hi"), reasoning(1), assistant("yo")])
    assert COUNTER.message(plain.messages[1]) == COUNTER.message(long.messages[1])
    assert media_tokens({"type": "opaque", "tokens": 17}) == 17


def test_without_a_plan_the_items_go_out_unchanged() -> None:
    parsed = parse(CODEX, instructions="Be brief.", tools=[{"type": "function", "name": "x"}])
    body = rendered(parsed, render_entries(parsed.messages, Plan()))
    assert body["input"] == CODEX
    assert body["instructions"] == "Be brief." and body["tools"] == [
        {"type": "function", "name": "x"}
    ]


def edit(parsed: Parsed, index: int, message: policies.Message | None) -> Any:
    """The input rendered with canonical message `index` replaced (None drops it)."""
    entries = [(i, m) for i, m in enumerate(parsed.messages) if i != index]
    if message is not None:
        entries.insert(index, (index, message))
    return rendered(parsed, entries)["input"]


def test_clearing_an_output_replaces_only_its_output_text() -> None:
    items = [user("go"), call(1), {**answer(1, "long result"), "id": "fco_1", "extra": [1]}]
    parsed = parse([*items, user("next")])
    tool = parsed.messages[2]
    out = edit(parsed, 2, {**tool, "content": "[cleared]"})
    assert out[2] == {**items[2], "output": "[cleared]"}
    assert out[:2] == items[:2]


def test_clearing_media_in_output_parts_keeps_the_other_parts_as_received() -> None:
    parts = [
        {"type": "input_text", "text": "screen:"},
        {"type": "input_image", "image_url": PNG, "detail": "high"},
    ]
    parsed = parse([user("go"), call(1), answer(1, parts), user("next")])
    tool = parsed.messages[2]
    cleared = [tool["content"][0], {"type": "text", "text": "[image cleared]"}]
    out = edit(parsed, 2, {**tool, "content": cleared})
    assert out[2]["output"] == [parts[0], {"type": "input_text", "text": "[image cleared]"}]


def test_truncating_arguments_writes_back_only_the_arguments_or_input() -> None:
    custom = {"type": "custom_tool_call", "call_id": "call_2", "name": "patch", "input": "x" * 50}
    items = [user("go"), reasoning(1), {**call(1, "y" * 50), "id": "fc_1"}, custom]
    answers = [answer(1), {"type": "custom_tool_call_output", "call_id": "call_2", "output": "ok"}]
    parsed = parse([*items, *answers, user("next")])
    group = parsed.messages[1]
    calls = [
        {**c, "function": {**c["function"], "arguments": "short"}} for c in group["tool_calls"]
    ]
    out = edit(parsed, 1, {**group, "tool_calls": calls})
    assert out[1] == items[1]  # the reasoning item is untouched
    assert out[2] == {**items[2], "arguments": "short"}
    assert out[3] == {**custom, "input": "short"}


def test_dropping_a_block_drops_its_reasoning_item_with_it() -> None:
    parsed = parse([user("go"), reasoning(1), call(1), answer(1), user("next")])
    entries = [(i, m) for i, m in enumerate(parsed.messages) if i in (0, 3)]
    assert rendered(parsed, entries)["input"] == [user("go"), user("next")]
    # Without text, the calls' message goes whole: the reasoning item too.
    group = parsed.messages[1]
    out = edit(parsed, 1, {k: v for k, v in group.items() if k != "tool_calls"})
    assert [item_type(i) for i in out] == ["message", "function_call_output", "message"]


def test_text_kept_beside_dropped_calls_keeps_its_reasoning_item() -> None:
    items = [user("go"), reasoning(1), assistant("Let me look."), call(1), answer(1)]
    parsed = parse([*items, user("next")])
    group = parsed.messages[1]
    text_only = {k: v for k, v in group.items() if k != "tool_calls"}
    out = edit(parsed, 1, text_only)
    assert out[1:3] == items[1:3]
    assert all(item_type(i) != "function_call" for i in out)


def test_a_screenshot_is_never_edited_in_place_and_its_cost_stays_counted() -> None:
    shot = {"type": "computer_screenshot", "image_url": PNG}
    items = [
        user("click it"),
        {"type": "computer_call", "id": "cu_1", "call_id": "c1", "action": {"type": "click"}},
        {"type": "computer_call_output", "call_id": "c1", "output": shot},
        user("next"),
    ]
    parsed = parse(items)
    group, tool = parsed.messages[1], parsed.messages[2]
    assert tool["content"] == "[computer_call_output]"
    assert {
        "type": "opaque",
        "tokens": media_tokens({"type": "image_url", "image_url": {"url": PNG}}),
    } in group["content"]
    # Clearing it would save nothing, and would not be written back.
    assert COUNTER.message({**tool, "content": "[Old tool result content cleared]"}) >= (
        COUNTER.message(tool)
    )
    assert edit(parsed, 2, {**tool, "content": "x"}) == items


def test_a_summary_is_one_message_item_in_the_roles_form() -> None:
    parsed = parse([user("a"), assistant("b"), user("c")])
    for role, part in (("user", "input_text"), ("assistant", "output_text")):
        header = {"role": role, "content": f"{SUMMARY_HEADING}\nS"}
        (item,) = DIALECT.summary_items(header)
        assert item == {
            "type": "message",
            "role": role,
            "content": [{"type": part, "text": header["content"]}],
        }
    out = rendered(parsed, [(None, {"role": "user", "content": "S"}), (2, parsed.messages[2])])
    assert out["input"][1] == user("c")


def test_unknown_items_stay_with_the_message_before_them() -> None:
    odd = {"type": "program", "code": "print(1)"}
    first = {"type": "tool_search_output", "tools": []}
    parsed = parse([first, user("go"), call(1), odd, answer(1), user("next")])
    assert parsed.native(0) == [first, user("go")]
    assert parsed.native(1) == [call(1), odd]
    # An output whose call is not just before stays with what precedes it.
    stray = parse([user("go"), {"type": "function_call_output", "call_id": "zz", "output": "x"}])
    assert [m["role"] for m in stray.messages] == ["user"]


def test_an_item_reference_and_a_compaction_item_are_opaque_and_pinned() -> None:
    compaction = {"type": "compaction", "encrypted_content": ENCRYPTED}
    parsed = parse([user("a"), compaction, {"type": "item_reference", "id": "msg_1"}, user("b")])
    assert [m["role"] for m in parsed.messages] == ["user", "system", "assistant", "user"]
    assert parsed.messages[1]["content"] == [{"type": "opaque", "tokens": OPAQUE_ITEM_TOKENS}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 3}, "input"),
        ({"input": [1]}, "input[0]"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        ({"input": "x", "instructions": ["a"]}, "instructions"),
        ({"input": "x", "max_output_tokens": "9"}, "max_output_tokens"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        DIALECT.parse(orjson.dumps({"model": "gpt-4o", **body}))
    assert caught.value.param == param


def test_history_held_upstream_is_opaque() -> None:
    assert parse("hi", previous_response_id="resp_1").opaque_reason == "previous_response_id"
    assert parse("hi", conversation="conv_1").opaque_reason == "conversation"
    assert parse("hi").opaque_reason is None


def test_usage_from_a_stream_tail_longer_than_its_last_event() -> None:
    event = {
        "type": "response.completed",
        "response": {
            "instructions": "i" * 40_000,
            "usage": {
                "input_tokens": 1234,
                "input_tokens_details": {"cached_tokens": 1024},
                "output_tokens": 5,
            },
        },
    }
    stream = b"event: response.completed\ndata: " + orjson.dumps(event) + b"\n\n"
    usage = DIALECT.stream_usage(stream[-16384:])
    assert usage is not None and (usage.prompt_tokens, usage.cached_tokens) == (1234, 1024)


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(
        f"event: {e['type']}\ndata: ".encode() + orjson.dumps(e) + b"\n\n" for e in events
    )


def test_a_stream_overflow_is_told_after_the_opening_events() -> None:
    opening = sse({"type": "response.created"}, {"type": "response.in_progress"})
    failed = {"type": "response.failed", "response": {"error": {"code": "context_length_exceeded"}}}
    assert DIALECT.stream_overflow(opening) is None
    assert DIALECT.stream_overflow(opening + sse(failed)[:20]) is None  # not complete yet
    assert DIALECT.stream_overflow(opening + sse(failed)) is True
    assert (
        DIALECT.stream_overflow(opening + sse({"type": "error", "code": "context_length_exceeded"}))
        is True
    )
    assert DIALECT.stream_overflow(opening + sse({"type": "response.output_item.added"})) is False


# -- properties over random item lists -----------------------------------------------------------

UNKNOWN = (
    "program",
    "tool_search_output",
    "configuration_update",
    "mcp_approval_response",
    "compaction_trigger",
)


@st.composite
def item_lists(draw: st.DrawFn) -> list[Item]:
    """A valid stateless Responses input: turns of a user message, then model output (reasoning,
    text, function, custom and local shell calls) answered by their outputs; system and
    developer messages, compaction items and unknown item types anywhere between, and at the
    end, sometimes, Codex's request for a compaction."""
    items: list[Item] = []
    calls = 0
    # Every item of model output differs from every other: the test finds each item sent
    # among those received by its content.
    serial = iter(range(1 << 30))

    def maybe_unknown() -> None:
        if draw(st.integers(0, 5)) == 0:
            items.append(
                {
                    "type": draw(st.sampled_from(UNKNOWN)),
                    "note": words(draw(st.integers(1, 30)), calls),
                }
            )

    maybe_unknown()
    for turn in range(draw(st.integers(0, 5))):  # none: an empty input, or a trigger alone
        if draw(st.integers(0, 4)) == 0:
            role = draw(st.sampled_from(["system", "developer"]))
            items.append({"role": role, "content": f"rule {turn}"})
        if draw(st.integers(0, 6)) == 0:
            items.append({"type": "compaction", "encrypted_content": ENCRYPTED})
        items.append(user(f"Turn {turn}: " + words(draw(st.integers(5, 120)), turn)))
        maybe_unknown()
        for _ in range(draw(st.integers(0, 4))):
            if draw(st.booleans()):
                items.append(reasoning(next(serial)))
            if draw(st.booleans()):
                text = words(draw(st.integers(1, 60)), calls)
                items.append(assistant(f"{next(serial)}: {text}"))
            if draw(st.integers(0, 5)) == 0:
                search = {"type": "search", "query": words(3, calls)}
                items.append(
                    {
                        "type": "web_search_call",
                        "id": f"ws_{next(serial)}",
                        "status": "completed",
                        "action": search,
                    }
                )
            made = []
            for _ in range(draw(st.integers(0, 2))):
                calls += 1
                kind = draw(
                    st.sampled_from(["function_call", "custom_tool_call", "local_shell_call"])
                )
                size = draw(st.integers(1, 400))
                if kind == "function_call":
                    item = call(calls, json.dumps({"cmd": words(size, calls)}))
                elif kind == "custom_tool_call":
                    item = {
                        "type": kind,
                        "call_id": f"call_{calls}",
                        "name": "patch",
                        "input": words(size, calls),
                    }
                else:
                    item = {
                        "type": kind,
                        "call_id": f"call_{calls}",
                        "action": {"type": "exec", "command": ["ls"]},
                        "status": "completed",
                    }
                items.append(item)
                made.append(item)
            maybe_unknown()
            for item in made:
                kind = (
                    "custom_tool_call_output"
                    if item["type"] == "custom_tool_call"
                    else "function_call_output"
                )
                items.append(
                    {
                        "type": kind,
                        "call_id": item["call_id"],
                        "output": words(draw(st.integers(1, 900)), calls),
                    }
                )
                maybe_unknown()
    if draw(st.booleans()):
        items.append({"type": "compaction_trigger"})
    return items


def produced(items: Sequence[Item], at: int) -> list[int]:
    """The model output after the reasoning item at `at`: up to the next reasoning item, or
    anything else than model output (items of unknown types aside)."""
    out = []
    for j in range(at + 1, len(items)):
        kind = item_type(items[j])
        if kind in UNKNOWN:
            continue
        if kind not in (*CALLS, "web_search_call") and items[j].get("role") != "assistant":
            break
        out.append(j)
    return out


EDITED_FIELDS = {
    "function_call_output": "output",
    "custom_tool_call_output": "output",
    "function_call": "arguments",
    "custom_tool_call": "input",
}
HEADINGS = (SUMMARY_HEADING, DIGEST_HEADING, ANCHOR_HEADING)


def is_summary(item: Item) -> bool:
    content = item.get("content")
    return isinstance(content, list) and content[0]["text"].startswith(HEADINGS)


def same_item(received: Item, sent: Item) -> bool:
    """Whether `sent` is `received` as it was, or edited (the same call or output)."""
    if received == sent:
        return True
    kind = item_type(sent)
    return kind in EDITED_FIELDS and (kind, sent["call_id"]) == (
        item_type(received),
        received.get("call_id"),
    )


def without(item: Item, field: str) -> Item:
    return {k: v for k, v in item.items() if k != field}


async def compacted(parsed: Parsed, limit: int, policy: Policy) -> Any:
    fixed = DIALECT.fixed_tokens(parsed, COUNTER)
    budget = policy.budget(limit + policy.safety_margin_tokens + 256, None, 256)
    result = await policies.compact(
        parsed.messages, Plan(), budget=budget, policy=policy, counter=COUNTER, fixed_tokens=fixed
    )
    entries = render_entries(parsed.messages, result.plan, summary_role=policy.summary_role)
    return orjson.loads(DIALECT.render(parsed, entries))


@st.composite
def compaction_policies(draw: st.DrawFn) -> Policy:
    """The default layers, or cheap layers tight enough to clear, truncate and drop."""
    role = draw(st.sampled_from(["user", "system", "assistant"]))
    protect = {"protect_min_tokens": 200, "protect_max_tokens": 1000, "summary_role": role}
    if draw(st.booleans()):
        return Policy(**protect)
    keep = draw(st.integers(0, 2))
    layers = (
        LayerSpec("clear_tool_results", ClearToolResultsParams(keep_last=keep)),
        LayerSpec("truncate_tool_fields", TruncateToolFieldsParams(40, 60, 20)),
        LayerSpec("drop_tool_blocks", DropToolBlocksParams(keep_last=keep)),
        *DEFAULT_LAYERS[3:],
    )
    return Policy(layers=layers, protect_recent_rounds=1, **protect)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=item_lists(), limit=st.integers(300, 6000), policy=compaction_policies())
def test_compacted_items_keep_every_rule_of_the_api(
    items: list[Item], limit: int, policy: Policy
) -> None:
    body = {
        "instructions": "You are Codex.",
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    parsed = parse(items, **body)
    out = asyncio.run(compacted(parsed, limit, policy))
    sent = out["input"]
    assert {k: v for k, v in out.items() if k != "input"} == {"model": "gpt-4o", **body}
    validate_responses(out)
    check_pairs(sent)  # no output without its call, no call unanswered before a user message
    kept: list[int] = []  # the position of each item sent, which is kept in order
    summaries = 0
    for item in sent:
        if is_summary(item):
            summaries += 1
            continue
        at = kept[-1] + 1 if kept else 0
        while at < len(items) and not same_item(items[at], item):
            at += 1
        assert at < len(items), f"not an item received, nor an edit of one: {item}"
        if items[at] != item:  # an edit: only its output, arguments or input replaced
            field = EDITED_FIELDS[item_type(item)]
            assert without(item, field) == without(items[at], field)
        kept.append(at)
    assert summaries <= 1
    # Each call keeps its output and its reasoning item, and the reverse.
    present = set(kept)
    calls_of = {i.get("call_id"): p for p, i in enumerate(items) if item_type(i) in CALLS}
    for position, item in enumerate(items):
        if item_type(item) in OUTPUTS:
            assert (position in present) == (calls_of[item["call_id"]] in present)
        if item_type(item) == "reasoning":
            after = produced(items, position)
            if after:
                assert (position in present) == any(p in present for p in after)
    # The current turn goes as it came, and so do system messages and compaction items.
    chain = [i for i, m in enumerate(parsed.messages) if not is_system(m)]
    turn = {chain[p] for p in current_turn([parsed.messages[i] for i in chain])}
    pinned = {i for i, m in enumerate(parsed.messages) if is_system(m)}
    for index in turn | pinned:
        for item in parsed.native(index):
            assert item in sent


def test_instructions_and_every_tool_are_fixed_tokens() -> None:
    function = {"type": "function", "name": "shell", "parameters": {"type": "object"}}
    grammar = {"type": "custom", "name": "apply_patch", "format": {"definition": "x " * 1000}}
    bare = DIALECT.fixed_tokens(parse("hi"), COUNTER)
    instructions = DIALECT.fixed_tokens(parse("hi", instructions="Be brief. " * 100), COUNTER)
    tools = DIALECT.fixed_tokens(parse("hi", tools=[function, grammar]), COUNTER)
    assert instructions - bare >= 300
    assert tools - bare >= 1000  # a custom tool's grammar is read by the model too


def test_summary_requests_suit_the_model() -> None:
    plain = orjson.loads(DIALECT.summary_body("gpt-4o", "SYS", "PROMPT", 500, 0.1))
    assert plain == {
        "model": "gpt-4o",
        "instructions": "SYS",
        "input": [{"role": "user", "content": "PROMPT"}],
        "store": False,
        "temperature": 0.1,
        "max_output_tokens": 500,
    }
    reasoning = orjson.loads(DIALECT.summary_body("gpt-5-mini", "SYS", "PROMPT", 500, 0.1))
    assert "temperature" not in reasoning and reasoning["reasoning"] == {"effort": "low"}
    assert reasoning["max_output_tokens"] > 500
    answer = {
        "status": "completed",
        "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": "## Goal"}]},
        ],
    }
    assert DIALECT.summary_text(orjson.dumps(answer)) == "## Goal"
    with pytest.raises(SummaryFailed, match="overlong"):
        DIALECT.summary_text(orjson.dumps({**answer, "status": "incomplete"}))


# --- a replayed turn maps what is new -------------------------------------------------------

# Items the fold keeps beside others: an output of no call just before it, a reference, a
# screenshot (its cost goes to its call's message), a message of a role the API does not know.
STRAYS = [
    {"type": "function_call_output", "call_id": "call_stray", "output": "late"},
    {"type": "item_reference", "id": "msg_1"},
    {"type": "computer_call", "call_id": "cc_1", "action": {"type": "click", "x": 1, "y": 2}},
    {
        "type": "computer_call_output",
        "call_id": "cc_1",
        "output": {"type": "computer_screenshot", "image_url": PNG},
    },
    {"type": "local_shell_call", "id": "ls_1", "call_id": "ls_1", "action": {"type": "exec"}},
    {"type": "local_shell_call_output", "id": "ls_1", "output": "done"},
    {"role": "critic", "content": "an unknown role"},
    {"type": "shell_call_output", "call_id": "call_9", "output": [{"type": "input_text"}]},
]


@st.composite
def histories(draw: st.DrawFn) -> list[Item]:
    """Valid Codex-like items with strays anywhere, some of them refused (a text part without
    its text)."""
    items = draw(item_lists())
    for _ in range(draw(st.integers(0, 4))):
        items.insert(draw(st.integers(0, len(items))), draw(st.sampled_from(STRAYS)))
    return items


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.data())
def test_a_replayed_turn_maps_only_its_new_items_to_what_the_whole_body_gives(
    items: list[Item], data: st.DataObject
) -> None:
    """Turn after turn of one history, as a client writes them (any spacing, keys written
    twice), cut anywhere (in a run of model output, between a call and its output; a turn
    sent again): the known items' mapping resumed gives what mapping the whole body gives,
    or the same 400; and no turn changes what an earlier one was given."""
    dialect = Responses(split_from=0)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(items)), min_size=1, max_size=6)))
    # The client's next turn is its last body with items added: the same bytes up to there.
    space = data.draw(st.sampled_from(["", " ", "\n  "]))
    texts = [data.draw(written(item)) for item in items]
    given: list[tuple[Parsed, Any]] = []
    resumed = 0
    for cut in cuts:
        if data.draw(st.integers(0, 3)):
            listed = f",{space}".join(texts[:cut])
            raw = (
                f'{{"model":{space}"gpt-4o", "instructions": "Codex.", "input": [{space}{listed}'
                f'{space}],{space}"store": false}}'
            ).encode()
        else:
            body = {"model": "gpt-4o", "instructions": "Codex.", "input": items[:cut]}
            raw = data.draw(written(body)).encode()
        try:
            whole = dialect.parse_whole(raw)
        except InvalidRequest as refused:
            with pytest.raises(InvalidRequest) as caught:
                dialect.parse(raw)
            assert (caught.value.message, caught.value.param) == (refused.message, refused.param)
            continue
        known = dialect.known.bodies.find(raw)
        kept = copy.deepcopy(None if known is None else known.folded)
        parsed = dialect.parse(raw)
        if known is not None and known.folded is not None:
            resumed += 1
            assert all(map(operator.is_, parsed.items, known.items))  # looked up, not read
            assert known.folded == kept  # what it resumed from is as it was
        assert parsed.body == whole.body == orjson.loads(raw)
        assert parsed.items == whole.items
        assert parsed.messages == whole.messages
        assert parsed.spans == whole.spans
        assert parsed.keys == content_keys(parsed.messages)  # each key is its message's
        # Untouched, every item goes upstream as the client's bytes of it.
        assert parsed.raw_items is not None
        assert [orjson.loads(sent) for sent in parsed.raw_items] == parsed.items
        out = dialect.render(parsed, list(enumerate(parsed.messages)))
        assert orjson.loads(out) == orjson.loads(raw)
        listed = msgspec.json.decode(out, type=dict[str, msgspec.Raw])["input"]
        sent = [bytes(item) for item in msgspec.json.decode(listed, type=list[msgspec.Raw])]
        assert sent == list(parsed.raw_items)
        # A view with messages dropped and edited (copies; no layer edits a system message),
        # a summary first or not: the same body from either path.
        shown = data.draw(st.lists(st.sampled_from("kde"), min_size=len(parsed.messages)))
        header = data.draw(st.sampled_from([[], [(None, {"role": "user", "content": "gist"})]]))

        def view(
            read: Parsed, header: list[Any] = header, shown: list[str] = shown
        ) -> list[tuple[int | None, policies.Message]]:
            return [
                *header,
                *(
                    (i, {**m} if how == "e" and not is_system(m) else m)
                    for (i, m), how in zip(enumerate(read.messages), shown, strict=False)
                    if how != "d"
                ),
            ]

        out = dialect.render(parsed, view(parsed))
        assert orjson.loads(out) == orjson.loads(dialect.render(whole, view(whole)))
        expected: list[Any] = []  # each message's items in turn, as received or edited
        for index, message in view(whole):
            if index is None:
                expected += dialect.summary_items(message)
            elif message is whole.messages[index]:
                expected += whole.native(index)
            else:
                expected += dialect.edited_items(
                    whole.native(index), whole.messages[index], message
                )
        assert orjson.loads(out)["input"] == expected
        given.append((parsed, copy.deepcopy((parsed.messages, parsed.spans, parsed.keys))))
    for parsed, then in given:
        assert (parsed.messages, parsed.spans, parsed.keys) == then
    event("a turn resumed the mapping" if resumed else "no turn resumed it")


def test_a_bad_item_after_known_ones_is_the_whole_body_paths_400() -> None:
    """The split maps the new item and fails; the whole-body path names it, after any other
    fault of the body."""
    dialect = Responses(split_from=0)
    good = [user("hi"), call(1)]
    dialect.parse(orjson.dumps({"model": "m", "input": good}))
    bad = [*good, answer(1), {"type": "function_call", "call_id": 7, "name": "x"}]
    with pytest.raises(InvalidRequest) as caught:
        dialect.parse(orjson.dumps({"model": "m", "input": bad}))
    assert caught.value.param == "input[3].call_id"
    with pytest.raises(InvalidRequest) as caught:
        dialect.parse(orjson.dumps({"model": "m", "instructions": 1, "input": bad}))
    assert caught.value.param == "instructions"
    for role in (["user"], {"a": 1}, 5):
        with pytest.raises(InvalidRequest) as caught:
            dialect.parse(orjson.dumps({"model": "m", "input": [*good, {"role": role}]}))
        assert caught.value.param == "input[2].role"
    for wrong in (5, {"a": 1}):  # the instructions are named first, as ever
        with pytest.raises(InvalidRequest) as caught:
            dialect.parse(orjson.dumps({"model": "m", "instructions": 5, "input": wrong}))
        assert caught.value.param == "instructions"


def test_a_replayed_turn_reads_only_the_new_items() -> None:
    """The history is looked up, not read: its items are the same objects as the turn's
    before, and so are its messages but those the new items changed (copies)."""
    dialect = Responses(split_from=0)
    history = [user("fix it"), reasoning(1), call(1)]
    first = dialect.parse(orjson.dumps({"model": "m", "input": history}))
    then = copy.deepcopy(first.messages)
    turn = [*history, answer(1, "done"), user("thanks")]
    second = dialect.parse(orjson.dumps({"model": "m", "input": turn}))
    assert all(map(operator.is_, second.items[:3], first.items))
    assert second.messages[0] is first.messages[0]  # the user message: untouched
    assert second.messages[1] is first.messages[1]  # the calls' message: no cost added
    assert [m["role"] for m in second.messages] == ["user", "assistant", "tool", "user"]
    assert first.messages == then


def test_a_history_of_unknown_items_alone_is_mapped_again_when_a_message_follows() -> None:
    """Alone they are one pinned message; once a message follows they are its parts."""
    dialect = Responses(split_from=0)
    unknown = [{"type": "future_item", "note": words(40, n)} for n in range(3)]
    first = dialect.parse(orjson.dumps({"model": "m", "input": unknown}))
    assert [m["role"] for m in first.messages] == ["system"]
    raw = orjson.dumps({"model": "m", "input": [*unknown, user("hi")]})
    assert dialect.known.bodies.find(raw) is not None
    parsed = dialect.parse(raw)
    assert parsed.messages == dialect.parse_whole(raw).messages
    assert [m["role"] for m in parsed.messages] == ["user"]
