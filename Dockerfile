# A small image that runs `compaction-proxy serve` on the config baked in (or one mounted at
# /etc/compaction-proxy/config.yaml and named with --config).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY policies ./policies
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LITELLM_LOCAL_MODEL_COST_MAP=True
COPY --from=build /install /usr/local
COPY config.yaml /etc/compaction-proxy/config.yaml
RUN useradd --system --uid 10001 proxy
USER proxy
EXPOSE 8080
# Inside a container the proxy must listen on all interfaces; a config that holds an upstream
# api_key then needs auth.keys (or auth.allow_unauthenticated) or it refuses to start.
ENTRYPOINT ["compaction-proxy", "serve", "--config", "/etc/compaction-proxy/config.yaml", "--host", "0.0.0.0"]
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)" || exit 1
