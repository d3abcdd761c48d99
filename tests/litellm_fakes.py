"""Two providers that are not OpenAI-compatible, and the proxy in front of both through
upstreams of kind litellm: the strict fakes of Anthropic Messages and of Gemini on loopback."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from proxy.config import Config, loads
from tests.conftest import merged
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.servers import ServerThread, proxy_server

ANTHROPIC_KEY = "sk-ant-key-of-the-tests-0123456789"
GEMINI_KEY = "gk-key-of-the-tests-0123456789"
CLAUDE = "claude-small"  # unknown to litellm's map: the proxy counts by estimate
GEMINI = "gemini-2.5-flash"  # known to it: litellm sends the system prompt as Gemini's own
WINDOW = 8192


def litellm_config(anthropic: FakeAnthropic, gemini: FakeGemini, **sections: Any) -> Config:
    """Chat completions for claude-* go to the Anthropic fake, for gemini-* to the Gemini
    fake, both through litellm, at an 8k window; `sections` are merged in."""
    data = {
        "upstreams": {
            "claude": {
                "kind": "litellm",
                "provider_model": "anthropic/{model}",
                "base_url": anthropic.base_url,
                "api_key": ANTHROPIC_KEY,
            },
            "gemini": {
                "kind": "litellm",
                "provider_model": "gemini/{model}",
                "base_url": gemini.base_url,
                "api_key": GEMINI_KEY,
            },
        },
        "default_upstream": "claude",
        "models": [
            {"match": "claude-*", "upstream": "claude", "context_window": WINDOW},
            {"match": "gemini-*", "upstream": "gemini", "context_window": WINDOW},
        ],
    }
    return loads(yaml.safe_dump(merged(data, sections)))


@dataclasses.dataclass
class Providers:
    anthropic: FakeAnthropic
    gemini: FakeGemini
    proxy: ServerThread
    sdk: openai.OpenAI

    def client(self) -> openai.OpenAI:
        """The OpenAI SDK pointed at the proxy, with a key of its own (never forwarded)."""
        return self.sdk

    def reset(self) -> None:
        self.anthropic.reset()
        self.anthropic.behavior, self.anthropic.api_key = "", ANTHROPIC_KEY
        self.gemini.reset()


@contextlib.contextmanager
def providers(**sections: Any) -> Iterator[Providers]:
    """Both fakes, and the proxy in front of them (`sections` merged into its config)."""
    anthropic = FakeAnthropic(windows={CLAUDE: WINDOW}, api_key=ANTHROPIC_KEY)
    gemini = FakeGemini(windows={GEMINI: WINDOW}, api_key=GEMINI_KEY)
    with anthropic, gemini:
        config = litellm_config(anthropic, gemini, **sections)
        with proxy_server(config) as proxy:
            url = proxy.url + "/v1"
            with openai.OpenAI(base_url=url, api_key="sk-client-key", max_retries=0) as sdk:
                yield Providers(anthropic, gemini, proxy, sdk)


def fixtures() -> tuple[Any, Any]:
    """A test module's fixtures: `shared`, the fakes and the proxy for the whole module, and
    `p`, the same with nothing recorded and their default behaviour, for each test."""

    @pytest.fixture(scope="module")
    def shared() -> Iterator[Providers]:
        with providers() as found:
            yield found

    @pytest.fixture
    def p(shared: Providers) -> Providers:
        shared.reset()
        return shared

    return shared, p


def python(code: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`code` run by a fresh interpreter from the repository, without proxy settings from the
    environment (what it connects to must be its own doing)."""
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "PYTHONPATH": str(root)},
    )
