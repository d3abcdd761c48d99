"""The fake Gemini API refuses what the real one refuses: a test through it means something."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.fakes.gemini import FakeGemini

KEY = "gk-fake"
USER = {"role": "user", "parts": [{"text": "Weather in Paris?"}]}
CALL = {"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {"city": "P"}}}]}
RESULT = {"role": "user", "parts": [{"functionResponse": {"name": "weather", "response": {}}}]}


@pytest.fixture(scope="module")
def up() -> Iterator[FakeGemini]:
    with FakeGemini(windows={"small": 64}, api_key=KEY) as fake:
        yield fake


def post(up: FakeGemini, body: Any, model: str = "gemini-2.5-flash", **headers: str) -> Any:
    url = f"{up.base_url}/models/{model}:generateContent"
    response = httpx.post(url, json=body, headers={"x-goog-api-key": KEY, **headers})
    return response.status_code, orjson.loads(response.content)


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        ([], "contents is not specified"),
        ([{"role": "system", "parts": [{"text": "x"}]}], "valid role"),
        ([{"role": "user", "parts": []}], "must not be empty"),
        ([{"role": "user", "parts": [{"text": "x", "inlineData": {}}]}], "oneof field 'data'"),
        ([USER, RESULT], "function response turn comes immediately after a function call"),
        ([USER, CALL, USER], "the number of function response parts"),
        ([{**USER, "parts": [{"txt": "x"}]}], 'Unknown name "txt"'),
        ([USER, {**CALL, "role": "user"}], "function call turn comes immediately after"),
    ],
)
def test_invalid_requests_are_refused(up: FakeGemini, contents: Any, message: str) -> None:
    status, body = post(up, {"contents": contents})
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    assert message in body["error"]["message"]


def test_a_tool_round_trip_in_either_spelling(up: FakeGemini) -> None:
    tools = [{"function_declarations": [{"name": "weather", "parameters": {"type": "object"}}]}]
    status, body = post(
        up,
        {
            "contents": [USER],
            "tools": tools,
            "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
        },
    )
    assert status == 200
    assert body["candidates"][0]["content"]["parts"][0]["functionCall"]["name"] == "weather"
    status, body = post(up, {"contents": [USER, CALL, RESULT], "tools": tools})
    assert status == 200 and body["candidates"][0]["finishReason"] == "STOP"
    assert body["usageMetadata"]["promptTokenCount"] > 0


def test_keys_window_and_output_cap(up: FakeGemini) -> None:
    assert post(up, {"contents": [USER]}, **{"x-goog-api-key": ""})[0] == 403
    status, body = post(up, {"contents": [USER]}, **{"x-goog-api-key": "wrong"})
    assert (status, body["error"]["message"]) == (
        400,
        "API key not valid. Please pass a valid API key.",
    )
    long = {"role": "user", "parts": [{"text": "word " * 200}]}
    status, body = post(up, {"contents": [long]}, model="small")
    assert (
        status == 400
        and "exceeds the maximum number of tokens allowed (64)" in body["error"]["message"]
    )
    status, body = post(up, {"contents": [USER], "generationConfig": {"maxOutputTokens": 2}})
    assert body["candidates"][0]["finishReason"] == "MAX_TOKENS"
