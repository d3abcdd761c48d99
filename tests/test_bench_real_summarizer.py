"""The retention benches' `--summarizer-url/--summarizer-model` (bench/real_summarizer.py): the
summaries come from the endpoint given, through the proxy's own summarizer config, and its key
is read from the environment, never written in the bench's text. A fake upstream on loopback
stands in for the real model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from agent_model import extractive_summary
from loop_summaries import APIS, config
from real_summarizer import RealSummarizer

import policies
from proxy.config import loads
from tests.fakes.openai import FakeUpstream, is_summary_request

MODEL = "stand-in-model"
FACT = "FACT-07: the build cache key is 9f3a1c2e."


async def test_retention_summaries_come_from_the_endpoint_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SUMMARIZER_API_KEY", "sk-stand-in")
    with FakeUpstream(summarizer=extractive_summary) as endpoint:
        real = RealSummarizer(f"{endpoint.origin}/v1", MODEL)
        async with real.summarizer() as summarize:
            request = policies.SummaryRequest(
                previous=None,
                evicted=[{"role": "tool", "tool_call_id": "c1", "content": f"log\n{FACT}\nend"}],
                max_tokens=500,
                instructions=None,
            )
            summary = await summarize(request)
        asked = [r for r in endpoint.requests if is_summary_request(r.headers, r.json)]
    assert FACT in summary
    assert [r.json["model"] for r in asked] == [MODEL]
    assert asked[0].headers["authorization"] == "Bearer sk-stand-in"


def test_loop_summaries_config_names_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUMMARIZER_API_KEY", "sk-stand-in")
    with FakeUpstream() as conversation, FakeUpstream() as endpoint:
        real = RealSummarizer(f"{endpoint.origin}/v1", MODEL)
        for api in APIS:
            text = config(api, conversation, None, real)
            assert "sk-stand-in" not in text
            parsed = loads(text)
            settings = parsed.policies["default"].summarizer
            assert settings.model == MODEL
            assert settings.upstream is not None
            chosen = parsed.upstreams[settings.upstream]
            assert (chosen.base_url, chosen.api_key) == (real.url, "sk-stand-in")
            assert parsed.upstreams[parsed.default_upstream].base_url == conversation.base_url
