"""What a replayed plan says and shows: the anchors it could not keep are reported on every
turn built from it, and its edits apply to the messages as the client sends them now."""

from __future__ import annotations

import json

from tests.harness import harness

ANCHOR = r"ORDER-\d{4}"


def test_anchors_cut_at_a_compaction_are_reported_on_every_replayed_turn() -> None:
    # A block too small for even one anchor: fitting wins, and the plan remembers it.
    policy = {"anchors": [ANCHOR], "anchor_block_max_tokens": 12}
    with harness(policies={"default": policy}) as h:
        chat = h.conversation()
        headers = chat.until("compacted")
        assert headers["x-compaction-anchors"] == "truncated"
        for _ in range(3):
            headers = chat.say()
            assert headers["x-compaction-action"] == "replayed"
            assert headers["x-compaction-anchors"] == "truncated"
        inspect = h.admin("GET", f"/admin/sessions/{chat.key}").json()
        assert inspect["branches"][0]["plan"]["anchors_truncated"] is True


def test_anchors_that_fit_are_not_reported() -> None:
    with harness(policies={"default": {"anchors": [ANCHOR]}}) as h:
        chat = h.conversation()
        assert "x-compaction-anchors" not in chat.until("compacted")
        assert "x-compaction-anchors" not in chat.say()
        assert h.state(chat.key).branches[0].plan.anchors_truncated is False


def tool_round(turn: int, size: int) -> list[dict]:
    call = {
        "id": f"call_{turn}",
        "type": "function",
        "function": {"name": "read_file", "arguments": json.dumps({"path": f"f{turn}.py"})},
    }
    return [
        {"role": "user", "content": f"Read file {turn}."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": f"contents of f{turn}.py: " + "x = 1\n" * size,
            "x_meta": {"version": 1},
        },
        {"role": "assistant", "content": f"File {turn} read."},
    ]


def test_a_replayed_edit_takes_the_fields_the_client_sends_now() -> None:
    layers = [{"clear_tool_results": {"keep_last": 1}}]
    with harness(policies={"default": {"layers": layers}}) as h:
        messages: list[dict] = [{"role": "system", "content": "You read files."}]
        for turn in range(6):
            messages += tool_round(turn, 150)
        chat = h.conversation()
        chat.messages = messages
        assert chat.say("Go on.")["x-compaction-action"] == "compacted"
        tools = [m for m in h.forwarded()[-1] if m["role"] == "tool"]
        cleared = [m for m in tools if "contents of" not in m["content"]]
        assert cleared and all(m["x_meta"] == {"version": 1} for m in cleared)

        # The client updates a field the proxy does not hash, on every tool message.
        for message in chat.messages:
            if message["role"] == "tool":
                message["x_meta"] = {"version": 2}
        assert chat.say("And now?")["x-compaction-action"] == "replayed"
        tools = [m for m in h.forwarded()[-1] if m["role"] == "tool"]
        assert [m["x_meta"] for m in tools] == [{"version": 2}] * len(tools)
        replayed = [m for m in tools if "contents of" not in m["content"]]
        assert [m["content"] for m in replayed] == [m["content"] for m in cleared]
