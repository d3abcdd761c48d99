"""litellm stays offline: from its import to its answers in every API (chat completions,
Messages, Responses), the only connections a process with an upstream of kind litellm attempts
are to the configured provider (and the test's own to the proxy). Every attempt is recorded by
an audit hook in a fresh process, below any library: each `socket.connect` and each name
lookup, whether it would have succeeded or not."""

from __future__ import annotations

import json

import pytest

from tests.litellm_fakes import python

pytestmark = [pytest.mark.litellm, pytest.mark.subprocess]

PROBE = """
import json, sys

attempts = []

def record(event, args):
    if event == "socket.connect":
        attempts.append(["connect", list(args[1])[:2] if isinstance(args[1], tuple) else args[1]])
    elif event == "socket.getaddrinfo":
        attempts.append(["lookup", args[0]])

sys.addaudithook(record)

from anthropic import Anthropic
import openai
from proxy.server.app import create_app
from proxy.server.runner import server_config
from tests.litellm_fakes import CLAUDE, GEMINI, litellm_config
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.gemini import FakeGemini
from tests.servers import ServerThread

from proxy.upstream.litellm_setup import load_litellm

load_litellm()  # under the hook too, but ahead of the server's start-up deadline
with FakeAnthropic(windows={CLAUDE: 8192}) as anthropic, FakeGemini() as gemini:
    config = litellm_config(anthropic, gemini)
    app = create_app(config)
    # asyncio's own loop: its connections go through socket.connect, which the hook sees.
    serving = server_config(app, config, loop="asyncio")
    with ServerThread(app, serving, ready=lambda: app.state.proxy.limits.warm) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
        sdk = Anthropic(base_url=proxy.url, api_key="sk-client", max_retries=0)
        for model in (CLAUDE, GEMINI):  # every API the proxy serves, through litellm
            messages = [{"role": "user", "content": "Hello"}]
            client.chat.completions.create(model=model, messages=messages)
            for _ in client.chat.completions.create(model=model, messages=messages, stream=True):
                pass
            client.responses.create(model=model, input="Hello")
            for _ in client.responses.create(model=model, input="Hello", stream=True):
                pass
            sdk.messages.create(model=model, max_tokens=50, messages=messages)
            with sdk.messages.stream(model=model, max_tokens=50, messages=messages) as stream:
                stream.get_final_message()
        ports = {"proxy": proxy.port, "anthropic": anthropic.port, "gemini": gemini.port}
print(json.dumps({"attempts": attempts, "ports": ports}))
"""


def test_no_connection_but_to_the_configured_providers() -> None:
    result = python(PROBE, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    ports = report["ports"]
    connects = [tuple(a[1]) for a in report["attempts"] if a[0] == "connect"]
    lookups = {a[1] for a in report["attempts"] if a[0] == "lookup"}
    allowed = {("127.0.0.1", port) for port in ports.values()}
    assert set(connects) <= allowed, set(connects) - allowed
    assert lookups <= {"127.0.0.1", "localhost"}, lookups
    # The hook saw litellm reach both providers: a test that cannot fail proves nothing.
    assert ("127.0.0.1", ports["anthropic"]) in connects
    assert ("127.0.0.1", ports["gemini"]) in connects
