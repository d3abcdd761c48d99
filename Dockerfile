# The proxy as a small image: `compaction-proxy serve` on 0.0.0.0:$PORT with the config at
# /etc/compaction-proxy/config.yaml (the repository's defaults; mount your own over it).
# Runs as uid 10001, writes nothing to its filesystem (fine with a read-only root).
# scripts/docker-smoke.sh builds it and proves it serves; scripts/docker-base.sh makes the base
# image from Debian packages where no registry can be reached.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, hash-pinned from the lock (requirements/), so that a code change reuses
# this layer; then the project itself, with no dependencies of its own.
COPY requirements ./requirements
RUN pip install --require-hashes -r requirements/build.txt -r requirements/runtime.txt
COPY pyproject.toml README.md LICENSE ./
COPY policies ./policies
COPY proxy ./proxy
RUN pip install --no-deps --no-build-isolation . && pip uninstall -y -q pip setuptools

FROM python:3.11-slim
# base-passwd already has a `proxy` user (uid 13): the image's user is `app`, uid 10001.
RUN groupadd --gid 10001 app \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
COPY config.yaml /etc/compaction-proxy/config.yaml
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True PORT=8080
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 8080
# Inside a container the proxy listens on all interfaces: a config that holds an upstream
# api_key then needs auth.keys (or auth.allow_unauthenticated) or it refuses to start.
# Arguments given to `docker run` are added (a later --config wins).
ENTRYPOINT ["/bin/sh", "-c", "exec compaction-proxy serve --config /etc/compaction-proxy/config.yaml --host 0.0.0.0 --port \"$PORT\" \"$@\"", "compaction-proxy"]
HEALTHCHECK --start-period=20s --interval=15s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ['PORT']}/healthz\", timeout=2)"]
