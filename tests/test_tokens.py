"""Token counting against tiktoken and OpenAI's published counts; cache, estimate, offline."""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.machinery
import importlib.util
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.models.tokens import TokenCounter, configure_offline_encodings, counter_for
from tests.conftest import examples
from tests.openai_examples import COOKBOOK

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests/data"

# OpenAI cookbook, "How to count tokens with tiktoken": 129 prompt tokens for gpt-3.5-turbo
# and gpt-4, 124 for gpt-4o and gpt-4o-mini, as counted by the OpenAI API.
# Same cookbook, with tools: 105 prompt tokens for gpt-3.5-turbo and gpt-4, 101 for gpt-4o.
WEATHER_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
WEATHER_MESSAGES: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": "You are a helpful assistant that can answer to questions about the weather.",
    },
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


def encoding(name: str) -> tiktoken.Encoding:
    configure_offline_encodings()
    return tiktoken.get_encoding(name)


def request_tokens(counter: TokenCounter, body: dict[str, Any]) -> int:
    return counter.count(body["messages"], fixed=counter.fixed(body))


def trace_history(tokens: int) -> list[dict[str, Any]]:
    """Recorded conversations joined until they pass `tokens` (gpt-4o counting)."""
    counter = counter_for("gpt-4o")
    messages: list[dict[str, Any]] = []
    with (TRACES / "tau_airline_gpt4o.jsonl").open("rb") as lines:
        for line in lines:
            messages += orjson.loads(line)["messages"]
            if counter.count(messages) >= tokens:
                return messages
    raise AssertionError("the traces hold fewer tokens than asked")


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-3.5-turbo", 129),
        ("gpt-4-0613", 129),
        ("gpt-4", 129),
        ("gpt-4o", 124),
        ("gpt-4o-mini", 124),
        ("openai/gpt-4o", 124),
    ],
)
def test_cookbook_messages(model: str, expected: int) -> None:
    counter = counter_for(model)
    assert counter.mode == "exact"
    assert request_tokens(counter, {"model": model, "messages": COOKBOOK}) == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [("gpt-3.5-turbo", 105), ("gpt-4", 105), ("gpt-4o", 101), ("gpt-4o-mini", 101)],
)
def test_cookbook_tools(model: str, expected: int) -> None:
    counter = counter_for(model)
    body = {"model": model, "messages": WEATHER_MESSAGES, "tools": WEATHER_TOOLS}
    assert request_tokens(counter, body) == expected


def test_legacy_functions_count_like_tools() -> None:
    counter = counter_for("gpt-4o")
    functions = [tool["function"] for tool in WEATHER_TOOLS]
    assert counter.fixed({"functions": functions}) == counter.fixed({"tools": WEATHER_TOOLS})
    assert counter.fixed({"messages": []}) == 3  # reply priming only
    assert counter.tools(None) == counter.tools([]) == 0
    dotted = copy.deepcopy(WEATHER_TOOLS)
    dotted[0]["function"]["description"] += "."
    dotted[0]["function"]["parameters"]["properties"]["unit"]["description"] += "."
    assert counter.tools(dotted) == counter.tools(WEATHER_TOOLS)  # a final "." is not rendered


def test_nested_tool_schema_is_counted() -> None:
    counter = counter_for("gpt-4o")
    flat = counter.tools(WEATHER_TOOLS)
    where = "Where exactly, as latitude and longitude in decimal degrees"
    point = {"type": "object", "properties": {"lat": {"type": "number", "description": where}}}
    for nested in (point, {"type": "array", "items": point}):
        tools = copy.deepcopy(WEATHER_TOOLS)
        tools[0]["function"]["parameters"]["properties"]["point"] = nested
        assert counter.tools(tools) - flat > counter.text(where)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_text_matches_tiktoken(name: str) -> None:
    counter = counter_for("gpt-4o" if name == "o200k_base" else "gpt-4")
    enc = encoding(name)
    # The cookbook's example: "tiktoken is great!" is 6 tokens in both encodings.
    assert counter.text("tiktoken is great!") == 6
    for text in ["", "hello world", "<|endoftext|> is plain text here", "数据 données 🚀" * 50]:
        assert counter.text(text) == len(enc.encode(text, disallowed_special=()))


@settings(max_examples=examples(200), deadline=None)
@given(st.text())
def test_text_matches_tiktoken_on_any_string(text: str) -> None:
    assert counter_for("gpt-4o").text(text) == len(encoding("o200k_base").encode_ordinary(text))


def test_message_formula_parts() -> None:
    counter = counter_for("gpt-4o")
    enc = encoding("o200k_base")

    def n(text: str) -> int:
        return len(enc.encode_ordinary(text))

    arguments = '{"city": "Paris", "unit": "celsius"}'
    call = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": "{}"},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "weather", "arguments": arguments},
            },
        ],
    }
    # 3 per message, the role, and per call its name, arguments and 3 more.
    assert counter.message(call) == 3 + n("assistant") + 2 * (3 + n("weather")) + n("{}") + n(
        arguments
    )
    answer = {"role": "tool", "tool_call_id": "call_2", "content": "18 degrees, sunny"}
    assert counter.message(answer) == 3 + n("tool") + n("call_2") + n("18 degrees, sunny")
    named = {"role": "user", "name": "ada", "content": "hi"}
    assert counter.message(named) == 3 + n("user") + n("ada") + 1 + n("hi")
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}],
    }
    assert counter.message(parts) == 3 + n("user") + n("hi") + n("there")


def png(width: int, height: int) -> bytes:
    """A real, decodable greyscale PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def image(data: bytes, mime: str, detail: str | None = None) -> dict[str, Any]:
    url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url} | ({"detail": detail} if detail else {})}


def image_message(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


# OpenAI's published examples: 1024x1024 high = 765, 2048x4096 high = 1105, low = 85.
@pytest.mark.parametrize(("size", "expected"), [((1024, 1024), 765), ((2048, 4096), 1105)])
def test_images_count_by_openai_rule(size: tuple[int, int], expected: int) -> None:
    counter = counter_for("gpt-4o")
    base = counter.message(image_message())
    assert counter.message(image_message(image(png(*size), "image/png"))) - base == expected
    low = image(png(*size), "image/png", detail="low")
    assert counter.message(image_message(low)) - base == 85
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert counter.message(image_message(remote)) - base == 765  # size unknown
    text = {"type": "text", "text": "What is in this image?"}
    both = counter.message(image_message(text, low))
    assert both - base == 85 + counter.text("What is in this image?")


def test_audio_files_and_unknown_parts_are_counted() -> None:
    counter = counter_for("gpt-4o")
    base = counter.message(image_message())

    def audio(seconds: int) -> int:
        data = base64.b64encode(b"\x00" * 32_000 * seconds).decode()  # 16 kHz 16-bit mono
        part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
        return counter.message(image_message(part)) - base

    assert audio(4) > 3 * audio(1) > 0

    def document(size: int) -> int:
        data = "data:application/pdf;base64," + base64.b64encode(b"%PDF" * size).decode()
        part = {"type": "file", "file": {"filename": "a.pdf", "file_data": data}}
        return counter.message(image_message(part)) - base

    assert document(100_000) > 5 * document(10_000) > 0
    future = {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}
    assert counter.message(image_message(future)) - base == counter.text(
        orjson.dumps(future).decode()
    )


def test_cache_is_keyed_by_content() -> None:
    counter = TokenCounter(encoding("o200k_base"))
    messages = trace_history(5_000)
    first = counter.count(messages)
    info = counter.cache_info()
    assert info.misses == info.size == len({orjson.dumps(m) for m in messages})
    assert counter.count(copy.deepcopy(messages)) == first  # equal content, other objects
    again = counter.cache_info()
    assert (again.hits - info.hits, again.misses) == (len(messages), info.misses)
    changed = copy.deepcopy(messages)
    changed[-1]["content"] = (changed[-1]["content"] or "") + " and one more sentence here."
    assert counter.count(changed) > first
    assert counter.cache_info().misses == info.misses + 1


def test_warm_count_costs_far_less_than_tokenising() -> None:
    messages = trace_history(128_000)
    counter = TokenCounter(encoding("o200k_base"))
    started = time.perf_counter()
    cold = counter.count(messages)
    cold_seconds = time.perf_counter() - started
    warm_seconds = []
    for _ in range(5):
        started = time.perf_counter()
        assert counter.count(messages) == cold
        warm_seconds.append(time.perf_counter() - started)
    assert min(warm_seconds) < cold_seconds / 10


def test_cache_is_bounded_and_keeps_what_is_used() -> None:
    counter = TokenCounter(None, cache_size=8)
    kept = {"role": "user", "content": "used all the time"}
    for i in range(100):
        counter.count([kept, {"role": "user", "content": f"message {i}"}])
        assert counter.cache_info().size <= 8
    misses = counter.cache_info().misses
    counter.message(kept)
    assert counter.cache_info().misses == misses  # still cached
    counter.message({"role": "user", "content": "message 0"})
    assert counter.cache_info().misses == misses + 1  # long gone


def test_estimate_mode() -> None:
    counter = counter_for("claude-3-5-sonnet")
    assert (counter.mode, counter.name) == ("estimate", "estimate")
    assert [counter.text(t) for t in ("", "abcd", "abcde", "é" * 9)] == [0, 1, 2, 3]
    assert counter.message({"role": "user", "content": "x" * 10}) == 3 + 1 + 3
    assert counter.head("abcdefghij", 2) == "abcdefgh"
    # On real conversations chars/4 lands near the real count.
    messages = trace_history(20_000)
    exact = counter_for("gpt-4o").count(messages)
    assert 0.8 * exact < counter.count(messages) < 1.25 * exact


@pytest.mark.parametrize(
    ("model", "mode", "forced", "expected"),
    [
        ("gpt-4o", "auto", None, "o200k_base"),
        ("openai/gpt-4o-mini", "auto", None, "o200k_base"),
        ("azure/gpt-35-turbo", "auto", None, "cl100k_base"),
        ("gpt-4.1-mini", "auto", None, "o200k_base"),
        ("gpt-5", "auto", None, "o200k_base"),
        ("o3-mini", "auto", None, "o200k_base"),
        ("text-embedding-3-small", "auto", None, "cl100k_base"),
        ("gpt-4-turbo", "auto", None, "cl100k_base"),
        ("claude-3-5-sonnet", "auto", None, "estimate"),
        ("davinci", "auto", None, "estimate"),  # r50k_base does not ship offline
        ("llama-3-70b", "exact", None, "o200k_base"),
        ("gpt-4o", "estimate", None, "estimate"),
        ("mistral-large", "auto", "cl100k_base", "cl100k_base"),
    ],
)
def test_counter_for_picks_the_encoding(
    model: str, mode: Any, forced: str | None, expected: str
) -> None:
    assert counter_for(model, mode, forced).name == expected


def test_counters_are_shared() -> None:
    assert counter_for("gpt-4o") is counter_for("openai/gpt-4o-mini")
    assert counter_for("claude") is counter_for("gpt-4o", "estimate")
    assert counter_for("gpt-4o") is not counter_for("gpt-4")


@settings(max_examples=examples(300), deadline=None)
@given(st.text(), st.integers(min_value=-1, max_value=60))
def test_head_is_a_prefix_within_budget(text: str, tokens: int) -> None:
    for counter in (counter_for("gpt-4o"), counter_for("gpt-4"), counter_for("claude")):
        head = counter.head(text, tokens)
        assert text.startswith(head)
        assert counter.text(head) <= max(tokens, 0)
        # Not needlessly short: at most the byte tokens of one split character are dropped.
        assert counter.text(head) >= min(max(tokens, 0), counter.text(text)) - 3


def test_head_cuts_real_text_at_the_token() -> None:
    counter = counter_for("gpt-4o")
    text = " ".join(m["content"] or "" for m in trace_history(20_000))
    for tokens in (1, 10, 200, 5_000):
        head = counter.head(text, tokens)
        assert text.startswith(head)
        assert counter.text(head) == tokens
    assert counter.head(text, counter.text(text)) == text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
message_fields = st.sampled_from(
    ["role", "content", "name", "tool_calls", "tool_call_id", "function_call", "type", "x"]
)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(message_fields, json_values, max_size=6), json_values)
def test_any_json_is_counted_without_error(message: dict[str, Any], tools: Any) -> None:
    for counter in (counter_for("gpt-4o"), counter_for("claude")):
        assert counter.message(message) >= 3
        assert counter.fixed({"tools": tools, "functions": tools}) >= 3


def test_configure_respects_a_cache_dir_set_by_the_user(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    configure_offline_encodings()
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path)


def test_configure_points_at_litellms_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    configure_offline_encodings()
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    key = hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()
    assert (Path(os.environ["TIKTOKEN_CACHE_DIR"]) / key).is_file()


@pytest.mark.parametrize("installed", [False, True])
def test_configure_names_the_fix_when_files_are_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, installed: bool
) -> None:
    # litellm not installed, or installed without the tokenizer files.
    spec = importlib.machinery.ModuleSpec("litellm", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if installed else None)
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    with pytest.raises(RuntimeError) as raised:
        configure_offline_encodings()
    for fix in ("o200k_base", "pip install litellm", "TIKTOKEN_CACHE_DIR"):
        assert fix in str(raised.value)
    assert "TIKTOKEN_CACHE_DIR" not in os.environ


def offline_run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Python without TIKTOKEN_CACHE_DIR, an empty temp dir and every proxy refusing."""
    env = {k: v for k, v in os.environ.items() if "CACHE_DIR" not in k and "PROXY" not in k.upper()}
    dead = "http://127.0.0.1:9"
    env |= {"TMPDIR": str(tmp_path), "HTTPS_PROXY": dead, "HTTP_PROXY": dead, "NO_PROXY": ""}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.subprocess
def test_tiktoken_alone_cannot_load_here(tmp_path: Path) -> None:
    # The control for the test below: without the fix, the environment really is offline.
    assert offline_run("import tiktoken; tiktoken.get_encoding('o200k_base')", tmp_path).returncode


@pytest.mark.subprocess
def test_counts_offline_without_importing_litellm(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "from proxy.models.tokens import counter_for\n"
        "print(counter_for('gpt-4o').text('tiktoken is great!'), counter_for('gpt-4').name)\n"
        "print('litellm' in sys.modules, os.environ['TIKTOKEN_CACHE_DIR'])\n"
    )
    run = offline_run(code, tmp_path)
    assert run.returncode == 0, run.stderr
    counts, imported = run.stdout.splitlines()
    assert counts == "6 cl100k_base"
    assert imported.startswith("False ") and imported.endswith("litellm_core_utils/tokenizers")
