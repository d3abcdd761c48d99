"""Deep and odd JSON: a body nested deeper than the proxy can write back out is a 400 in
OpenAI's shape, never a 500, and the deepest body accepted goes all the way through."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.dialects.json_checks import MAX_DEPTH
from tests.conftest import examples
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread

CHAT = "/v1/chat/completions"

PART = '[{"type": "text", "text": "hi", "x": %s}]'
TOOL = '{"name": "f", "parameters": %s}'
# Where a nested value goes in a chat body, and the level of that place (the body is level 1).
PLACES = {
    "x_extra": (1, lambda v: f'"x_extra": {v}'),
    "metadata": (2, lambda v: f'"metadata": {{"x": {v}}}'),
    "content": (3, lambda v: f'"messages": [{{"role": "user", "content": {v}}}]'),
    "part": (5, lambda v: f'"messages": [{{"role": "user", "content": {PART % v}}}]'),
    "tools": (4, lambda v: f'"tools": [{{"type": "function", "function": {TOOL % v}}}]'),
}
ORJSON_MAX_DEPTH = 1024  # deeper is a parse error
INVALID = ['"\\ud800"', "NaN"]  # a lone surrogate, a bare NaN: not JSON
odd_scalars = st.sampled_from(
    [
        *INVALID,
        *('"x"', "1e308", "-0.0", "18446744073709551616", "-123456789012345678901234567890"),
        *('"\\u0000"', "true", "null", '"' + "é\\n" * 2000 + '"', "{}", "[]"),
    ]
) | st.text(max_size=20).map(json.dumps)


@st.composite
def nested(draw: st.DrawFn) -> tuple[str, int, bool]:
    """JSON text of a scalar inside arrays and objects, its depth, and whether it is valid."""
    depth = draw(st.integers(min_value=0, max_value=1100))
    opens = draw(st.lists(st.sampled_from(["[", '{"k": ']), min_size=depth, max_size=depth))
    leaf = draw(odd_scalars)
    closes = "".join("]" if o == "[" else "}" for o in reversed(opens))
    return "".join(opens) + leaf + closes, depth + (leaf in ("{}", "[]")), leaf not in INVALID


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=nested(), place=st.sampled_from(sorted(PLACES)), long=st.booleans())
def test_deep_or_odd_json_never_gets_a_5xx(
    http: httpx.Client,
    shared_server: ServerThread,
    value: tuple[str, int, bool],
    place: str,
    long: bool,
) -> None:
    text, depth, valid = value
    level, put = PLACES[place]
    history = ""
    if long and place not in ("content", "part"):  # enough to make the proxy compact
        turns = [{"role": r, "content": "long words " * 1500} for r in ("user", "assistant")] * 2
        history = f'"messages": {json.dumps([*turns, {"role": "user", "content": "hi"}])}, '
    body = f'{{"model": "small-8k", {history}{put(text)}}}'.encode()
    response = http.post(
        shared_server.url + CHAT, content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, (body[:300], response.text)
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    too_deep = "nests arrays and objects more than" in response.text
    assert too_deep == (valid and MAX_DEPTH < level + depth <= ORJSON_MAX_DEPTH), response.text


@pytest.mark.parametrize("place", ["x_extra", "tools"])
def test_the_deepest_body_accepted_is_compacted_and_forwarded(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, place: str
) -> None:
    level, put = PLACES[place]
    inner = level + 1  # `{"k": ...}` levels down to an empty object at MAX_DEPTH
    value = '{"k": ' * (MAX_DEPTH - inner) + "{}" + "}" * (MAX_DEPTH - inner)
    turns = [{"role": r, "content": "long words " * 1500} for r in ("user", "assistant")] * 2
    messages = json.dumps([*turns, {"role": "user", "content": "hi"}])
    body = f'{{"model": "small-8k", "messages": {messages}, {put(value)}}}'.encode()
    headers = {"content-type": "application/json", "x-session-id": f"deepest-{place}"}
    response = http.post(server.url + CHAT, content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-action"] == "compacted"
    one_deeper = body.replace(b"{}", b'{"k": {}}', 1)
    refused = http.post(server.url + CHAT, content=one_deeper, headers=headers)
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
