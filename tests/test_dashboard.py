"""The dashboard's page and data endpoints over HTTP (the page itself in a browser is
tests/test_dashboard_browser.py): on with the admin API, behind its token or open on loopback
with the checks that keep other sites out; the list of recent sessions and one session's
turns, plan and summary; the turns' figures kept without a store write a turn, and written
for the other replicas within `write_seconds`."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

import policies
from policies.plan import SUMMARY_HEADING
from policies.summary import Summary
from proxy.config import Auth
from proxy.server.session_view import plan_words
from proxy.server.tenants import Tenants
from tests.harness import ADMIN_TOKEN, Conversation, Harness, harness
from tests.servers import proxy_server
from tests.test_calibration import ESTIMATED, cjk_turn

API = "/admin/dashboard/api/sessions"
OWN = {"x-compaction-dashboard": "1"}


def tenant(api_key: str) -> str:
    return Tenants(Auth()).tenant({"authorization": f"Bearer {api_key}"})


def data(h: Harness, path: str = "", server: int = 0, **params: Any) -> Any:
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    response = httpx.get(h.servers[server].url + API + path, headers=headers, params=params)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    return response.json()


def stored_turns(h: Harness, key: str) -> int:
    """The turns the session's record counts (beside its state)."""
    return int(h.redis.hget(h.state_key(key), "n") or 0)


def no_cors(response: httpx.Response) -> bool:
    return not any(name.startswith("access-control-") for name in response.headers)


def test_the_dashboard_is_off_without_the_admin_api() -> None:
    with harness(admin={"token": None}) as h:
        chat = h.conversation()
        chat.say()
        assert h.servers[0].server.config.app.state.proxy.sessions.turns is None
        for path in ("/admin/dashboard", API, f"{API}/{chat.key}"):
            assert httpx.get(h.url + path, headers=OWN).status_code == 404


def test_the_dashboard_can_be_turned_off() -> None:
    with harness(admin={"dashboard": {"enabled": False}}) as h:
        assert httpx.get(h.url + "/admin/dashboard").status_code == 404
        assert h.admin("GET", API).status_code == 404
        assert h.servers[0].server.config.app.state.proxy.sessions.turns is None


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Bearer {ADMIN_TOKEN}x"])
def test_the_data_wants_the_admin_token(authorization: str | None) -> None:
    with harness() as h:
        chat = h.conversation()
        chat.say()
        headers = {} if authorization is None else {"authorization": authorization}
        for method, path in [
            ("GET", API),
            ("GET", f"{API}/{chat.key}"),
            ("POST", f"{API}/{chat.key}/compact"),
            ("DELETE", f"{API}/{chat.key}"),
        ]:
            response = httpx.request(method, h.url + path, headers={**headers, **OWN})
            assert response.status_code == 401
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        assert h.state(chat.key).pending is None


def test_the_page_holds_no_data_and_lets_in_only_its_own_script() -> None:
    with harness() as h:
        page = httpx.get(h.url + "/admin/dashboard")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'sha256-" in policy
        assert "frame-ancestors 'none'" in policy and page.headers["x-frame-options"] == "DENY"
        assert b"<script>" in page.content and b"src=" not in page.content  # nothing fetched
        assert b"http://" not in page.content.replace(b"http://www.w3.org/2000/svg", b"")
        assert no_cors(page)


def test_recent_sessions_newest_first_with_their_figures_and_by_tenant() -> None:
    with harness(admin={"dashboard": {"write_seconds": 0.2}}) as h:
        alice = h.conversation("a", api_key="sk-alice")
        alice.until("compacted")
        alice.say()
        bob = h.conversation("b", api_key="sk-bob")
        bob.say()
        h.wait_for(lambda: data(h)["sessions"][1]["version"] == h.version(alice.key) > 0)
        found = data(h)
        assert [s["key"] for s in found["sessions"]] == [bob.key, alice.key]
        assert found["tenants"] == sorted([tenant("sk-alice"), tenant("sk-bob")])
        row = found["sessions"][1]
        assert row["tenant"] == tenant("sk-alice")
        assert (row["api"], row["model"], row["policy"]) == ("chat", "gpt-4", "default")
        assert row["turns"] == alice.turns and row["compactions"] == 1
        assert row["action"] == "replayed" and row["sent"] > row["forwarded"] > 0
        assert row["saved"] > 0 and row["cache_read_share"] == 0.0
        assert row["store"] == "ok"
        only = data(h, tenant=tenant("sk-bob"))
        assert [s["key"] for s in only["sessions"]] == [bob.key]
        assert "SUMMARY" not in str(found)  # no text in the list


def test_a_turn_is_shown_in_the_upstreams_tokens_as_its_headers_say_them() -> None:
    """A model counted by an estimate that CJK text makes ~4 times too low: the dashboard's
    figures of a turn are its headers', and its levels the budget's, in the upstream's tokens."""
    models = [{"match": ESTIMATED, "context_window": 8192, "counting": "estimate"}]
    with harness(models=models) as h:
        chat = h.conversation(model=ESTIMATED)
        for turn in range(4):
            headers = chat.say(cjk_turn(turn))
        ratio = float(headers["x-compaction-count-ratio"])
        assert ratio > 2
        recent = data(h, f"/{chat.key}")["activity"]["recent"]
        _, sent, forwarded, compact, target, _, _ = recent[-1]
        assert (sent, forwarded) == (
            int(headers["x-compaction-tokens-before"]),
            int(headers["x-compaction-tokens-after"]),
        )
        budget = h.budget(ESTIMATED)  # in the upstream's tokens
        assert abs(compact - budget.compact_tokens) <= ratio + 1  # the scaled budget rounds down
        assert abs(target - budget.target_tokens) <= ratio + 1


def test_a_compacted_session_shows_its_turns_plan_and_summary() -> None:
    with harness() as h:
        chat = h.conversation()
        chat.until("compacted")
        chat.say()
        session = data(h, f"/{chat.key}")
        activity = session["activity"]
        assert activity["turns"] == chat.turns == len(activity["recent"])
        budget = h.budget()
        _, sent, forwarded, compact, target, action, layers = activity["recent"][-2]
        assert (action, layers) == ("compacted", ["summarize"])
        assert sent > compact >= forwarded and (compact, target) == (
            budget.compact_tokens,
            budget.target_tokens,
        )
        assert session["seen"].startswith(SUMMARY_HEADING)
        assert "SUMMARY-1: goals and facts." in session["seen"]
        assert session["plan"][0].startswith("Summarised: the first")
        assert session["decisions"][0]["layer"] == "summarize"
        assert session["version"] == h.version(chat.key)


def test_bad_keys_and_unknown_sessions() -> None:
    with harness() as h:
        assert h.admin("GET", f"{API}/not-a-key").status_code == 400
        assert h.admin("GET", f"{API}/{'0' * 32}").status_code == 404
        assert h.admin("POST", f"{API}/{'0' * 32}/compact", content=b"{").status_code == 400


def test_compact_now_and_reset_as_the_admin_api_does() -> None:
    with harness(admin={"dashboard": {"write_seconds": 60}}) as h:
        chat = h.conversation()
        chat.say()
        chat.say()
        assert h.admin("POST", f"{API}/{chat.key}/compact").status_code == 202
        assert data(h, f"/{chat.key}")["pending"] == ""  # asked for, without instructions
        # Listed at once, not with the session's next write of its turns.
        h.wait_for(lambda: data(h)["sessions"][0]["pending"] is True, timeout=2)
        assert chat.say()["x-compaction-action"] == "compacted"
        assert h.admin("DELETE", f"{API}/{chat.key}").status_code == 204
        assert h.admin("GET", f"{API}/{chat.key}").status_code == 404
        assert data(h)["sessions"] == []


def test_turns_cost_no_store_write_each() -> None:
    """The first turn lists the session; the next ones are kept in the process (shown at
    once) until `write_seconds` after that write; none is written in the state a request
    reads."""
    with harness(admin={"dashboard": {"write_seconds": 60}}) as h:
        chat = h.conversation()
        for _ in range(5):
            chat.say()
        assert 0 < stored_turns(h, chat.key) < 5
        assert h.record(chat.key) is None
        assert data(h, f"/{chat.key}")["activity"]["turns"] == 5
        assert data(h)["sessions"][0]["turns"] == 5


def test_other_replicas_show_the_turns_within_write_seconds() -> None:
    with harness(replicas=2, admin={"dashboard": {"write_seconds": 0.3}}) as h:
        chat = h.conversation(server=0)
        for _ in range(4):
            chat.say()
        h.wait_for(lambda: data(h, server=1)["sessions"][0]["turns"] == 4, timeout=2)
        h.wait_for(lambda: data(h, f"/{chat.key}", server=1)["activity"]["turns"] == 4)
        assert stored_turns(h, chat.key) == 4


def test_unwritten_turns_are_written_at_shutdown() -> None:
    with harness(admin={"dashboard": {"write_seconds": 60}}) as h:
        with proxy_server(h.config) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk", max_retries=0)
            chat = Conversation(h.stack.enter_context(client), "s1")
            for _ in range(3):
                chat.say()
            assert stored_turns(h, chat.key) < 3
        assert stored_turns(h, chat.key) == 3


def test_open_on_loopback_keeps_other_sites_out() -> None:
    with harness(admin={"token": None, "dashboard": {"open_on_loopback": True}}) as h:
        chat = h.conversation()
        chat.say()
        port = h.servers[0].port

        def get(path: str, **headers: str) -> httpx.Response:
            response = httpx.get(h.url + path, headers=headers)
            assert no_cors(response)
            return response

        assert get(API, **OWN).json()["sessions"][0]["key"] == chat.key
        assert get("/admin/dashboard").status_code == 200
        for host in (f"localhost:{port}", f"[::1]:{port}", "127.0.0.2"):
            assert get(API, host=host, **OWN).status_code == 200
        # A DNS rebinding attack's requests name its own host.
        for path in ("/admin/dashboard", API):
            assert get(path, host=f"evil.example:{port}", **OWN).status_code == 403
        # Another site's page cannot send the header without a preflight, which gets no CORS.
        assert get(API).status_code == 403
        preflight = httpx.options(h.url + API, headers={"origin": "http://evil.example"})
        assert preflight.status_code in (404, 405) and no_cors(preflight)
        compact = f"{h.url}{API}/{chat.key}/compact"
        refused = httpx.post(compact, headers={**OWN, "origin": "http://evil.example"})
        assert refused.status_code == 403
        assert httpx.post(compact, headers={**OWN, "origin": h.url}).status_code == 202
        # The admin API itself stays off, and a token where none is configured is refused.
        assert get(f"/admin/sessions/{chat.key}").status_code == 404
        assert get(API, authorization="Bearer guess", **OWN).status_code == 401


def test_open_on_loopback_is_ignored_beyond_loopback() -> None:
    dashboard = {"open_on_loopback": True}
    with harness(listen={"host": "0.0.0.0"}, admin={"dashboard": dashboard}) as h:
        assert httpx.get(h.url + API, headers=OWN).status_code == 401
        assert h.admin("GET", API).status_code == 200
    with harness(listen={"host": "0.0.0.0"}, admin={"token": None, "dashboard": dashboard}) as h:
        assert httpx.get(h.url + API, headers=OWN).status_code == 404


def plan(**fields: Any) -> policies.Plan:
    return policies.Plan(**fields)


def decision(layer: str, *positions: int) -> dict[str, Any]:
    return {"at": 1.0, "layer": layer, "positions": list(positions)}


def test_the_plan_in_words() -> None:
    assert plan_words(plan(), ()) == [
        "No compaction yet: the requests go upstream as the client sends them."
    ]
    edits = {4: {"role": "tool", "content": "[cleared]"}, 5: None, 6: None, 7: {"role": "user"}}
    words = plan_words(
        plan(
            cut=4,
            summary=Summary("the user wants a refactoring", "digest"),
            edits=edits,
            anchor_block="web-7\nticket 42",
            covered=9,
            anchors_truncated=True,
        ),
        [decision("clear_tool_results", 4), decision("drop_tool_blocks", 5), decision("x", 7)],
    )
    assert words == [
        "Summarised: the first 4 messages after the system prompt, as a mechanical digest (no "
        "LLM summary was ready in time) of 5 words.",
        "Cleared: 1 old tool results or media replaced by a placeholder.",
        "Dropped: 1 old tool calls with their results.",
        "Edited by x: 1 messages.",
        "Dropped: 1 messages.",
        "Pinned: 2 anchors kept verbatim from removed messages (some did not fit: the anchor "
        "block is full).",
        "The plan covers the first 9 messages; later ones go as the client sent them.",
    ]
