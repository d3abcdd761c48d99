"""The split read of a chat body (proxy/dialects/raw_items.py): what it gives is what reading
the whole body gives, an untouched message goes upstream as the client's own bytes, the memo
of messages already read never answers for other bytes, and a body it cannot read gets the
whole-body path's 400."""

from __future__ import annotations

import gc
import json
import tracemalloc
from array import array
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects.anthropic.breakpoints import BREAKPOINT
from proxy.dialects.anthropic.messages import Messages
from proxy.dialects.anthropic.request import _assembled, _canonical
from proxy.dialects.item_bytes import ItemBytes
from proxy.dialects.openai.chat import Chat
from proxy.dialects.openai.responses import _mapped
from proxy.dialects.raw_items import SPLIT_FROM, KnownBodies, KnownItems
from proxy.errors import InvalidRequest
from proxy.memo import content_keys
from tests.conftest import examples

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)  # past 64 bits orjson reads a float: so must the split
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
parts = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=12)})
calls = st.fixed_dictionaries(
    {
        "id": st.text(max_size=6),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.text(max_size=6), "arguments": st.text(max_size=12)}
        ),
    }
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "x"])},
    optional={
        "content": st.none() | st.text(max_size=20) | st.lists(parts, max_size=2),
        "tool_calls": st.lists(calls, max_size=2),
        "tool_call_id": st.text(max_size=6),
        "name": st.text(max_size=6),
        "x_extra": values,
    },
)


@st.composite
def written(draw: st.DrawFn, value: Any) -> str:
    """`value` as JSON text as a client may write it: any spacing, escaped or raw non-ASCII,
    and now and then an object key written twice (the last one counts, as for orjson)."""
    space = draw(st.sampled_from(["", " ", "\n  ", "\t"]))
    if isinstance(value, dict):
        fields = []
        for key, item in value.items():
            if draw(st.integers(0, 9)) == 0:
                fields.append(f"{json.dumps(key)}:{space}{json.dumps(draw(values))}")
            fields.append(f"{json.dumps(key)}:{space}{draw(written(item))}")
        return "{" + space + f",{space}".join(fields) + space + "}"
    if isinstance(value, list):
        return "[" + space + f",{space}".join(draw(written(item)) for item in value) + "]"
    return json.dumps(value, ensure_ascii=draw(st.booleans()))


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    body = {"model": "gpt-4o", "messages": draw(st.lists(messages, max_size=6))}
    body.update(
        draw(st.dictionaries(st.sampled_from(["stream", "metadata", "tools", "user"]), values))
    )
    return draw(written(body)).encode()


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(bodies(), min_size=1, max_size=4))
def test_the_split_reads_what_the_whole_body_path_reads(raws: list[bytes]) -> None:
    chat = Chat(split_from=0)
    for raw in raws:
        try:
            whole = chat.parse_whole(raw)
        except InvalidRequest as refused:
            with pytest.raises(InvalidRequest) as caught:
                chat.parse(raw)
            assert caught.value.message == refused.message
            continue
        split = chat.known.split(raw, "messages")
        assert split is not None
        parsed = chat.parse(raw)
        assert parsed.body == whole.body == orjson.loads(raw)
        # The same bytes, fields in the client's order: what goes upstream does not depend on
        # which path read the body (a prompt cache keys on those bytes).
        assert orjson.dumps(parsed.body) == orjson.dumps(whole.body)
        assert parsed.messages == whole.messages
        assert (parsed.model, parsed.stream, parsed.max_output) == (
            whole.model,
            whole.stream,
            whole.max_output,
        )
        # Untouched, every message goes upstream as the client's bytes of it.
        assert parsed.raw_items is not None
        forwarded = chat.body_with(parsed, list(parsed.raw_items))
        assert orjson.loads(forwarded) == orjson.loads(raw)
        sent = msgspec.json.decode(forwarded, type=dict[str, msgspec.Raw])["messages"]
        spans = [bytes(span) for span in msgspec.json.decode(sent, type=list[msgspec.Raw])]
        assert spans == list(parsed.raw_items) == list(split.raw)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.lists(messages, min_size=1, max_size=4), min_size=1, max_size=8),
    st.data(),
    st.integers(1, 8),
)
def test_the_memo_never_answers_for_other_bytes(
    turns: list[list[dict[str, Any]]], data: st.DataObject, size: int
) -> None:
    """Messages resent, changed by a byte, spaced otherwise, through a memo small enough to
    evict: each is always what its own bytes say."""
    known = KnownItems(
        lambda item: isinstance(item, dict), size=size, max_bytes=64 * size, min_bytes=0
    )
    history: list[dict[str, Any]] = []
    for turn in turns:
        history += turn
        raw = data.draw(written({"model": "m", "messages": history})).encode()
        split = known.split(raw, "messages")
        assert split is not None
        assert split.items == [orjson.loads(span) for span in split.raw]
        assert split.items == orjson.loads(raw)["messages"]
        assert split.keys == [hash(span) for span in split.raw]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "\xff"}]}',  # not UTF-8
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',  # lone half
        b'{"model": "m", "messages": [{"role": "user"}], "x": "\xff"}',
        b'{"model": "m", "messages": [{"role": "user"}, 3]}',  # not an object
        b'{"model": "m", "messages": [{"role": "user"}, {"role": 3}]}',
        b'{"model": "m", "messages": [{"role": "user", "content": 3}]}',
        b'{"model": "m", "messages": {"role": "user"}}',
        b'{"model": "m", "messages": [{"role": "user"}],}',
        b'{"model": "", "messages": []}',
        b'{"messages": []}',
        b'[{"model": "m", "messages": []}]',
        b'{"model": "m", "messages": [{"role": "user", "content": '
        + b"[" * 98
        + b"]" * 98
        + b"}]}",
        b'{"model": "m", "messages": [], "x": ' + b"[" * 100 + b"]" * 100 + b"}",
        b'{"model": "m", "messages": [], "x": ' + b"[" * 2000 + b"]" * 2000 + b"}",
        b'{"model": "m", "messages": [], "max_tokens": "1"}',
    ],
)
def test_a_body_the_split_refuses_gets_the_whole_body_path_400(raw: bytes) -> None:
    chat = Chat(split_from=0)
    seen = b'{"model": "m", "messages": [{"role": "user"}, {"role": "user", "content": "hi"}]}'
    chat.parse(seen)  # its messages are known: refusing the rest must not depend on it
    with pytest.raises(InvalidRequest) as whole:
        chat.parse_whole(raw)
    with pytest.raises(InvalidRequest) as split:
        chat.parse(raw)
    assert split.value.message == whole.value.message
    assert split.value.param == whole.value.param


def test_keys_of_a_split_body_are_the_hashes_of_the_bytes_of_its_messages() -> None:
    """Not content_keys (a dumps of each message): the split never serialises what it reads."""
    chat = Chat(split_from=0)
    raw = b'{"model": "m", "messages": [{"role": "user",  "content": "hi"}]}'
    parsed = chat.parse(raw)
    assert parsed.keys == [hash(b'{"role": "user",  "content": "hi"}')]
    assert parsed.keys != content_keys(parsed.messages)


def same_reading(chat: Chat, raw: bytes) -> None:
    """`chat.parse(raw)` is what the whole-body path makes of it, or the same 400."""
    try:
        whole = chat.parse_whole(raw)
    except InvalidRequest as refused:
        with pytest.raises(InvalidRequest) as caught:
            chat.parse(raw)
        assert (caught.value.message, caught.value.param) == (refused.message, refused.param)
        return
    parsed = chat.parse(raw)
    assert parsed.body == whole.body == orjson.loads(raw)
    assert orjson.dumps(parsed.body) == orjson.dumps(whole.body)
    assert parsed.messages == whole.messages
    assert parsed.raw_items is not None
    forwarded = chat.body_with(parsed, list(parsed.raw_items))
    sent = msgspec.json.decode(forwarded, type=dict[str, msgspec.Raw])["messages"]
    assert [bytes(span) for span in msgspec.json.decode(sent, type=list[msgspec.Raw])] == list(
        parsed.raw_items
    )
    assert parsed.keys == [hash(span) for span in parsed.raw_items]


@settings(max_examples=examples(150), deadline=None)
@given(
    st.tuples(
        st.lists(messages, min_size=1, max_size=3),
        st.lists(st.lists(messages, max_size=3), min_size=1, max_size=5),  # none: sent again
    ).map(lambda turns: [turns[0], *turns[1]]),
    st.sampled_from([(",", ":"), (", ", ": ")]),
    st.booleans(),
    st.lists(st.dictionaries(st.sampled_from(["stream", "user", "max_tokens"]), scalars)),
    st.sampled_from([8 << 20, 300]),
)
def test_a_next_turn_is_read_from_where_the_last_body_ended(
    turns: list[list[dict[str, Any]]],
    separators: tuple[str, str],
    ascii_only: bool,
    after: list[dict[str, Any]],
    max_bytes: int,
) -> None:
    """A client resends its history with new messages at the end, or none (and fields after
    them that may change): from the second turn on only what follows the known body is read,
    and the result is the whole-body path's; the bodies kept stay within their bound (or the
    one read last, when it alone is larger)."""
    chat = Chat(split_from=0)
    chat.known.bodies = KnownBodies(head=16, max_bytes=max_bytes)
    history: list[dict[str, Any]] = []
    last = None
    for turn, extra in zip(turns, after + [{}] * len(turns), strict=False):
        seen = len(history)
        history += turn
        body = {"model": "gpt-4o", "messages": history, **extra}
        raw = json.dumps(body, separators=separators, ensure_ascii=ascii_only).encode()
        known = chat.known.bodies.find(raw)
        if seen:
            assert known is not None
            assert known.items == orjson.loads(raw)["messages"][:seen]
        same_reading(chat, raw)
        last = chat.known.bodies.find(raw + b" ")
        assert last is not None
        assert chat.known.bodies.held <= max(max_bytes, last.size)


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.lists(messages, max_size=3)), min_size=1),
    st.sampled_from([8 << 20, 400]),
)
def test_a_body_looked_up_again_is_found_as_by_its_bytes(
    turns: list[tuple[int, list[dict[str, Any]]]], max_bytes: int
) -> None:
    """`KnownBodies.find` keeps what it found of the body it looked up last (by identity):
    the same as the bytes of that body say, before it is read and after, whatever the bodies
    of other sessions that begin alike do meanwhile (in bodies few enough to be dropped)."""
    chat = Chat(split_from=0)
    bodies = chat.known.bodies = KnownBodies(head=16, max_bytes=max_bytes)
    histories: list[list[dict[str, Any]]] = [[], [], []]
    sent: list[bytes] = []
    for session, turn in turns:
        histories[session] += turn
        raw = json.dumps({"model": "gpt-4o", "messages": histories[session]}).encode()
        assert bodies.find(raw) is bodies.find(bytes(bytearray(raw)))
        same_reading(chat, raw)
        for body in (raw, *sent[-3:], raw):
            assert bodies.find(body) is bodies.find(bytes(bytearray(body)))
            assert bodies.find(body) is bodies.find(body)
        sent.append(raw)


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=1, max_size=3), min_size=2, max_size=5),
    st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_the_split_counts_the_breakpoints_of_the_whole_body_a_turn_at_a_time(
    turns: list[list[bool]], automatic: list[bool]
) -> None:
    """The Messages split counts the client's breakpoints (`cache_control` keys in its bytes)
    in what a known body held and in what follows it: the count of the whole body, however
    many the new messages or the fields after them hold, and for the same body sent again."""
    dialect = Messages(split_from=0)
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": "Be brief.", "cache_control": mark}]
    history: list[dict[str, Any]] = []
    for turn, automatic_caching in zip(turns, automatic, strict=False):
        for marked in turn:
            block = {"type": "text", "text": f"message {len(history)}"}
            role = "assistant" if len(history) % 2 else "user"
            history.append(
                {"role": role, "content": [{**block, "cache_control": mark}] if marked else [block]}
            )
        body = {"model": "claude-sonnet-4-5", "system": system, "messages": history}
        body |= {"max_tokens": 99, **({"cache_control": mark} if automatic_caching else {})}
        raw = orjson.dumps(body)
        for _ in range(2):
            parsed = dialect.parse(raw)
            assert parsed.raw_items is not None  # split, not read whole
            assert parsed.marks == raw.count(BREAKPOINT)


LAST = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 300 + b'"}'


@pytest.mark.parametrize(
    "tail",
    [
        b"]}",  # the same body again
        b', {"role": "assistant", "content": "y"}]}',
        b' ,\n {"role": "assistant"} ] , "stream": true}',
        b", ]}",  # a trailing comma
        b", , {}]}",
        b"]",  # cut off
        b"]} x",  # something after the body
        b', {"role": "user"}], "messages": [{"role": "user"}]}',  # named again: the last wins
        b', {"role": "user"}], "": 1}',
        b', {"role": "user", "content": "\xff"}]}',  # not UTF-8
        b', {"role": "user", "content": "\\ud800"}]}',
        b', {"role": 3}]}',
        b', {"role": "user", "content": ' + b"[" * 98 + b"]" * 98 + b"}]}",  # too deep
        b', {"role": "user"}], "x": ' + b"[" * 100 + b"]" * 100 + b"}",
        b', {"role": "user"}], "model": ""}',  # the model named again, empty
        b', {"role": "user"}], "max_tokens": "2"}',
        b"\t]\r}",
        b"]\x0b}",  # not JSON whitespace
    ],
)
def test_what_follows_a_known_body_is_read_as_the_whole_body_path_reads_it(tail: bytes) -> None:
    chat = Chat(split_from=0)
    chat.parse(LAST + b"]}")
    assert chat.known.bodies.find(LAST + tail) is not None
    same_reading(chat, LAST + tail)


@pytest.mark.parametrize("place", ["before", "after"])
def test_a_body_that_holds_its_conversation_twice_is_read_as_the_whole_body_path_reads_it(
    place: str,
) -> None:
    """The same array of messages in another field too: where the conversation is cannot be
    told from its bytes, and the next turn is read all the same."""
    chat = Chat(split_from=0)
    history = [{"role": "user", "content": "x" * 300}]
    for turn in range(3):
        array = json.dumps(history)
        fields = [f'"x": {array}', f'"messages": {array}', '"model": "m"']
        raw = ("{" + ", ".join(fields if place == "before" else fields[::-1]) + "}").encode()
        same_reading(chat, raw)
        history.append({"role": "assistant", "content": f"step {turn}"})


def test_an_empty_string_after_a_known_body_is_read_from_where_it_ended() -> None:
    """Only a field named "" (the split's stand-in name) sends the rest to be read whole."""
    chat = Chat(split_from=0)
    chat.parse(LAST + b"]}")
    reply = LAST + b', {"role": "assistant", "content": ""}'
    same_reading(chat, reply + b'], "user": ""}')
    known = chat.known.bodies.find(reply + b"]}")
    assert known is not None and known.prefix == reply
    same_reading(chat, reply + b', {"role": "user"}], "" : 1}')


def test_a_split_body_keeps_its_fields_in_the_clients_order() -> None:
    """The conversation stays where the client put it, read whole or from a known body."""
    chat = Chat(split_from=0)
    first = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 300 + b'"}'
    turns = (first + b'],"temperature":1.0}', first + b',{"role":"user"}],"top_p":1}')
    for turn, raw in enumerate(turns):
        assert (chat.known.bodies.find(raw) is not None) == (turn > 0)
        parsed = chat.parse(raw)
        assert list(parsed.body) == list(orjson.loads(raw))
        assert orjson.dumps(parsed.body) == orjson.dumps(chat.parse_whole(raw).body)


def _call(b: int, i: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "tool_calls": [
            {
                "id": f"call {b}.{i}",
                "type": "function",
                "function": {"name": "read", "arguments": '{"path": "a.py"}'},
            }
        ],
    }


def _function_call(b: int, i: int) -> dict[str, Any]:
    if i % 2:
        return {"type": "function_call_output", "call_id": f"c{b}.{i - 1}", "output": "ok " * 9}
    return {"type": "function_call", "call_id": f"c{b}.{i}", "name": "read", "arguments": "{}"}


def _tool_use(b: int, i: int) -> dict[str, Any]:
    if i % 2:
        result = {"type": "tool_result", "tool_use_id": f"t{b}.{i - 1}", "content": "ok " * 9}
        return {"role": "user", "content": [result]}
    use = {"type": "tool_use", "id": f"t{b}.{i}", "name": "read", "input": {"path": "a.py"}}
    return {"role": "assistant", "content": [use]}


def _text(b: int, i: int) -> dict[str, Any]:
    return {"role": "user", "content": f"{b}.{i} " + "lorem ipsum " * 100}


def _short(b: int, i: int) -> dict[str, Any]:
    return {"role": "user", "content": f"message {b}.{i}"}


def _reasoning(b: int, i: int) -> dict[str, Any]:
    return {"type": "reasoning", "summary": [], "encrypted_content": f"{b}.{i}" + "x" * 400}


def _parts(b: int, i: int) -> dict[str, Any]:
    """A message of many small parts: what its JSON takes decoded is far more than its bytes."""
    parts = [{"type": "text", "text": f"{b}.{i}.{k}"} for k in range(50)]
    return {"role": "user", "content": parts}


def _json_text(b: int, i: int) -> dict[str, Any]:
    """Text that is JSON, as tools often answer: its quotes are escaped, bytes of a string."""
    return {"role": "user", "content": f"{b}.{i} " + '{"key": "value", "n": "x"} ' * 40}


def _input_parts(b: int, i: int) -> dict[str, Any]:
    parts = [{"type": "input_text", "text": f"{b}.{i}.{k}"} for k in range(50)]
    return {"type": "message", "role": "user", "content": parts}


# What each dialect makes of the items it keeps: nothing (chat), their canonical messages
# folded (the Responses API's), or derived from each and assembled (Anthropic's).
_MADE: dict[str, dict[str, Any]] = {
    "chat": {},
    "responses": {"fold": _mapped},
    "messages": {"derive": _canonical, "fold": _assembled},
}


@pytest.mark.parametrize(
    ("dialect", "message"),
    [
        *(("chat", make) for make in (_short, _text, _call, _parts, _json_text)),
        *(("responses", make) for make in (_short, _text, _function_call, _reasoning)),
        *(("responses", make) for make in (_input_parts, _json_text)),
        *(("messages", make) for make in (_short, _text, _tool_use, _parts, _json_text)),
    ],
)
def test_the_bodies_kept_take_about_their_bound_in_memory(dialect: str, message: Any) -> None:
    """What `held` counts is what the bodies kept take (tracemalloc): their bytes, where each
    item is in them, the items decoded (kept alive even when the memo drops them) and what the
    dialect made of them, within a factor of 1.25 over and 1.5 under. (Numbers and lists
    nested deep take up to 3 times the count: their JSON has no quotes to count.)"""
    bound = 1 << 20
    per_body = 20 if message in (_parts, _input_parts) else 200
    gc.collect()
    tracemalloc.start()
    try:
        known = KnownItems(
            lambda item: isinstance(item, dict), size=2, max_bytes=64, **_MADE[dialect]
        )
        known.bodies = KnownBodies(max_bytes=bound)
        start = tracemalloc.get_traced_memory()[0]
        for body in range(60):
            items = [message(body, i) for i in range(per_body)]
            assert known.split(orjson.dumps({"model": "m", "items": items}), "items")
        del items
        gc.collect()
        taken = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    held = known.bodies.held
    assert bound // 2 <= held <= bound
    assert held / 1.5 <= taken <= 1.25 * held


@given(
    st.lists(st.binary(min_size=1, max_size=8), max_size=6),
    st.lists(st.binary(min_size=1, max_size=8), max_size=3),
    st.integers(-12, 12),
    st.slices(12),
)
def test_the_bytes_cut_from_a_known_body_are_a_list_of_them_and_runs_of_them(
    known: list[bytes], after: list[bytes], index: int, part: slice
) -> None:
    """The items of a known body are cut from its bytes only when asked for: whatever is
    asked, the answer is the list's."""
    prefix, offsets = b"", array("Q")
    for span in known:
        prefix += b", "
        offsets.extend((len(prefix), len(prefix) + len(span)))
        prefix += span
    cut, listed = ItemBytes(prefix, offsets, after), known + after
    assert len(cut) == len(listed) and list(cut) == listed and cut[part] == listed[part]
    # A run: the known items' bytes in one piece, with what is between them; the others each.
    start, stop, _ = slice(part.start, part.stop).indices(len(listed))
    end = min(stop, len(known))
    joined = [b", ".join(known[start:end])] if start < end else []
    assert cut.run(start, stop) == joined + listed[max(start, len(known)) : stop]
    if -len(listed) <= index < len(listed):
        assert cut[index] == listed[index]
    else:
        with pytest.raises(IndexError):
            cut[index]


def test_a_short_body_is_read_whole_and_a_longer_one_split() -> None:
    """Under SPLIT_FROM bytes a body is never known again and a parse costs less than a
    split: it takes the whole-body path (no keys of its bytes); from there on, the split."""
    chat = Chat()
    short = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    assert len(short) < SPLIT_FROM
    assert chat.parse(short).keys is None
    text = "x" * SPLIT_FROM
    longer = b'{"model": "m", "messages": [{"role": "user", "content": "%s"}]}' % text.encode()
    parsed = chat.parse(longer)
    assert parsed.keys == [hash(b'{"role": "user", "content": "%s"}' % text.encode())]
    assert parsed.body == chat.parse_whole(longer).body
