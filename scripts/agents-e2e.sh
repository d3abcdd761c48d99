#!/usr/bin/env bash
# The real agent clients end to end through the proxy: Codex CLI and Claude Code run their tool
# loop through `compaction-proxy serve` in front of the test suite's fakes, and a report says
# what the proxy did (docs/agents-e2e.md). Opt-in: not part of `make test`.
#
#   scripts/agents-e2e.sh                       # both clients, 30 tool calls each (~1 minute)
#   scripts/agents-e2e.sh --client claude --subagent-at 10 --fixtures tests/data/clients
#
# Installs both clients from the npm registry into .agents/ (git-ignored, ~800 MB with their
# native binaries) at the versions below unless they are there, then runs
# bench/agent_clients.py with the options given. Needs npm (Node.js 20 or later).
# Settings: CODEX_VERSION, CLAUDE_CODE_VERSION, AGENTS_PREFIX (.agents), PYTHON (.venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

codex_version=${CODEX_VERSION:-0.171.0}
claude_version=${CLAUDE_CODE_VERSION:-2.1.332}
prefix=${AGENTS_PREFIX:-.agents}
python=${PYTHON:-.venv/bin/python}

installed() {  # the version of an npm package in the prefix, or nothing
  "$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' \
    "$prefix/node_modules/$1/package.json" 2>/dev/null || true
}

if [ "$(installed @openai/codex)" != "$codex_version" ] ||
  [ "$(installed @anthropic-ai/claude-code)" != "$claude_version" ]; then
  command -v npm >/dev/null ||
    { echo "agents-e2e: npm is needed to install the clients (Node.js 20 or later)" >&2; exit 1; }
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
    "@openai/codex@$codex_version" "@anthropic-ai/claude-code@$claude_version"
fi
echo "codex: $("$prefix/node_modules/.bin/codex" --version); claude: $("$prefix/node_modules/.bin/claude" --version)"
exec "$python" bench/agent_clients.py --clients "$prefix/node_modules/.bin" "$@"
