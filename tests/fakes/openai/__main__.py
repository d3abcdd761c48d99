"""``python -m tests.fakes.openai --port 8001 --window small-8k=8192``: serve until Ctrl-C."""

from __future__ import annotations

from tests.fakes.base import serve_until_interrupted
from tests.fakes.openai.server import FakeUpstream

if __name__ == "__main__":
    serve_until_interrupted(FakeUpstream, "Serve the fake OpenAI upstream until Ctrl-C.", 8001)
