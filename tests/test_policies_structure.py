"""The building blocks of policies/: structure, hash chain, plan and view, counting."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import (
    Chain,
    Plan,
    Summary,
    canonical,
    current_turn,
    current_turn_start,
    image_tokens,
    media_tokens,
    render,
    render_entries,
    rounds,
    tool_blocks,
    tool_pair_problems,
)
from policies.client_context import left_out, outside_chain, outside_positions, superseded
from policies.plan import (
    ANCHOR_HEADING,
    DIGEST_HEADING,
    SUMMARY_HEADING,
    applied_edit,
    header_message,
)
from tests.conftest import examples
from tests.conversations import conversations, png_data_url

SYSTEM = {"role": "system", "content": "Be brief."}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str | None, *calls: str) -> dict:
    message: dict = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            for c in calls
        ]
    return message


def tool(call_id: str, text: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


LOOP = [
    SYSTEM,
    user("fix the bug"),
    assistant(None, "a"),
    tool("a"),
    assistant("next", "b", "c"),
    tool("c"),
    tool("b"),
]


# --- conversation structure ---------------------------------------------------------------


def test_rounds_start_at_user_messages() -> None:
    messages = [SYSTEM, assistant("hi"), user("a"), assistant("b"), user("c")]
    assert rounds(messages) == [range(2, 4), range(4, 5)]


def test_tool_blocks_hold_the_call_and_every_answer() -> None:
    assert tool_blocks(LOOP) == [range(2, 4), range(4, 7)]
    assert tool_blocks([assistant("x", "a"), user("no answer")]) == [range(0, 1)]


def test_current_turn_of_an_agent_loop_is_the_task_and_the_newest_block() -> None:
    assert current_turn_start(LOOP) == 4
    assert current_turn(LOOP) == [1, 4, 5, 6]


def test_current_turn_of_a_chat_is_the_last_user_message_and_after() -> None:
    messages = [SYSTEM, user("a"), assistant("b"), user("c"), SYSTEM]
    assert current_turn_start(messages) == 3
    assert current_turn(messages) == [3]


def test_without_a_user_message_everything_is_the_current_turn() -> None:
    messages = [SYSTEM, assistant("a"), assistant("b")]
    assert current_turn(messages) == [1, 2]
    assert current_turn([SYSTEM]) == []


def test_tool_pair_problems_name_the_openai_400_cases() -> None:
    assert tool_pair_problems(LOOP) == []
    assert tool_pair_problems([user("x"), tool("a")]) == [
        "message 1: tool message without a preceding tool call"
    ]
    unanswered = tool_pair_problems([assistant(None, "a", "b"), tool("a"), user("x")])
    assert unanswered == ["message 0: tool calls without answers ['b']"]
    assert tool_pair_problems([assistant(None, "a"), SYSTEM, tool("a")]) == [
        "message 0: tool calls without answers ['a']",
        "message 2: tool message without a preceding tool call",
    ]
    assert tool_pair_problems([assistant(None, "a"), tool("a"), tool("a")]) == [
        "message 2: tool message answers no open call ('a')"
    ]


@settings(max_examples=examples(100), deadline=None)
@given(conversations())
def test_generated_conversations_are_valid_requests(messages: list[dict]) -> None:
    assert tool_pair_problems(messages) == []
    turn = current_turn(messages)
    assert turn == sorted(turn)
    assert all(messages[i]["role"] != "system" for i in turn)


# --- hash chain ---------------------------------------------------------------------------


def test_canonical_form_ignores_sdk_echoes_and_null_fields() -> None:
    plain = assistant("hello")
    echoed = {**plain, "refusal": None, "annotations": [], "audio": None, "name": None}
    as_parts = {**plain, "content": [{"type": "text", "text": "hello"}]}
    assert canonical(plain) == canonical(echoed) == canonical(as_parts)
    assert canonical(assistant(None, "a")) == canonical({**assistant("", "a")})


def test_canonical_form_sees_what_the_model_sees() -> None:
    base = assistant("x", "a")
    changed_args = json.loads(json.dumps(base))
    changed_args["tool_calls"][0]["function"]["arguments"] = '{"k": 1}'
    image = {"type": "image_url", "image_url": {"url": "https://x.test/1.png"}}
    other = {"type": "image_url", "image_url": {"url": "https://x.test/2.png"}}
    forms = {
        canonical(base),
        canonical(changed_args),
        canonical(user("x")),
        canonical({**user("x"), "name": "bob"}),
        canonical(tool("a", "x")),
        canonical(tool("b", "x")),
        canonical({**user("x"), "content": [{"type": "text", "text": "x"}, image]}),
        canonical({**user("x"), "content": [{"type": "text", "text": "x"}, other]}),
    }
    assert len(forms) == 8


@settings(max_examples=examples(60), deadline=None)
@given(conversations(), st.data())
def test_chain_prefixes_identify_prefixes_without_system_messages(
    messages: list[dict], data
) -> None:
    hashes = _prefixes(messages)
    chain = [m for m in messages if m["role"] not in ("system", "developer")]
    assert len(hashes) == len(chain)
    assert len(set(hashes)) == len(hashes)  # cumulative: even equal messages differ
    cut = data.draw(st.integers(0, len(messages)))
    assert _prefixes(messages[:cut]) == hashes[: len(_prefixes(messages[:cut]))]
    other_system = [{**m, "content": "changed"} if m["role"] == "system" else m for m in messages]
    assert _prefixes(other_system) == hashes
    if chain:
        k = data.draw(st.integers(0, len(chain) - 1))
        edited = list(chain)
        edited[k] = {**edited[k], "content": "edited!"}
        again = _prefixes(edited)
        assert again[:k] == hashes[:k]
        assert all(a != b for a, b in zip(again[k:], hashes[k:], strict=True))


# --- plan and view --------------------------------------------------------------------------


CHAT = [
    SYSTEM,
    user("one"),
    assistant("two"),
    {"role": "developer", "content": "mid"},
    user("three"),
    assistant(None, "a"),
    tool("a", "big result"),
    user("four"),
]


def test_render_places_the_header_after_the_system_messages_of_the_evicted_part() -> None:
    plan = Plan(
        cut=2,
        summary=Summary("they talked", "llm"),
        edits={4: {**tool("a"), "content": "[cleared]"}},
        anchor_block="ORDER-1",
        covered=5,
    )
    view = render(CHAT, plan)
    header = header_message(plan.summary, plan.anchor_block)
    assert view == [SYSTEM, CHAT[3], header, CHAT[4], CHAT[5], plan.edits[4], CHAT[7]]
    assert header == {
        "role": "user",
        "content": f"{SUMMARY_HEADING}\nthey talked\n\n{ANCHOR_HEADING}\nORDER-1",
    }


def test_a_stored_edit_applies_to_the_message_as_it_is_sent_now() -> None:
    # A field the chain does not hash changed since the edit was stored: the view shows the
    # new value and only what the edit replaced (never a stored field brought back).
    old = {**tool("a", "big result"), "x_meta": {"v": 1}, "x_gone": 1}
    now = {**tool("a", "big result"), "x_meta": {"v": 2}}
    cleared = {**old, "content": "[cleared]"}
    assert applied_edit(cleared, now) == {**now, "content": "[cleared]"}
    assert applied_edit(cleared, old) is cleared  # nothing changed: the stored edit itself

    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{long}"}}
    sent = {"role": "assistant", "content": None, "tool_calls": [call]}
    truncated = {**sent, "tool_calls": [{**call, "function": {"name": "f", "arguments": "{lo"}}]}
    later = {**sent, "tool_calls": [{**call, "x_index": 0}], "x_meta": "new"}
    assert applied_edit(truncated, later) == {
        **later,
        "tool_calls": [{**call, "x_index": 0, "function": {"name": "f", "arguments": "{lo"}}],
    }
    text_only = {"role": "assistant", "content": "Let me look."}  # its calls dropped
    assert applied_edit(text_only, {**later, "content": "Let me look."}) == {
        "role": "assistant",
        "content": "Let me look.",
        "x_meta": "new",
    }

    parts = [{"type": "text", "text": "see", "cache_control": 1}, image("https://x.test/a.png")]
    media = {"role": "user", "content": parts}
    placeholder = {"type": "text", "text": "[image cleared]"}
    edit = {**media, "content": [parts[0], placeholder]}
    moved = {"role": "user", "content": [{"type": "text", "text": "see"}, parts[1]]}
    assert applied_edit(edit, moved)["content"] == [{"type": "text", "text": "see"}, placeholder]


def test_render_leaves_dropped_messages_out_and_new_messages_as_they_are() -> None:
    plan = Plan(cut=0, edits={3: None, 4: None}, covered=6)
    more = [*CHAT, assistant("five"), user("six")]
    assert render(more, plan) == [m for i, m in enumerate(more) if i not in (5, 6)]


def test_a_digest_and_an_anchor_block_alone_are_marked() -> None:
    digest = header_message(Summary("User requests:\n- x", "digest"), None, "system")
    assert digest == {"role": "system", "content": f"{DIGEST_HEADING}\nUser requests:\n- x"}
    anchors = header_message(None, "ORDER-1")
    assert anchors == {"role": "user", "content": f"{ANCHOR_HEADING}\nORDER-1"}
    assert render(CHAT, Plan(anchor_block="ORDER-1", covered=5))[1] == anchors


def test_a_plan_that_evicts_everything_ends_with_its_header() -> None:
    plan = Plan(cut=9, summary=Summary("all of it", "llm"), covered=5)
    assert render(CHAT, plan) == [SYSTEM, CHAT[3], header_message(plan.summary, None)]


@settings(max_examples=examples(60), deadline=None)
@given(conversations())
def test_the_empty_plan_renders_the_messages_unchanged(messages: list[dict]) -> None:
    assert render(messages, Plan()) == messages


def test_render_entries_say_where_each_message_of_the_view_comes_from() -> None:
    plan = Plan(
        cut=2,
        summary=Summary("they talked", "llm"),
        edits={4: {**tool("a"), "content": "[cleared]"}, 5: None},
        covered=6,
    )
    entries = render_entries(CHAT, plan)
    header = header_message(plan.summary, None)
    assert entries == [
        (0, SYSTEM),
        (3, CHAT[3]),
        (None, header),
        (4, CHAT[4]),
        (5, CHAT[5]),
        (6, plan.edits[4]),
    ]
    assert entries[3][1] is CHAT[4]  # an unedited message is the request's own object


@st.composite
def plans(draw: st.DrawFn, messages: list[dict]) -> Plan:
    """A plan over `messages`: any cut, summary and anchor block, edits of later positions
    (dropped, or their content replaced)."""
    chain = [m for m in messages if m["role"] not in ("system", "developer")]
    cut = draw(st.integers(0, len(chain) + 1))
    later = st.sampled_from(range(cut, len(chain))) if cut < len(chain) else st.nothing()
    positions = draw(st.lists(later, unique=True))
    edits = {p: draw(st.none() | st.just({**chain[p], "content": "[edit]"})) for p in positions}
    summary = draw(st.none() | st.just(Summary("s", "digest")))
    anchor_block = draw(st.none() | st.just("ORDER-1"))
    return Plan(
        cut=cut, summary=summary, edits=edits, anchor_block=anchor_block, covered=len(chain)
    )


@settings(max_examples=examples(100), deadline=None)
@given(conversations(), st.data())
def test_render_entries_point_at_the_messages_they_show(messages: list[dict], data) -> None:
    plan = data.draw(plans(messages))
    entries = render_entries(messages, plan, summary_role="system")
    assert [m for _, m in entries] == render(messages, plan, summary_role="system")
    indices = [i for i, _ in entries if i is not None]
    assert indices == sorted(set(indices))  # strictly increasing
    chain_position = {}
    for index, message in enumerate(messages):
        if message["role"] not in ("system", "developer"):
            chain_position[index] = len(chain_position)
    for index, message in entries:
        if index is None:
            continue
        position = chain_position.get(index)
        shown = messages[index] if position is None else plan.edits.get(position, messages[index])
        assert message is shown
    has_header = plan.summary is not None or plan.anchor_block is not None
    assert [i for i, _ in entries].count(None) == (1 if has_header else 0)


# Messages of every kind the view treats apart: outside the chain (system, developer, a
# client's context, two copies of one kind, a reminder in a text part) and in it.
KINDS = [
    SYSTEM,
    {"role": "developer", "content": "Use tabs."},
    user("<environment_context>cwd=/a</environment_context>"),
    user("<environment_context>cwd=/b</environment_context>"),
    {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}]},
    user("<environment_context> is what?"),
    assistant("sure"),
    tool("a"),
]


@st.composite
def any_plans(draw: st.DrawFn) -> tuple[list[dict], Plan]:
    """Messages of `KINDS` (copies: each its own object) and any plan over them: a task
    before the cut, edits before, after and past the chain, any `covered`."""
    messages = [dict(m) for m in draw(st.lists(st.sampled_from(KINDS), max_size=14))]
    length = len(Chain.of(messages))
    cut = draw(st.integers(0, length + 1))
    task = draw(st.none() | st.integers(0, cut - 1)) if cut else None
    edited = st.none() | st.just({"role": "tool", "tool_call_id": "a", "content": "[edit]"})
    edits = draw(st.dictionaries(st.integers(0, length + 1), edited, max_size=8))
    if task is not None and draw(st.booleans()):
        edits[task] = draw(edited)  # the task's own edit, shown with it
    summary = draw(st.none() | st.just(Summary("s", "llm")))
    anchors = draw(st.none() | st.just("ORDER-1"))
    covered = draw(st.integers(0, length + 1))
    plan = Plan(cut, summary, edits, anchors, covered, task=task)
    return messages, plan


def view_by_definition(messages: list[dict], plan: Plan) -> list[tuple[int | None, dict]]:
    """The view as `render_entries` defines it, a step per message."""
    header = header_message(plan.summary, plan.anchor_block)
    entries: list[tuple[int | None, dict]] = []
    position = 0
    for index, message in enumerate(messages):
        if outside_chain(message):
            entries.append((index, message))
            continue
        position += 1
        if position <= plan.cut and position - 1 != plan.task:
            continue  # evicted
        if header is not None and position > plan.cut:
            entries.append((None, header))
            header = None
        edit = plan.edits.get(position - 1, message)
        if edit is not None:
            entries.append((index, applied_edit(edit, message)))
    if header is not None:
        entries.append((None, header))
    copies = superseded(messages, outside_positions(messages), plan.covered)
    omitted = set(left_out(copies, plan.cut, plan.edits))
    return [entry for entry in entries if entry[0] not in omitted]


@settings(max_examples=examples(300), deadline=None)
@given(any_plans())
def test_render_entries_in_a_step_per_edit_make_the_view_a_step_per_message_makes(
    case: tuple[list[dict], Plan],
) -> None:
    """`render_entries` goes from edit to edit and takes the runs between them whole; the
    chain's own record of the messages outside it (`Chain.outside`) serves as well as
    finding them again."""
    messages, plan = case
    expected = view_by_definition(messages, plan)
    for outside in (None, Chain.of(messages).outside):
        entries = render_entries(messages, plan, outside=outside)
        assert entries == expected
        for (index, message), (_, want) in zip(entries, expected, strict=True):
            assert index is None or message is want or want is not messages[index]
        assert all(run for run in entries.runs if isinstance(run, range))  # never an empty one


@settings(max_examples=examples(100), deadline=None)
@given(any_plans(), any_plans())
def test_a_plan_makes_the_view_of_any_messages_it_is_applied_to_in_turn(
    case: tuple[list[dict], Plan], other: tuple[list[dict], Plan]
) -> None:
    """What a plan keeps of the views it made (`plan._edited_runs`) serves the messages it is
    applied to next only when theirs are in the same places outside the chain."""
    messages, plan = case
    for shown in (messages, other[0], messages):
        assert render_entries(shown, plan) == view_by_definition(shown, plan)


def test_plan_round_trips_through_json() -> None:
    plan = Plan(
        cut=3,
        summary=Summary("s", "digest"),
        edits={4: None, 7: tool("a", "[cleared]")},
        anchor_block="x",
        covered=9,
    )
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert Plan.from_dict(Plan().to_dict()) == Plan()
    tailed = Plan(cut=2, summary=Summary("s", "llm", "User requests:\n- x"), covered=3)
    assert Plan.from_dict(json.loads(json.dumps(tailed.to_dict()))) == tailed
    cut = Plan(cut=1, anchor_block="x", covered=2, anchors_truncated=True)
    assert Plan.from_dict(json.loads(json.dumps(cut.to_dict()))) == cut
    # A plan stored before the proxy recorded truncated anchors still loads.
    older = {k: v for k, v in plan.to_dict().items() if k != "anchors_truncated"}
    assert Plan.from_dict(older) == plan


@pytest.mark.parametrize(
    "data",
    [
        {},
        {
            "cut": 1,
            "summary": {"text": "s", "kind": "poem"},
            "edits": {},
            "anchor_block": None,
            "covered": 1,
        },
        {"cut": 1, "summary": None, "edits": {"1": "text"}, "anchor_block": None, "covered": 1},
        {"cut": 1, "summary": None, "edits": [], "anchor_block": None, "covered": 1},
        {"cut": 1, "summary": None, "edits": {}, "anchor_block": 3, "covered": 1},
        {
            "cut": 1,
            "summary": {"text": "s", "kind": "digest", "tail": "t"},
            "edits": {},
            "anchor_block": None,
            "covered": 1,
        },
        {
            "cut": 1,
            "summary": None,
            "edits": {},
            "anchor_block": None,
            "covered": 1,
            "anchors_truncated": "yes",
        },
    ],
)
def test_plan_from_dict_rejects_what_is_not_a_plan(data: dict) -> None:
    with pytest.raises(ValueError, match="not a plan"):
        Plan.from_dict(data)


# --- counting of media ----------------------------------------------------------------------


def image(url: str, detail: str | None = None) -> dict:
    payload = {"url": url} | ({"detail": detail} if detail else {})
    return {"type": "image_url", "image_url": payload}


def data_url(kind: str, data: bytes) -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def test_image_tokens_follow_openais_published_examples() -> None:
    assert image_tokens(1024, 1024) == 765
    assert image_tokens(2048, 4096) == 1105
    assert image_tokens(4096, 8192) == 1105
    assert image_tokens(100, 100) == 255


def test_image_size_is_read_from_data_urls() -> None:
    gif = b"GIF89a" + struct.pack("<HH", 2048, 4096) + b"\0" * 8
    jpeg = (
        b"\xff\xd8"
        + b"\xff\xe0\x00\x04\0\0"
        + b"\xff\xc0\x00\x11\x08"
        + struct.pack(">HH", 4096, 2048)
    )
    webp = (
        b"RIFF\0\0\0\0WEBPVP8X"
        + b"\0" * 8
        + (2047).to_bytes(3, "little")
        + (4095).to_bytes(3, "little")
    )
    assert media_tokens(image(png_data_url(2048, 4096))) == 1105
    assert media_tokens(image(data_url("gif", gif))) == 1105
    assert media_tokens(image(data_url("jpeg", jpeg + b"\0" * 16))) == 1105
    assert media_tokens(image(data_url("webp", webp))) == 1105
    assert media_tokens(image(png_data_url(100, 100))) == 255


def test_image_of_unknown_size_and_low_detail() -> None:
    assert media_tokens(image("https://x.test/a.png")) == 765
    assert media_tokens(image(data_url("png", b"not an image at all"))) == 765
    assert media_tokens(image(png_data_url(4096, 4096), "low")) == 85


def test_documents_and_audio_are_estimated_from_their_size() -> None:
    pdf = "data:application/pdf;base64," + base64.b64encode(b"\0" * 80_000).decode()
    assert media_tokens({"type": "file", "file": {"file_data": pdf}}) == 10_000
    assert media_tokens({"type": "file", "file": {"file_id": "file-1"}}) == 765
    audio = base64.b64encode(b"\0" * 160_000).decode()
    assert media_tokens({"type": "input_audio", "input_audio": {"data": audio}}) == 100
    assert media_tokens({"type": "text", "text": "hello"}) == 0


def _prefixes(messages: list[dict]) -> list[str]:
    chain = Chain.of(messages)
    return [chain.prefix(n) for n in range(1, len(chain) + 1)]
