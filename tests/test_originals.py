"""The kept originals: the same contract from the memory store and Redis (kept once, the oldest
out past a session's bytes and remembered as gone, one session's never another's), the memory
store's bound in all, and the handles and markers of the pure part (`policies.retrieval`)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.compress.marker import Marker
from policies.retrieval import GONE_LINE, excerpt, handle_of, marked
from proxy.config import StoredOriginals
from proxy.sessions.originals import MAX_ROUNDS, MemoryOriginals
from proxy.sessions.store import SessionStore
from tests.conftest import examples
from tests.test_store import MakeStore, make_store, new_key, prefix, redis  # noqa: F401

BOUNDS = StoredOriginals(session_bytes=100, total_bytes=250)


async def test_kept_once_and_the_oldest_out_past_the_sessions_bytes(
    make_store: MakeStore,  # noqa: F811 (the fixture of tests/test_store.py)
) -> None:
    store: SessionStore = make_store()
    originals = store.originals(BOUNDS)
    key, other = new_key(), new_key()
    await originals.add(key, {"oa": b"a" * 40, "ob": b"b" * 40})
    await originals.add(key, {"oa": b"changed", "oc": b"c" * 40})  # oa kept already: unchanged
    index = await originals.index(key)
    assert index.kept == ("ob", "oc") and index.gone == frozenset({"oa"})
    assert await originals.read(key, "ob") == b"b" * 40
    assert await originals.read(key, "oa") is None
    await originals.add(key, {"oa": b"again"})  # gone for good: never kept again
    assert await originals.read(key, "oa") is None
    assert await originals.read(other, "ob") is None and (await originals.index(other)).empty


async def test_the_last_hidden_rounds_are_kept(
    make_store: MakeStore,  # noqa: F811 (the fixture of tests/test_store.py)
) -> None:
    originals = make_store().originals(BOUNDS)
    key = new_key()
    for n in range(MAX_ROUNDS + 2):
        await originals.put_round(key, f"answer{n}", f"items{n}".encode())
    index = await originals.index(key)
    assert index.rounds == tuple(f"answer{n}" for n in range(2, MAX_ROUNDS + 2))
    assert await originals.read_round(key, "answer0") is None
    assert await originals.read_round(key, "answer2") == b"items2"
    assert await originals.read_round(new_key(), "answer2") is None


async def test_the_memory_store_counts_hidden_rounds_in_all() -> None:
    originals = MemoryOriginals(ttl_seconds=60, limits=BOUNDS)
    key = new_key()
    await originals.add(key, {"o1": b"x" * 90})
    await originals.put_round(key, "a", b"y" * 200)  # past 250 in all: the oldest goes
    index = await originals.index(key)
    assert index.kept == () and index.gone == {"o1"} and index.rounds == ("a",)


async def test_the_memory_store_is_bounded_in_all_and_expires() -> None:
    originals = MemoryOriginals(ttl_seconds=0.2, limits=BOUNDS)
    keys = [new_key() for _ in range(4)]
    for key in keys:
        await originals.add(key, {"o1": b"x" * 90})
    assert [bool((await originals.index(k)).kept) for k in keys] == [False, False, True, True]
    assert (await originals.index(keys[0])).gone == frozenset({"o1"})
    await asyncio.sleep(0.25)
    assert await originals.read(keys[-1], "o1") is None


contents = st.one_of(
    st.text(max_size=200),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=50)})),
)


@settings(max_examples=examples(200))
@given(contents)
def test_a_handle_is_its_contents_alone(content: object) -> None:
    handle = handle_of({"role": "tool", "content": content, "tool_call_id": "a"})
    assert handle == handle_of({"role": "tool", "content": content, "tool_call_id": "b"})
    assert len(handle) == 17 and handle.startswith("o")


@settings(max_examples=examples(200))
@given(st.text(min_size=1, max_size=80), st.booleans())
def test_a_marker_names_the_handle_or_says_it_is_gone(text: str, kept: bool) -> None:
    marker = Marker("log", 1000, "3 of 9 lines")
    shown = {"role": "tool", "content": marker.render() + "\n" + text}
    once = marked(shown, "o" + "1" * 16, kept=kept, tool_name="t")
    assert once == marked(shown, "o" + "1" * 16, kept=kept, tool_name="t")  # byte-stable
    parsed = Marker.parse(once["content"])
    assert parsed is not None and parsed.handle == ("o" + "1" * 16 if kept else None)
    assert once["content"].endswith(GONE_LINE) is (not kept)


@settings(max_examples=examples(300))
@given(st.lists(st.text(alphabet="ab ", max_size=30), min_size=1, max_size=40), st.data())
def test_an_excerpt_is_whole_lines_within_the_budget(lines: list[str], data: st.DataObject) -> None:
    text = "\n".join(lines)
    start = data.draw(st.integers(1, len(lines)))
    budget = data.draw(st.integers(100, 400))
    part = excerpt(text, start, None, budget)
    body = part.rsplit("\n[", 1)[0] if part.endswith("to go on]") else part
    assert len(body) <= budget
    assert text.split("\n")[start - 1 :][: body.count("\n") + 1] == body.split("\n")
