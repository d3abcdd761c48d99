"""`compaction-proxy replay` and `compaction-proxy sessions`: recorded conversations through the
proxy's compactor offline, the chart, and the admin API from the command line (docs/replay.md).
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.config import Auth, load
from proxy.server.tenants import Tenants
from proxy.tools.cli import main
from proxy.tools.recordings import Recorded, client_requests, joined
from proxy.tools.replay import Replay, Totals, with_window
from tests.conftest import examples
from tests.conversations import TRACES, conversations, load_traces
from tests.fakes.openai import FakeUpstream, is_summary_request
from tests.harness import ADMIN_TOKEN, harness
from tests.replay import MAX_TOKENS, WINDOWS, replay, replay_servers, stability

REPO = Path(__file__).resolve().parent.parent
TAU = TRACES / "tau_airline_gpt4o.jsonl"
COMPACTIONS = {"compacted", "degraded"}
HEADER = ["session", "turn", "sent", "forwarded", "action", "layers", "stable"]
SERIES = ["sent", "forwarded", "window", "compact", "prepare", "target"]
TOKEN_VARIABLE = "COMPACTION_PROXY_ADMIN_TOKEN"


@pytest.fixture(scope="module")
def tau(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The first 12 tau-bench conversations, as a file."""
    path = tmp_path_factory.mktemp("traces") / "tau12.jsonl"
    path.write_text("".join(TAU.read_text().splitlines(keepends=True)[:12]))
    return str(path)


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The installed command's code path (`python -m proxy`), importing this tree."""
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def config_file(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def replayed(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """`replay ARGS --json` run in this process: its turns and totals."""
    assert main(["replay", *args, "--json"]) == 0
    result: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return result


def totals_lines(result: dict[str, Any]) -> list[str]:
    """What the table's totals must say for these turns."""
    t = result["totals"]
    share = t["forwarded"] / t["sent"]
    stable_share = t["stable"] / t["followers"]
    return [
        f"sessions {t['sessions']}, turns {t['turns']}, compactions {t['compactions']}, "
        f"refused {t['refused']}",
        f"tokens sent {t['sent']}, forwarded {t['forwarded']} ({share:.1%})",
        f"stable prefix {t['stable']} of {t['followers']} turns ({stable_share:.1%})",
    ]


# -- replay -----------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_a_long_session_table_agrees_with_what_the_compactor_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    four = "".join(TAU.read_text().splitlines(keepends=True)[:4])
    args = ["--model", "gpt-4o", "--window", "8192", "--join", "4"]
    table = cli("replay", "-", *args, stdin=four)  # as installed, from standard input
    assert table.returncode == 0, table.stderr
    assert table.stderr == ""  # no progress bar off a terminal
    (tmp_path / "four.jsonl").write_text(four)
    result = replayed(capsys, str(tmp_path / "four.jsonl"), *args)
    turns, totals = result["turns"], result["totals"]

    conversations = [orjson.loads(line)["messages"] for line in four.splitlines()]
    assert len(turns) == len(list(client_requests(joined(conversations, 4)[0])))
    assert [t["turn"] for t in turns] == list(range(1, len(turns) + 1))
    assert {t["session"] for t in turns} == {"tau-airline-0-0-0+3"}
    for t in turns:
        assert t["forwarded"] <= t["sent"]
        assert t["forwarded"] <= t["levels"]["compact"] or t["action"] == "none"
        assert bool(t["layers"]) == (t["action"] in COMPACTIONS), t
        assert t["window"] == 8192
    actions = Counter(t["action"] for t in turns)
    assert actions["compacted"] >= 2 and actions["degraded"] == 0  # the digest, not a failure
    assert totals["compactions"] == actions["compacted"]
    assert totals["sent"] == sum(t["sent"] for t in turns)
    assert totals["forwarded"] == sum(t["forwarded"] for t in turns) < totals["sent"]
    # Stable between compactions; here each compaction rewrote the prefix.
    assert all(t["stable"] for t in turns[1:] if t["action"] not in COMPACTIONS)
    assert totals["stable"] == len(turns) - 1 - totals["compactions"]

    lines = table.stdout.splitlines()
    assert lines[0].split() == HEADER
    rows = [line.split() for line in lines[1 : 1 + len(turns)]]
    assert [(int(r[1]), int(r[2]), int(r[3]), r[4]) for r in rows] == [
        (t["turn"], t["sent"], t["forwarded"], t["action"]) for t in turns
    ]
    assert lines[-3:] == totals_lines(result)


def test_the_offline_replay_does_what_the_proxy_does_over_http(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same requests through the running proxy (the real SDK, the strict fake upstream,
    its summarizer down: the digest) and through the CLI: the same tokens, the same
    compactions, the same stable prefixes, turn by turn. Streamed without usage, so that the
    proxy does not calibrate its counts on the fake's (offline nothing is learnt)."""
    sessions = joined([messages for _, messages in load_traces()[2:10]], 4)
    with replay_servers(summarizer=lambda body: RuntimeError("summarizer down")) as (up, client):
        over_http = [replay(client, up, s, model="gpt-4o-8k", stream=True) for s in sessions]
    bodies = [
        {
            "model": "gpt-4o-8k",
            "messages": h,
            "max_tokens": MAX_TOKENS,
            "metadata": {"session_id": f"s{i}"},
        }
        for i, session in enumerate(sessions)
        for h in client_requests(session)
    ]
    models = [{"match": name, "context_window": w} for name, w in WINDOWS.items()]
    config = config_file(
        tmp_path / "config.yaml",
        {"upstreams": {"fake": {"base_url": "http://127.0.0.1:9/v1"}}, "models": models},
    )
    result = replayed(
        capsys, str(jsonl(tmp_path / "bodies.jsonl", bodies)), "--config", str(config)
    )

    http_turns = [t for session in over_http for t in session]
    assert all(t.status == 200 for t in http_turns)
    assert [(t["sent"], t["forwarded"]) for t in result["turns"]] == [
        (t.tokens_before, t.tokens_after) for t in http_turns
    ]
    assert [t["action"] in COMPACTIONS for t in result["turns"]] == [
        t.action in COMPACTIONS for t in http_turns
    ]
    assert {t.action for t in http_turns} >= {"degraded"}  # the proxy saw its summarizer fail
    seen = stability([[(t.sent, t.view) for t in session] for session in over_http])
    assert (result["totals"]["stable"], result["totals"]["followers"]) == (seen.stable, seen.pairs)
    assert result["totals"]["sessions"] == len(sessions) == 2


def test_request_bodies_and_conversations_are_told_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    system = {"role": "system", "content": "Be brief."}
    one = [system, {"role": "user", "content": "First question"}]
    two = [system, {"role": "user", "content": "Another topic"}]
    answer = {"role": "assistant", "content": "An answer."}
    follow = {"role": "user", "content": "And then?"}
    records = [
        {"model": "gpt-4o", "messages": one},  # sessions derived from the first user message
        {"model": "gpt-4o", "messages": two, "metadata": {"session_id": "named"}},
        {"model": "gpt-4o", "messages": [*one, answer, follow]},
        {"id": "chat-1", "messages": [*one, answer, follow, answer, follow, answer]},
    ]
    result = replayed(capsys, str(jsonl(tmp_path / "mixed.jsonl", records)), "--model", "gpt-4o")
    sessions = [(t["session"], t["turn"]) for t in result["turns"]]
    derived = sessions[0][0]
    assert derived.startswith("derived-")
    assert sessions == [
        (derived, 1),
        ("named", 1),
        (derived, 2),
        *[("chat-1", n) for n in (1, 2, 3)],  # one request per assistant message
    ]
    assert result["turns"][2]["stable"] is True
    assert result["totals"]["sessions"] == 3


def test_the_window_option_moves_the_levels(tau: str, capsys: pytest.CaptureFixture[str]) -> None:
    small, large = (
        replayed(capsys, tau, "--model", "gpt-4o", "--window", window, "--join", "2")
        for window in ("4096", "32768")
    )
    assert {t["window"] for t in small["turns"]} == {4096}
    assert {t["window"] for t in large["turns"]} == {32768}
    assert small["turns"][0]["levels"]["compact"] < large["turns"][0]["levels"]["compact"]
    assert small["totals"]["compactions"] > large["totals"]["compactions"]
    assert small["totals"]["forwarded"] < large["totals"]["forwarded"]
    assert small["totals"]["turns"] == large["totals"]["turns"]


def test_a_policy_is_chosen_by_name(
    tau: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_file(
        tmp_path / "config.yaml",
        {
            "upstreams": {"fake": {"base_url": "http://127.0.0.1:9/v1"}},
            "policies": {
                "default": {},
                "tight": {"prepare_at": 0.4, "compact_at": 0.5, "target": 0.3},
            },
        },
    )
    base = ["--config", str(config), "--model", "gpt-4o", "--window", "8192", tau]
    default = replayed(capsys, *base)
    tight = replayed(capsys, *base, "--policy", "tight")
    assert tight["totals"]["compactions"] > default["totals"]["compactions"]
    assert main(["replay", *base, "--policy", "nope"]) == 2
    assert "no policy 'nope' in the config (its policies: default, tight)" in (
        capsys.readouterr().err
    )


def test_live_asks_the_configured_summarizer_and_offline_calls_nothing(
    tau: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeUpstream(summarizer=lambda body: "SUMMARY: the user changed flights.") as up:
        config = config_file(
            tmp_path / "config.yaml", {"upstreams": {"fake": {"base_url": up.base_url}}}
        )
        base = ["--config", str(config), "--model", "gpt-4o", "--window", "8192", "--join", "4"]
        offline = replayed(capsys, *base, tau)
        assert up.requests == []
        live = replayed(capsys, *base, "--live", tau)
        summaries = [r for r in up.requests if is_summary_request(r.headers, r.json)]
    assert summaries and len(summaries) == len(up.requests)  # summaries only, nothing else
    assert {t["action"] for t in live["turns"]} >= {"compacted"}
    assert "degraded" not in {t["action"] for t in live["turns"] + offline["turns"]}
    assert live["totals"]["turns"] == offline["totals"]["turns"]


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "messages": []}\n{"messages": \n')
    cases = [
        (["replay", str(broken), "--model", "gpt-4o"], f"{broken}:2: not JSON"),
        (["replay", str(TAU)], "conversations name no model: give one with --model"),
        (["replay", str(tmp_path / "none.jsonl"), "--model", "m"], "cannot read"),
        (
            ["replay", str(TAU), "--model", "m", "--chart", "x.gif"],
            "a chart is .svg, .html or .png",
        ),
    ]
    not_chat = jsonl(tmp_path / "bad.jsonl", [{"model": "gpt-4o", "messages": [{"role": 3}]}])
    cases.append((["replay", str(not_chat)], "request 1: not a valid chat request"))
    for args, message in cases:
        assert main(args) == 2, args
        out, err = capsys.readouterr()
        assert message in err and out == "", (args, err)


def test_quiet_prints_the_totals_alone(tau: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = replayed(capsys, tau, "--model", "gpt-4o")
    assert main(["replay", tau, "--model", "gpt-4o", "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines() == totals_lines(result)


@functools.cache
def small_window() -> Replay:
    """One replay at a 2k window for every example (sessions of their own): the model map
    and the tokenizer are loaded once."""
    return Replay(with_window(load(), 2048))


# Found by this property: a summary header must never replace fewer tokens than it costs.
TINY_THEN_A_HUGE_CALL = [
    {"role": "system", "content": "ORDER-0000 the plan " * 8},
    {"role": "assistant", "content": ""},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_user", "arguments": '{"query": "%s"}' % ("ab " * 1050)},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": ""},
    {"role": "assistant", "content": ""},
    {"role": "user", "content": ""},
]


@settings(max_examples=examples(100), deadline=None, suppress_health_check=list(HealthCheck))
@given(sessions=st.lists(conversations(max_rounds=10), min_size=1, max_size=3))
@example(sessions=[TINY_THEN_A_HUGE_CALL])
async def test_random_sessions_keep_the_proxy_invariants_turn_by_turn(
    sessions: list[list[dict[str, Any]]],
) -> None:
    """Over random conversations at a small window: what is forwarded never grows what was
    sent and fits the budget; between two compactions the forwarded prefix is stable; the
    totals count what the turns say."""
    names = [uuid.uuid4().hex for _ in sessions]
    recorded = [
        Recorded({"model": "gpt-4o", "messages": history}, name)
        for name, messages in zip(names, sessions, strict=True)
        for history in client_requests(messages)
    ]
    runner = small_window()
    turns = [await runner.turn(r, f"request {i}") for i, r in enumerate(recorded, 1)]
    for turn in turns:
        if turn.action == "refused":
            assert turn.forwarded == 0 and turn.stable is None
            continue
        assert turn.forwarded <= turn.sent
        if turn.action != "none":
            assert turn.forwarded <= turn.budget.limit
        if turn.action not in COMPACTIONS and turn.stable is not None:
            assert turn.stable, turn
    totals = Totals.of(turns)
    assert totals.sessions == len({r.session for r in recorded})
    assert totals.compactions == sum(t.action in COMPACTIONS for t in turns)
    first_turns = sum(t.turn == 1 for t in turns)
    assert totals.followers == sum(t.stable is not None for t in turns) <= len(turns) - first_turns


# -- the chart -----------------------------------------------------------------------------------


def test_the_svg_chart_has_one_polyline_a_series_and_a_mark_a_compaction(
    tau: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "chart.svg"
    args = [tau, "--model", "gpt-4o", "--window", "8192", "--join", "3", "--chart", str(chart)]
    result = replayed(capsys, *args)
    root = ET.fromstring(chart.read_text())
    ns = "{http://www.w3.org/2000/svg}"
    polylines = root.findall(f"{ns}polyline")
    assert [p.get("class") for p in polylines] == SERIES
    by_name = {p.get("class"): p.get("points", "").split() for p in polylines}
    assert len(by_name["sent"]) == len(by_name["forwarded"]) == len(result["turns"])
    marks = root.findall(f"{ns}circle[@class='compaction']")
    assert len(marks) == result["totals"]["compactions"] > 0
    compacted = [i for i, t in enumerate(result["turns"]) if t["action"] in COMPACTIONS]
    assert [f"{m.get('cx')},{m.get('cy')}" for m in marks] == [
        by_name["forwarded"][i] for i in compacted
    ]
    # One window, one set of levels: each level is a flat line, drawn end to end.
    for level in SERIES[2:]:
        (_, y0), (_, y1) = (point.split(",") for point in by_name[level])
        assert y0 == y1
    # y grows downwards: the forwarded line is never above the sent one.
    for sent, forwarded in zip(by_name["sent"], by_name["forwarded"], strict=True):
        assert float(forwarded.split(",")[1]) >= float(sent.split(",")[1])
    sessions = root.findall(f"{ns}line[@class='session']")
    assert len(sessions) == result["totals"]["sessions"] - 1


def test_the_html_chart_holds_the_svg_and_the_totals(
    tau: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "chart.html"
    result = replayed(capsys, tau, "--model", "gpt-4o", "--chart", str(page))
    text = page.read_text()
    assert text.startswith("<!doctype html>")
    svg = text[text.index("<svg") : text.index("</svg>") + len("</svg>")]
    assert len(ET.fromstring(svg).findall("{http://www.w3.org/2000/svg}polyline")) == 6
    assert totals_lines(result)[0] in text


def test_a_png_chart_with_matplotlib_and_a_clear_error_without(
    tau: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    png = tmp_path / "chart.png"
    replayed(capsys, tau, "--model", "gpt-4o", "--join", "6", "--chart", str(png))
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert png.stat().st_size < 100_000

    png.unlink()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert main(["replay", str(TAU), "--model", "gpt-4o", "--chart", str(png)]) == 2
    out, err = capsys.readouterr()
    assert "a PNG chart needs matplotlib: pip install 'compaction-proxy[chart]'" in err
    assert out == "" and not png.exists()  # refused before replaying


# -- sessions: the admin API ---------------------------------------------------------------------


def sessions(
    capsys: pytest.CaptureFixture[str], url: str, *args: str, token: str | None = ADMIN_TOKEN
) -> tuple[int, Any, str]:
    """`sessions --url URL ARGS` in this process: exit code, printed JSON, stderr."""
    options = ["--url", url] + (["--token", token] if token else [])
    code = main(["sessions", *options, *args])
    out, err = capsys.readouterr()
    return code, orjson.loads(out) if out else None, err


def test_sessions_show_compact_and_reset_through_the_admin_api(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with harness() as h:
        chat = h.conversation("cli-session")
        chat.until("compacted")
        code, shown, _ = sessions(capsys, h.url, "show", chat.key)
        assert code == 0
        assert shown["key"] == chat.key and shown["version"] == h.version(chat.key)
        assert shown["branches"][0]["plan"]["cut"] > 0
        total = shown["prompt_cache"]["total"]  # every answer's usage, written or not yet
        assert (total["requests"], total["prompt_tokens"]) == (chat.turns, sum(chat.usage))

        code, answer, _ = sessions(capsys, h.url, "compact", chat.key, "--instructions", "Keep ids")
        assert (code, answer["status"]) == (0, "compaction on the next request")
        assert sessions(capsys, h.url, "show", chat.key)[1]["pending"] == "Keep ids"

        tenant = Tenants(Auth()).tenant({"authorization": "Bearer sk-test"})
        code, found, _ = sessions(
            capsys, h.url, "key", "--tenant", tenant, "--session", "cli-session"
        )
        assert (code, found) == (0, {"key": chat.key})

        assert sessions(capsys, h.url, "reset", chat.key)[:2] == (
            0,
            {"key": chat.key, "status": "reset"},
        )
        code, shown, err = sessions(capsys, h.url, "show", chat.key)
        assert (code, shown) == (1, None)
        assert "the proxy answered 404: no such session" in err


def test_sessions_errors_are_clear_with_a_non_zero_exit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "0" * 32
    with harness() as h:
        code, _, err = sessions(capsys, h.url, "show", key, token="wrong")
        assert code == 1 and "the proxy refused the admin token (401)" in err
        assert sessions(capsys, h.url, "show", "not-a-key")[2].endswith(
            "the proxy answered 400: a session key is 32 lowercase hex characters\n"
        )
        monkeypatch.setenv(TOKEN_VARIABLE, ADMIN_TOKEN)
        assert sessions(capsys, h.url, "show", key, token=None)[0] == 1  # 404, token from env
        monkeypatch.delenv(TOKEN_VARIABLE)
        code, _, err = sessions(capsys, h.url, "show", key, token=None)
        assert code == 2 and f"--token or ${TOKEN_VARIABLE}" in err
    with harness(admin={"token": None}) as h:
        code, _, err = sessions(capsys, h.url, "show", key)
        assert code == 1 and "the admin API is off" in err
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    code, _, err = sessions(capsys, url, "show", key)
    assert code == 1 and f"cannot reach the proxy at {url}" in err
    code, _, err = sessions(capsys, "ftp://x", "show", key)
    assert code == 1 and "--url must be http://host:port" in err


@pytest.mark.subprocess
def test_the_sessions_command_runs_as_installed() -> None:
    with harness() as h:
        chat = h.conversation("subprocess")
        chat.until("compacted")
        env = {**os.environ, "PYTHONPATH": str(REPO), TOKEN_VARIABLE: ADMIN_TOKEN}
        result = subprocess.run(
            [sys.executable, "-m", "proxy", "sessions", "--url", h.url, "show", chat.key],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("{\n  ")  # pretty JSON
    assert orjson.loads(result.stdout)["key"] == chat.key
