#!/usr/bin/env bash
# Proves the image: builds it, runs it read-only with a mounted config in front of the test
# suite's fake upstream, waits until Docker reports it healthy, sends a chat completion through
# it, checks the x-compaction-* headers, and stops everything. Not part of `make test`.
#
#   scripts/docker-smoke.sh            # after `make test` or `make serve` made .venv
#
# Needs a Docker daemon (DOCKER_HOST is honoured) and the base image `python:3.11-slim`: pulled
# when missing; where no registry answers, `scripts/docker-base.sh` (root, debootstrap) makes it
# from Debian packages. Containers use the host's network (`--network host`), so the proxy
# reaches the fake upstream on 127.0.0.1 and this also works on a daemon started with
# `--bridge=none`, such as `dockerd --host unix:///tmp/docker.sock --bridge=none --iptables=false`.
# Settings: IMAGE (default compaction-proxy:smoke), PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

image=${IMAGE:-compaction-proxy:smoke}
python=${PYTHON:-.venv/bin/python}
name=compaction-proxy-smoke-$$
work=$(mktemp -d)
fake_pid=

cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
  if [ -n "$fake_pid" ]; then kill "$fake_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "docker-smoke: FAILED: $*" >&2
  docker logs "$name" 2>&1 | tail -n 20 >&2 || true
  exit 1
}

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

if ! docker image inspect python:3.11-slim >/dev/null 2>&1 && ! docker pull python:3.11-slim; then
  echo "docker-smoke: no python:3.11-slim base image; make one with scripts/docker-base.sh" >&2
  exit 1
fi
docker build --network host -t "$image" .
size=$(docker image inspect -f '{{.Size}}' "$image")
echo "docker-smoke: built $image, $((size / 1000000)) MB"

upstream_port=$(free_port)
proxy_port=$(free_port)
"$python" -m tests.fakes.openai --port "$upstream_port" --window gpt-4o-mini=128000 \
  >"$work/fake.log" 2>&1 &
fake_pid=$!

cat >"$work/config.yaml" <<EOF
store: {url: "memory://"}
upstreams:
  fake: {base_url: "http://127.0.0.1:$upstream_port/v1"}
EOF
chmod 755 "$work" && chmod 644 "$work/config.yaml"  # readable by the image's uid 10001

docker run -d --name "$name" --network host --read-only --cap-drop ALL --security-opt no-new-privileges \
  -e PORT="$proxy_port" \
  -v "$work/config.yaml:/etc/compaction-proxy/config.yaml:ro" "$image" >/dev/null
[ "$(docker exec "$name" id -u)" = 10001 ] || fail "the container does not run as uid 10001"

# The first health check runs one interval (15 s) after the start.
status=starting
for _ in $(seq 60); do
  status=$(docker inspect -f '{{.State.Health.Status}}' "$name" 2>/dev/null || echo gone)
  [ "$status" = starting ] || break
  sleep 1
done
[ "$status" = healthy ] || fail "health status is $status"
echo "docker-smoke: container healthy on port $proxy_port"

"$python" - "$proxy_port" <<'EOF' || fail "the chat completion did not go through as expected"
import json
import sys
import urllib.request

port = sys.argv[1]
body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello from the smoke test"}]}
request = urllib.request.Request(
    f"http://127.0.0.1:{port}/v1/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer sk-smoke"},
)
with urllib.request.urlopen(request, timeout=30) as response:
    headers = {k.lower(): v for k, v in response.headers.items()}
    answer = json.load(response)
found = {k: v for k, v in headers.items() if k.startswith("x-compaction-")}
print("docker-smoke:", " ".join(f"{k}={v}" for k, v in sorted(found.items())))
assert answer["choices"][0]["message"]["role"] == "assistant", answer
assert found["x-compaction-action"] == "none", found
assert found["x-compaction-store"] == "ok", found
assert len(found["x-compaction-session"]) > 0, found
before, after = int(found["x-compaction-tokens-before"]), int(found["x-compaction-tokens-after"])
assert 0 < before == after, found
assert float(found["x-compaction-overhead-ms"]) >= 0, found
EOF

docker stop "$name" >/dev/null
echo "docker-smoke: OK"
