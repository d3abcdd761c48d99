"""The Anthropic Messages dialect's mapping of content blocks to the engine's messages and back,
and its prompt-cache breakpoints: examples, and properties over random histories, every view
checked by the strict fake's own validation (pairs, signatures, breakpoints)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
from proxy.dialects.anthropic.blocks import rebuilt, thinking_turn
from proxy.dialects.anthropic.breakpoints import BREAKPOINT, with_breakpoints
from proxy.dialects.anthropic.groups import groups as view_groups
from proxy.dialects.anthropic.messages import Messages, user_id_session
from proxy.dialects.anthropic.request import Spans
from proxy.dialects.base import Parsed
from proxy.errors import APIError, InvalidRequest, UpstreamTimeout
from proxy.models.tokens import counter_for
from tests.conftest import examples
from tests.conversations import words as plain_words
from tests.fakes.anthropic import AnthropicError, FakeAnthropic
from tests.test_raw_items import written

MESSAGES = Messages()
FAKE = FakeAnthropic()  # never started: its validation, counting and signatures only
COUNTER = counter_for("claude-test", "estimate")
MARK = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
TOOLS = [{"name": "read", "input_schema": {"type": "object"}}]
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
PLACEHOLDER = "[Old tool result content cleared]"
# Every layer, with parameters small enough to act on the small random histories.
LAYERS = (
    policies.LayerSpec("clear_tool_results", policies.ClearToolResultsParams(keep_last=0)),
    policies.LayerSpec(
        "truncate_tool_fields",
        policies.TruncateToolFieldsParams(
            arguments_max_tokens=8, result_max_tokens=8, keep_tokens=2
        ),
    ),
    policies.LayerSpec("drop_tool_blocks", policies.DropToolBlocksParams(keep_last=0)),
    policies.LayerSpec("summarize", policies.SummarizeParams()),
    policies.LayerSpec("trim_head", policies.TrimHeadParams()),
)

Block = dict[str, Any]


def thought(text: str) -> Block:
    return {"type": "thinking", "thinking": text, "signature": FAKE.sign(text)}


def use(tool_id: str, **arguments: Any) -> Block:
    return {"type": "tool_use", "id": tool_id, "name": "read", "input": arguments}


def result(tool_id: str, content: Any = "output", **extra: Any) -> Block:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content, **extra}


def text(value: str, **extra: Any) -> Block:
    return {"type": "text", "text": value, **extra}


def parse(messages: list[dict[str, Any]], **fields: Any) -> Any:
    body = {"model": "claude-test", "max_tokens": 1000, "messages": messages, **fields}
    return MESSAGES.parse(orjson.dumps(body))


def rendered(parsed: Any, entries: Any, breakpoints: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(MESSAGES.render(parsed, entries, breakpoints))
    return out


# --- the mapping, by example --------------------------------------------------------------


def test_a_view_writes_each_edit_into_its_own_message_and_nothing_else() -> None:
    """A native message goes out as received while every canonical message of it is shown
    unchanged, and is rebuilt with the edit otherwise: a turn with one result, or several."""
    history = [
        {"role": "user", "content": "Read them"},
        {"role": "assistant", "content": [use("a"), use("b")]},
        {"role": "user", "content": [result("a", "A" * 50), result("b", "B" * 50)]},
        {"role": "assistant", "content": [use("c")]},
        {"role": "user", "content": [result("c", "C" * 50)]},
        {"role": "assistant", "content": "Done."},
    ]
    parsed = parse(history)
    tools = [i for i, m in enumerate(parsed.messages) if m["role"] == "tool"]
    assert len(tools) == 3
    for cleared in tools:
        entries = [
            (i, {**m, "content": PLACEHOLDER} if i == cleared else m)
            for i, m in enumerate(parsed.messages)
        ]
        sent = rendered(parsed, entries)["messages"]
        native = parsed.spans[cleared].start
        assert [m for j, m in enumerate(sent) if j != native] == [
            m for j, m in enumerate(history) if j != native
        ]
        called = parsed.messages[cleared]["tool_call_id"]
        for block in sent[native]["content"]:
            original = next(
                b for b in history[native]["content"] if b["tool_use_id"] == block["tool_use_id"]
            )
            assert (block == original) == (block["tool_use_id"] != called)


def test_a_user_turn_with_tool_results_is_tool_messages_then_its_other_blocks() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    parsed = parse(
        [
            {"role": "user", "content": "Read both"},
            {"role": "assistant", "content": [thought("plan"), text("Reading."), use("a", p=1)]},
            {
                "role": "user",
                "content": [result("a", [text("A")], is_error=True), text("hm"), image],
            },
        ]
    )
    assert parsed.messages == [
        {"role": "user", "content": "Read both"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Reading."}],
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"p":1}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "a",
            "content": [{"type": "text", "text": "A"}],
            "is_error": True,
        },
        {
            "role": "user",
            "content": [{"type": "text", "text": "hm"}, {"type": "opaque", "tokens": 1600}],
        },
    ]
    assert [s.start for s in parsed.spans] == [0, 1, 2, 2]
    assert parsed.messages[0] is parsed.items[0]  # a string message is already canonical


def test_untouched_messages_go_out_as_received() -> None:
    raw_messages = [
        {"role": "user", "content": "Read"},
        {"role": "assistant", "content": [thought("t"), use("a")]},
        {"role": "user", "content": [result("a"), text("next", cache_control=MARK)]},
    ]
    parsed = parse(raw_messages)
    assert MESSAGES.render(parsed, list(enumerate(parsed.messages))) == parsed.raw
    assert MESSAGES.render(parsed, list(enumerate(parsed.messages)), True) == parsed.raw


def test_clearing_a_result_keeps_its_id_error_flag_and_breakpoint() -> None:
    native = {
        "role": "user",
        "content": [result("a", [text("long", cache_control=MARK)], is_error=True), text("and?")],
    }
    tool, user = parse([native]).messages
    out = rebuilt(native, [(tool, {**tool, "content": PLACEHOLDER}), (user, user)])
    assert out == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "a",
                "content": [{"type": "text", "text": PLACEHOLDER, "cache_control": MARK}],
                "is_error": True,
            },
            text("and?"),
        ],
    }
    assert rebuilt(native, [(tool, None), (user, user)]) == {
        "role": "user",
        "content": [text("and?")],
    }
    assert rebuilt(native, [(tool, None), (user, None)]) is None


def test_a_failed_calls_result_reaches_the_engine_as_an_error() -> None:
    failed = {"role": "user", "content": [result("a", "Traceback: boom", is_error=True)]}
    ok = {"role": "user", "content": [result("b", "fine")]}
    [error] = parse([failed]).messages
    [fine] = parse([ok]).messages
    assert policies.message.is_error_result(error) and not policies.message.is_error_result(fine)


def test_a_truncated_input_stays_a_json_object_and_thinking_is_untouched() -> None:
    native = {
        "role": "assistant",
        "content": [thought("why"), text("Doing."), use("a", q="x" * 99)],
    }
    (message,) = parse([{"role": "user", "content": "go"}, native]).messages[1:]
    call = message["tool_calls"][0]
    short = {**call, "function": {**call["function"], "arguments": '{"q": "xxx\n[TRUNCATED]'}}
    out = rebuilt(native, [(message, {**message, "tool_calls": [short]})])
    assert out is not None
    assert out["content"][:2] == native["content"][:2]
    assert out["content"][2] == {**use("a"), "input": {"_truncated": '{"q": "xxx\n[TRUNCATED]'}}
    # Its tool block dropped, the turn keeps its thinking and text; with no text, it goes.
    text_only = {k: v for k, v in message.items() if k != "tool_calls"}
    assert rebuilt(native, [(message, text_only)]) == {**native, "content": native["content"][:2]}
    bare = {"role": "assistant", "content": [thought("why"), use("a")]}
    (message,) = parse([{"role": "user", "content": "go"}, bare]).messages[1:]
    assert rebuilt(bare, [(message, {**message, "tool_calls": []})]) is None


def test_the_summary_is_its_own_user_message_first_and_system_is_never_changed() -> None:
    history = [{"role": "user", "content": f"turn {i}"} for i in range(4)]
    system = [text("You are terse.", cache_control=MARK)]
    parsed = parse(history, system=system)
    plan = policies.Plan(cut=2, summary=policies.Summary("S", "llm"), covered=4)
    out = rendered(parsed, policies.render_entries(parsed.messages, plan))
    assert out["system"] == system
    assert out["messages"][0]["role"] == "user"
    assert out["messages"][0]["content"][0]["text"].endswith("\nS")
    assert out["messages"][1:] == history[2:]


def test_a_system_message_of_the_evicted_part_follows_the_summary() -> None:
    history = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    parsed = parse(history)
    plan = policies.Plan(cut=2, summary=policies.Summary("S", "llm"), covered=3)
    out = rendered(parsed, policies.render_entries(parsed.messages, plan))
    assert [m["role"] for m in out["messages"]] == ["user", "system", "user"]
    FAKE.count(out)


def test_every_system_message_of_a_view_follows_a_user_turn() -> None:
    """Claude Code repeats its system message through a loop: evicted copies moved after the
    summary sat side by side (the API's 400 in a real run), and one left after an assistant
    turn when the user turn between was dropped."""
    history = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "system", "content": [text("Be brief, still.")]},
        {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"},
        {"role": "system", "content": "Last."},
        {"role": "assistant", "content": "f"},
        {"role": "user", "content": "g"},
    ]
    parsed = parse(history)
    plan = policies.Plan(cut=5, summary=policies.Summary("S", "llm"), covered=6)
    summarised = policies.render_entries(parsed.messages, plan)
    dropped = [(i, m) for i, m in enumerate(parsed.messages) if i != 6]  # the user turn "e"
    for entries in (summarised, dropped):
        out = rendered(parsed, entries)
        roles = [m["role"] for m in out["messages"]]
        assert all(roles[i - 1] == "user" for i, r in enumerate(roles) if r == "system"), roles
        said = orjson.dumps(out["messages"])
        assert all(s in said for s in (b"Be brief.", b"Be brief, still.", b"Last."))
        FAKE.count(out)


def test_only_the_current_tool_loops_thinking_is_kept() -> None:
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [thought("one"), use("a")]},
        {"role": "user", "content": [result("a")]},
        {"role": "assistant", "content": [thought("two"), use("b")]},
        {"role": "user", "content": [result("b")]},
    ]
    assert thinking_turn(history) == (3, [history[3]["content"][0]])
    assert thinking_turn([*history, {"role": "user", "content": "new"}]) == (6, [])
    with_text = [*history[:4], {"role": "user", "content": [result("b"), text("and?")]}]
    assert thinking_turn(with_text) == (5, [])
    # It counts with the fixed tokens, never in a message: a message's form does not change
    # when its thinking stops being kept.
    assert MESSAGES.fixed_tokens(parse(history), COUNTER) > MESSAGES.fixed_tokens(
        parse(with_text), COUNTER
    )
    assert parse(history).messages[:3] == parse(with_text).messages[:3]


@pytest.mark.parametrize(
    "messages",
    [
        "x",
        [1],
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"text": "no type"}]}],
        [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "a", "name": "r", "input": []}],
            }
        ],
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 1}]}],
        [{"role": "assistant", "content": [{"type": ["thinking"]}]}],  # was a 500
        [{"role": "user", "content": [{"type": {"x": 1}, "text": "hi"}]}],
    ],
)
def test_bad_shapes_are_a_400_in_the_apis_words(messages: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(messages)
    body = orjson.loads(MESSAGES.error_body(caught.value))
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("messages")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_errors_in_anthropics_shape(status: int, kind: str) -> None:
    error = APIError("it failed")
    error.status_code = status
    assert orjson.loads(MESSAGES.error_body(error)) == {
        "type": "error",
        "error": {"type": kind, "message": "it failed"},
    }
    assert orjson.loads(MESSAGES.error_body(UpstreamTimeout("slow")))["error"]["type"] == (
        "timeout_error"
    )


def test_both_overflow_texts_and_nothing_else() -> None:
    def error(message: str) -> bytes:
        return orjson.dumps(
            {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        )

    assert MESSAGES.is_overflow(400, error("prompt is too long: 9000 tokens > 8192 maximum"))
    assert MESSAGES.is_overflow(
        400, error("input length and `max_tokens` exceed context limit: 7000 + 2000 > 8192, x")
    )
    assert not MESSAGES.is_overflow(400, error("max_tokens: Field required"))
    assert not MESSAGES.is_overflow(413, error("prompt is too long: 1 tokens > 0 maximum"))
    assert not MESSAGES.is_overflow(400, b"not json")


def test_usage_counts_cache_reads_and_writes_into_the_prompt() -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 700, "cache_creation_input_tokens": 90}
    whole = MESSAGES.usage(orjson.dumps({"usage": {**usage, "output_tokens": 5}}))
    assert whole is not None and (whole.prompt_tokens, whole.cached_tokens) == (800, 700)
    assert whole.cache_creation_tokens == 90
    start = b'event: message_start\ndata: {"type":"message_start","message":{"usage":%s}}\n\n'
    head = start % orjson.dumps(usage) + b"event: ping\ndata: {}\n\n"
    assert MESSAGES.stream_start_usage(head) == whole
    delta = b'event: message_delta\ndata: {"type":"message_delta","usage":%s}\n\n'
    assert MESSAGES.stream_usage(delta % orjson.dumps(usage)) == whole
    assert MESSAGES.stream_usage(delta % b'{"output_tokens": 5}') is None


def test_the_session_inside_claude_codes_user_id() -> None:
    legacy = "user_" + "ab" * 32 + "_account__session_1b2c3d4e-0000-4000-8000-000000000001"
    assert user_id_session(legacy) == "1b2c3d4e-0000-4000-8000-000000000001"
    with_account = "user_" + "ab" * 32 + "_account_9f0e-11_session_abc-123"
    assert user_id_session(with_account) == "abc-123"
    newer = orjson.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-9"}).decode()
    assert user_id_session(newer) == "s-9"
    assert user_id_session("same-user-across-chats") is None
    assert user_id_session("{broken") is None


def test_a_subscription_token_pays_for_no_summary_of_the_proxys() -> None:
    assert not MESSAGES.may_reuse_credentials([("authorization", "Bearer sk-ant-oat01-abc")])
    assert MESSAGES.may_reuse_credentials([("x-api-key", "sk-ant-api03-abc")])
    assert MESSAGES.window({"anthropic-beta": "x-1, context-1m-2025-08-07"}) == 1_000_000
    assert MESSAGES.window({}) is None


# --- breakpoints ---------------------------------------------------------------------------


def conversation(n: int) -> list[dict[str, Any]]:
    return [{"role": ("user", "assistant")[i % 2], "content": f"m{i}"} for i in range(n)]


def marks(messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [
        (i, block["cache_control"].get("ttl", "5m"))
        for i, m in enumerate(messages)
        if isinstance(m["content"], list)
        for block in m["content"]
        if "cache_control" in block
    ]


def added(body: dict[str, Any], messages: list[dict[str, Any]], at: list[int]) -> Any:
    """`with_breakpoints` on a request of `body` and `messages`."""
    raw = orjson.dumps({**body, "messages": messages})
    return with_breakpoints(body, raw.count(BREAKPOINT), messages, at)


def test_the_proxys_breakpoints_only_take_free_slots() -> None:
    messages = conversation(6)
    body = {
        "system": [text("s", cache_control=MARK)],
        "tools": [{**TOOLS[0], "cache_control": MARK}],
    }
    assert marks(added(body, messages, [1, 3])) == [(1, "5m"), (3, "5m")]
    messages[5] = {"role": "user", "content": [text("m5", cache_control=MARK)]}
    assert marks(added(body, messages, [1, 3])) == [(1, "5m"), (5, "5m")]
    assert added({**body, "cache_control": MARK}, messages, [1, 3]) == messages
    # A message that has one already gets no other.
    assert marks(added({}, messages, [5, 1])) == [(1, "5m"), (5, "5m")]
    # Nor does the last one when the request asks for automatic caching.
    assert marks(added({"cache_control": MARK}, conversation(3), [2, 0])) == [(0, "5m")]


def test_a_proxy_breakpoint_before_a_one_hour_one_lasts_an_hour() -> None:
    messages = conversation(4)
    messages[3] = {"role": "user", "content": [text("m3", cache_control=HOUR)]}
    assert marks(added({}, messages, [0])) == [(0, "1h"), (3, "1h")]
    assert marks(added({"cache_control": HOUR}, conversation(4), [0])) == [(0, "1h")]
    messages[3] = {"role": "user", "content": [text("1h", cache_control=MARK)]}
    assert marks(added({}, messages, [0])) == [(0, "5m"), (3, "5m")]


def test_an_hours_breakpoint_is_found_however_its_ttl_is_written() -> None:
    """What the client wrote is read as the API reads it: an escaped TTL is an hour too."""
    messages = conversation(4)
    messages[3] = {"role": "user", "content": [text("m3", cache_control=HOUR)]}
    raw = orjson.dumps({"model": "m", "messages": messages}).replace(b'"1h"', b'"\\u0031h"')
    assert orjson.loads(raw)["messages"] == messages
    assert marks(with_breakpoints({}, raw.count(BREAKPOINT), messages, [0])) == [
        (0, "1h"),
        (3, "1h"),
    ]


def test_thinking_blocks_take_no_breakpoint() -> None:
    messages = [{"role": "assistant", "content": [thought("t"), use("a"), thought("u")]}]
    assert added({}, messages, [0])[0]["content"][1]["cache_control"] == MARK
    only = [{"role": "assistant", "content": [thought("t")]}]
    assert added({}, only, [0]) == only


# --- properties over random histories -------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bool]:
    """A valid Messages history ending with a user turn, and whether thinking is on."""
    thinking = draw(st.booleans())
    ids = (f"toolu_{i}" for i in itertools.count())
    words = st.builds(plain_words, st.integers(1, 250), st.integers(0, 999))

    def think() -> list[Block]:
        if not thinking:
            return []
        if draw(st.booleans()):
            return [{"type": "redacted_thinking", "data": FAKE.redacted_data()}]
        return [thought(draw(words))]

    def user_blocks() -> list[Block]:
        kinds = st.sampled_from(["text", "text", "image", "document", "search"])
        blocks = []
        for kind in draw(st.lists(kinds, min_size=1, max_size=3)):
            if kind == "text":
                blocks.append(text(draw(words)))
            elif kind == "image":
                source = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
                blocks.append({"type": "image", "source": source})
            elif kind == "document":
                source = {"type": "text", "media_type": "text/plain", "data": draw(words)}
                blocks.append({"type": "document", "source": source})
            else:
                content = [text(draw(words))]
                blocks.append(
                    {"type": "search_result", "source": "s", "title": "t", "content": content}
                )
        return blocks

    messages: list[dict[str, Any]] = []
    rounds = draw(st.integers(1, 5))
    for number in range(rounds):
        first = draw(st.booleans())
        messages.append({"role": "user", "content": draw(words) if first else user_blocks()})
        for _ in range(draw(st.integers(0, 3))):
            calls = [use(next(ids), path=draw(words)) for _ in range(draw(st.integers(1, 3)))]
            said = [text(draw(words))] if draw(st.booleans()) else []
            messages.append({"role": "assistant", "content": [*think(), *said, *calls]})
            answers: list[Block] = []
            for call in calls:
                content = draw(st.one_of(words, st.just([text(draw(words))])))
                answers.append(result(call["id"], content, is_error=draw(st.booleans())))
            if draw(st.integers(0, 3)) == 0:
                answers.append(text(draw(words)))
            messages.append({"role": "user", "content": answers})
        if number < rounds - 1 or draw(st.booleans()):
            messages.append({"role": "assistant", "content": [*think(), text(draw(words))]})
            messages.append({"role": "user", "content": draw(words)})
    blocks = [
        b
        for m in messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] not in ("thinking", "redacted_thinking")
    ]
    for block in (
        draw(st.lists(st.sampled_from(blocks), max_size=3, unique_by=id)) if blocks else ()
    ):
        block["cache_control"] = MARK
    return messages, thinking


def client_marks_kept(native: dict[str, Any], out: dict[str, Any]) -> None:
    """Every client breakpoint whose block survives is still on it."""
    shown = out["content"] if isinstance(out["content"], list) else []
    for block in native["content"] if isinstance(native["content"], list) else []:
        if "cache_control" not in block:
            continue
        kind = block["type"]
        key = "id" if kind == "tool_use" else "tool_use_id" if kind == "tool_result" else None
        if key is not None:
            same = [b for b in shown if b.get(key) == block[key]]
            assert all(orjson.dumps(b).count(b"cache_control") for b in same)
        else:
            bare = [{k: v for k, v in b.items() if k != "cache_control"} for b in shown]
            if {k: v for k, v in block.items() if k != "cache_control"} in bare:
                assert block in shown


@settings(max_examples=examples(300), deadline=None, suppress_health_check=HEALTH)
@given(history=histories(), data=st.data())
async def test_every_compacted_view_is_a_valid_request(history: Any, data: st.DataObject) -> None:
    messages, thinking = history
    system = [text("You are an agent.", cache_control=MARK)]
    fields: dict[str, Any] = {"system": system, "tools": TOOLS}
    if thinking:
        fields["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    parsed = parse(copy.deepcopy(messages), **fields)
    fixed = MESSAGES.fixed_tokens(parsed, COUNTER)
    window = data.draw(st.sampled_from([600, 1200, 2400, 4800]))
    policy = policies.Policy(
        reserved_output_tokens=100,
        protect_min_tokens=100,
        protect_recent_rounds=1,
        layers=tuple(data.draw(st.lists(st.sampled_from(LAYERS), min_size=1, unique=True))),
    )
    result = await policies.compact(
        parsed.messages,
        policies.Plan(),
        budget=policy.budget(window, None, None),
        policy=policy,
        counter=COUNTER,
        fixed_tokens=fixed,
    )
    entries = policies.render_entries(parsed.messages, result.plan)
    out = rendered(parsed, entries, breakpoints=data.draw(st.booleans()))
    try:
        FAKE.count(out)  # tool pairs, thinking signatures, at most 4 breakpoints in TTL order
    except AnthropicError as error:
        raise AssertionError(error.message) from None
    assert out["system"] == system and out["tools"] == TOOLS
    assert set(out) == set(orjson.loads(parsed.raw))  # no field added
    groups = [(index, items[0]) for index, items in view_groups(parsed, entries) if items]
    assert len(groups) == len(out["messages"])
    for (index, _), sent in zip(groups, out["messages"], strict=True):
        if index is None:
            continue
        native = parsed.items[parsed.spans[index].start]
        assert thinking_of(sent) == thinking_of(native)  # never edited
        members = [i for i, s in enumerate(parsed.spans) if s == parsed.spans[index]]
        shown = dict(entries)
        if all(shown.get(i) is parsed.messages[i] for i in members):
            assert without_added_marks(sent, native) == native
        client_marks_kept(native, sent)


def thinking_of(message: dict[str, Any]) -> list[Block]:
    content = message["content"]
    blocks = content if isinstance(content, list) else []
    return [b for b in blocks if b["type"] in ("thinking", "redacted_thinking")]


def without_added_marks(sent: dict[str, Any], native: dict[str, Any]) -> dict[str, Any]:
    """`sent` without the breakpoints the proxy added to it (native: the message received)."""
    if isinstance(native["content"], str):
        if isinstance(sent["content"], list):
            return {**sent, "content": sent["content"][0]["text"]}
        return sent
    blocks = [
        b if "cache_control" in n else {k: v for k, v in b.items() if k != "cache_control"}
        for b, n in zip(sent["content"], native["content"], strict=True)
    ]
    return {**sent, "content": blocks}


# --- a replayed turn reads what is new ------------------------------------------------------


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.data())
def test_the_split_reads_what_the_whole_body_path_reads(
    history: tuple[list[dict[str, Any]], bool], data: st.DataObject
) -> None:
    """Turn after turn of one history, as a client writes them (any spacing, keys written
    twice), most often its last body with messages added, or as it was: the messages known by
    their bytes and the canonical messages of the body known assembled, the new ones read, give
    what reading the whole body gives: the body, the canonical messages, where each comes from;
    each key is of its message's bytes and its place among that message's canonical ones;
    and no turn changes what an earlier one was given."""
    messages, _ = history
    dialect = Messages(split_from=0)
    # A cut drawn twice is a body sent again (nothing after the known one: its lists shared).
    cuts = sorted(data.draw(st.lists(st.integers(1, len(messages)), min_size=1, max_size=5)))
    space = data.draw(st.sampled_from(["", " ", "\n  "]))
    texts = [data.draw(written(message)) for message in messages]
    given: list[tuple[Parsed, Any]] = []
    for cut in cuts:
        if data.draw(st.integers(0, 3)):
            listed = f",{space}".join(texts[:cut])
            raw = f'{{"model": "claude-x",{space}"max_tokens": 64, "messages": [{listed}]}}'
        else:
            body = {"model": "claude-x", "max_tokens": 64, "messages": messages[:cut]}
            raw = data.draw(written(body))
        whole = dialect.parse_whole(raw.encode())
        known = dialect.known.bodies.find(raw.encode())
        kept = copy.deepcopy(None if known is None else known.folded)
        parsed = dialect.parse(raw.encode())
        if known is not None:
            assert known.folded == kept  # what it went on from is as it was
        assert parsed.body == whole.body == orjson.loads(raw)
        assert parsed.items == whole.items
        assert parsed.messages == whole.messages
        assert list(parsed.spans or ()) == list(whole.spans or ())
        for spans in (parsed.spans, whole.spans):  # with the native message of each, an array
            assert isinstance(spans, Spans)
            assert list(spans.starts) == [span.start for span in spans]
        sent = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])["messages"]
        native = [hash(bytes(m)) for m in msgspec.json.decode(sent, type=list[msgspec.Raw])]
        starts = [span.start for span in whole.spans or ()]
        places = [starts[:i].count(start) for i, start in enumerate(starts)]
        assert parsed.keys == [hash((native[j], n)) for j, n in zip(starts, places, strict=True)]
        rendered_alike(dialect, parsed, whole, data)
        given.append((parsed, copy.deepcopy((parsed.messages, parsed.spans, parsed.keys))))
    for parsed, then in given:
        assert (parsed.messages, parsed.spans, parsed.keys) == then


def rendered_alike(dialect: Messages, parsed: Parsed, whole: Parsed, data: st.DataObject) -> None:
    """A view of the split body (messages dropped and edited, a summary first or not, the
    proxy's breakpoints or not) is the body the whole-body path renders, and each message that
    goes out unchanged is the client's bytes of it."""
    shown = data.draw(st.lists(st.sampled_from("kde"), min_size=len(parsed.messages)))
    header = data.draw(st.sampled_from([[], [(None, {"role": "user", "content": "gist"})]]))
    marks = data.draw(st.booleans())

    def view(read: Parsed) -> list[tuple[int | None, Any]]:
        kept = zip(enumerate(read.messages), shown, strict=False)
        return [*header, *((i, {**m} if how == "e" else m) for (i, m), how in kept if how != "d")]

    out = dialect.render(parsed, view(parsed), marks)
    assert orjson.loads(out) == orjson.loads(dialect.render(whole, view(whole), marks))
    client = msgspec.json.decode(parsed.raw, type=dict[str, msgspec.Raw])["messages"]
    theirs = [bytes(m) for m in msgspec.json.decode(client, type=list[msgspec.Raw])]
    listed = msgspec.json.decode(out, type=dict[str, msgspec.Raw])["messages"]
    ours = [bytes(m) for m in msgspec.json.decode(listed, type=list[msgspec.Raw])]
    groups = [index for index, items in view_groups(parsed, view(parsed)) if items]
    assert len(groups) == len(ours)
    spans = parsed.spans or ()
    for index, sent in zip(groups, ours, strict=True):
        if index is None:
            continue
        native = spans[index].start
        members = [i for i, span in enumerate(spans) if span.start == native]
        untouched = all(shown[i] == "k" for i in members)
        if untouched and orjson.loads(sent) == parsed.items[native]:  # no breakpoint added
            assert sent == theirs[native]


def test_a_bad_block_in_a_new_message_is_the_whole_body_paths_400() -> None:
    """Known messages first: the split finds the bad block, the whole-body path names it."""
    dialect = Messages(split_from=0)
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    dialect.parse(orjson.dumps({"model": "m", "max_tokens": 9, "messages": good}))
    bad = [*good, {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]
    raw = orjson.dumps({"model": "m", "max_tokens": 9, "messages": bad})
    with pytest.raises(InvalidRequest) as whole:
        dialect.parse_whole(raw)
    with pytest.raises(InvalidRequest) as split:
        dialect.parse(raw)
    assert split.value.message == whole.value.message
    assert "messages.2.content.0" in split.value.message


def test_a_message_changed_by_a_byte_is_read_again() -> None:
    dialect = Messages(split_from=0)
    first = [{"role": "user", "content": [text("the first words")]}]
    changed = [{"role": "user", "content": [text("the first wordz")]}]
    for messages in (first, changed, first):
        raw = orjson.dumps({"model": "m", "max_tokens": 9, "messages": messages})
        assert dialect.parse(raw).messages == dialect.parse_whole(raw).messages
