"""The admin API: off unless configured, token-protected; inspect, reset and compact a session,
and find a session's key (docs/compaction.md, "Memory candidates and the admin API")."""

from __future__ import annotations

import httpx
import pytest

from proxy.config import Auth
from proxy.server.admin import OFF
from proxy.server.tenants import Tenants
from tests.harness import ADMIN_TOKEN, harness, prepare_ahead

UNKNOWN = "0" * 32


def test_the_admin_api_is_off_without_a_token() -> None:
    with harness(admin={"token": None}) as h:
        chat = h.conversation()
        chat.say()
        for method, path in [
            ("GET", f"/admin/sessions/{chat.key}"),
            ("DELETE", f"/admin/sessions/{chat.key}"),
            ("POST", f"/admin/sessions/{chat.key}/compact"),
            ("GET", "/admin/session-key?tenant=t&session=s"),
        ]:
            response = h.admin(method, path)
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "not_found"
            assert response.json()["error"]["message"].startswith(OFF)
        assert h.admin("GET", "/admin/dashboard").json()["error"]["message"].startswith(OFF)


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Bearer {ADMIN_TOKEN}x", ""])
def test_a_wrong_admin_token_is_refused(authorization: str | None) -> None:
    with harness() as h:
        headers = {} if authorization is None else {"authorization": authorization}
        for method, path in [
            ("GET", f"/admin/sessions/{UNKNOWN}"),
            ("DELETE", f"/admin/sessions/{UNKNOWN}"),
            ("POST", f"/admin/sessions/{UNKNOWN}/compact"),
            ("GET", "/admin/session-key?tenant=t&session=s"),
        ]:
            response = httpx.request(method, h.url + path, headers=headers)
            assert response.status_code == 401
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
        assert list(h.redis.scan_iter(match=f"{h.config.store.key_prefix}:*")) == []


def test_the_key_of_a_session_is_found_by_tenant_and_session_id() -> None:
    with harness() as h:
        chat = h.conversation("my-session")
        chat.say()
        tenant = Tenants(Auth()).tenant({"authorization": "Bearer sk-test"})
        response = h.admin(
            "GET", "/admin/session-key", params={"tenant": tenant, "session": "my-session"}
        )
        assert response.status_code == 200
        assert response.json() == {"key": chat.key}
        other = h.admin(
            "GET", "/admin/session-key", params={"tenant": "other", "session": "my-session"}
        )
        assert other.json()["key"] != chat.key
        assert h.admin("GET", "/admin/session-key", params={"tenant": tenant}).status_code == 400


def test_inspect_shows_plan_summary_decisions_memory_and_calibration() -> None:
    with harness() as h:
        assert h.admin("GET", f"/admin/sessions/{UNKNOWN}").status_code == 404
        assert h.admin("GET", "/admin/sessions/not-a-key").status_code == 400
        chat = h.conversation()
        chat.say("I prefer answers in French. " + "Please remember that my server is web-7.")
        headers = chat.until("compacted")
        session = h.admin("GET", f"/admin/sessions/{chat.key}").json()

        assert session["key"] == chat.key
        assert session["version"] == h.version(chat.key)
        (branch,) = session["branches"]
        plan = branch["plan"]
        assert plan["cut"] > 0 and plan["covered"] == chat.turns * 2 - 1
        assert plan["summary"]["kind"] == "llm"
        assert plan["summary"]["text"].startswith("SUMMARY-1: goals and facts.")
        (decision,) = session["decisions"]
        assert decision["layer"] == "summarize" and decision["detail"] == "llm"
        assert decision["tokens_before"] > decision["tokens_after"]
        assert decision["tokens_after"] == int(headers["x-compaction-tokens-after"])
        assert {"kind": "preference", "text": "I prefer answers in French."}.items() <= (
            session["memory"][0].items()
        )
        assert session["memory"][1]["kind"] == "remember"
        assert session["calibration"] == pytest.approx(1.0, abs=0.02)  # counted exactly
        assert session["pending"] is None


def test_reset_forgets_the_session() -> None:
    with harness() as h:
        chat = h.conversation()
        chat.until("compacted")
        assert h.admin("DELETE", f"/admin/sessions/{chat.key}").status_code == 204
        assert h.admin("GET", f"/admin/sessions/{chat.key}").status_code == 404
        assert not h.redis.exists(h.state_key(chat.key))
        # The next request starts fresh: compacted from scratch, the old summary not rolled in.
        assert chat.say()["x-compaction-action"] == "compacted"
        assert "Previous summary" not in h.summaries.prompts[-1]
        assert len(h.summaries.bodies) == 2
        assert h.admin("DELETE", f"/admin/sessions/{UNKNOWN}").status_code == 204


def test_compact_now_with_instructions_on_the_next_request() -> None:
    with harness() as h:
        chat = h.conversation()
        prepare_ahead(h, chat)  # a summary made ahead of time must not swallow the instructions
        calls = h.up.summary_calls
        instructions = "Keep every server name verbatim."
        response = h.admin(
            "POST", f"/admin/sessions/{chat.key}/compact", json={"instructions": instructions}
        )
        assert response.status_code == 202
        session = h.admin("GET", f"/admin/sessions/{chat.key}").json()
        assert session["pending"] == instructions

        chat.skip(6)  # past what the prepared summary covers: it would do without an LLM call
        assert chat.say()["x-compaction-action"] == "compacted"
        assert h.up.summary_calls == calls + 1
        assert (
            f"Additional instructions for this summary:\n{instructions}"
            in (h.summaries.prompts[-1])
        )
        session = h.admin("GET", f"/admin/sessions/{chat.key}").json()
        assert session["pending"] is None
        assert chat.say()["x-compaction-action"] == "replayed"


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"instructions": 5}', b'["x"]', b'{"instructions": "' + b"x" * 4001 + b'"}'],
)
def test_compact_refuses_a_bad_body(body: bytes) -> None:
    with harness() as h:
        response = h.admin("POST", f"/admin/sessions/{UNKNOWN}/compact", content=body)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert not h.redis.exists(h.state_key(UNKNOWN))
