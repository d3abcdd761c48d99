"""Where a model's window came from: every response says so, and a guessed one is logged once."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.conftest import ConfigFactory
from tests.servers import proxy_server

CHAT = "/v1/chat/completions"


def window_source(http: httpx.Client, url: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = http.post(url + CHAT, json=body)
    assert response.status_code == 200, response.text
    return response.headers["x-compaction-window-source"]


def test_each_response_says_where_the_window_came_from(
    http: httpx.Client, proxy_config: ConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    config = proxy_config(models=[{"match": "small-8k", "context_window": 8192}])
    with (
        proxy_server(config) as server,
        caplog.at_level(logging.WARNING, logger="compaction_proxy"),
    ):
        assert window_source(http, server.url, "small-8k") == "config"
        assert window_source(http, server.url, "gpt-4o-mini") == "model-map"
        assert window_source(http, server.url, "no-such-model-xyz") == "default"
        assert window_source(http, server.url, "no-such-model-xyz") == "default"
    guessed = [r for r in caplog.records if "default_context_window used" in r.getMessage()]
    assert [r.__dict__["model"] for r in guessed] == ["no-such-model-xyz"]  # once per model
