"""The dashboard in a real browser: headless Chromium against a proxy with a few sessions of
the fake upstream. It checks what the pages show (the sessions, a compacted session's turns,
its compaction marked with its layers, the summary the model sees), that a new turn shows
within a second, and screenshots both pages.

Chromium is Debian's package (`.ci/run` installs it): missing, the test fails, never skips.
The screenshots go to the test's own directory; with COMPACTION_PROXY_SCREENSHOTS=docs they
replace docs/dashboard-sessions.png and docs/dashboard-session.png (how those were made).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.browser import browser, chromium
from tests.harness import ADMIN_TOKEN, Conversation, Harness, harness

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


def sessions(h: Harness) -> Conversation:
    """Three sessions of three tenants: one compacted twice, one short, one just begun; the
    compacted one."""
    long = h.conversation("refactoring", api_key="sk-alice")
    long.until("compacted")
    long.until("compacted")
    for _ in range(4):
        long.say()
    short = h.conversation("question", api_key="sk-bob")
    for _ in range(3):
        short.say()
    h.conversation("hello", api_key="sk-carol").say("Hello!")
    return long


async def test_the_dashboard_in_chromium(tmp_path: Path) -> None:
    if chromium() is None:
        pytest.fail("Chromium is missing: apt-get install -y chromium (.ci/run installs it)")
    shots = ROOT / "docs" if os.environ.get("COMPACTION_PROXY_SCREENSHOTS") == "docs" else tmp_path
    with harness() as h:
        long = sessions(h)
        key = long.key
        async with browser(tmp_path / "profile", width=1440) as page:
            await page.open(h.url + "/admin/dashboard")
            # Without the token the page asks for it, and keeps it in the tab, not in a URL.
            await page.wait_for("!document.getElementById('login').hidden")
            await page.evaluate(
                f"document.getElementById('token').value = {ADMIN_TOKEN!r};"
                "document.getElementById('login').requestSubmit()"
            )
            rows = await page.wait_for(
                "document.querySelectorAll('#rows tr').length === 3 &&"
                "[...document.querySelectorAll('#rows tr')].map(r => r.innerText)"
            )
            assert await page.evaluate("sessionStorage.length") == 1
            assert ADMIN_TOKEN not in await page.evaluate("location.href")
            cells = {row.split("\t")[1]: row.split("\t") for row in rows}
            assert list(cells)[-1] == key[:12]  # newest first: the compacted one began first
            mine = cells[key[:12]]
            assert mine[3:7] == ["chat", "gpt-4", "default", str(long.turns)]
            assert mine[8:10] == ["2", "replayed"]
            assert (await page.screenshot(shots / "dashboard-sessions.png")).startswith(PNG)

            await page.evaluate(f"document.querySelector('tr[data-key=\"{key}\"]').click()")
            await page.wait_for("!document.getElementById('session').hidden")
            markers = await page.wait_for(
                "[...document.querySelectorAll('#chart g.compaction')]"
                ".map(g => g.querySelector('text.layers').textContent)"
            )
            assert len(markers) == 2 and all("summarize" in m for m in markers)
            seen = await page.evaluate("document.getElementById('seen').textContent")
            assert "SUMMARY-2" in seen
            plan = await page.evaluate("document.getElementById('plan').innerText")
            assert "Summarised: the first" in plan
            decisions = await page.evaluate("document.getElementById('decisions').innerText")
            assert "summarize" in decisions
            turns = await page.evaluate(
                "document.querySelectorAll('#chart polyline.sent')[0]"
                ".getAttribute('points').split(' ').length"
            )
            assert await page.screenshot(shots / "dashboard-session.png")

            # A new turn shows within a second, without a reload.
            chat = h.conversation("refactoring", api_key="sk-alice")
            chat.messages = []  # a new branch of the same session, counted all the same
            chat.say("One more thing.")
            said = time.monotonic()
            await page.wait_for(
                "document.querySelectorAll('#chart polyline.sent')[0]"
                f".getAttribute('points').split(' ').length === {turns + 1}",
                timeout=1.0,
            )
            shown = time.monotonic() - said
            print(f"a new turn showed {shown * 1000:.0f} ms after its answer")
