"""Every other /v1/* call relayed untouched; headers that belong to one hop stay on that hop."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import ConfigFactory
from tests.fakes.openai import FakeUpstream
from tests.servers import ServerThread, proxy_server

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
# Hop-by-hop headers of a request, and the end-to-end ones sent along with them.
HOP_REQUEST = {
    "connection": "keep-alive, X-Hop-Secret",
    "x-hop-secret": "only for the next hop",
    "keep-alive": "timeout=5",
    "te": "trailers",
    "upgrade": "example/1",
    "proxy-authorization": "Basic cHJveHk6c2VjcmV0",
    "proxy-connection": "keep-alive",
}
END_TO_END = {"x-end-to-end": "kept", "openai-organization": "org-1"}


def test_sdk_models_and_embeddings_are_the_upstreams(
    server: ServerThread, upstream: FakeUpstream
) -> None:
    def calls(base_url: str) -> tuple[object, ...]:
        with openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
            models = client.models.list().model_dump()
            floats = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
            encoded = client.embeddings.create(
                model="text-embedding-3-small", input="c", encoding_format="base64", dimensions=4
            )
            return models, floats.model_dump(), encoded.model_dump(warnings=False)

    assert calls(server.url + "/v1") == calls(upstream.base_url)
    paths = ["/v1/models", "/v1/embeddings", "/v1/embeddings"]
    assert [r.path for r in upstream.requests] == paths * 2


async def test_async_sdk_embeddings(server: ServerThread, upstream: FakeUpstream) -> None:
    async with openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="sk-test", max_retries=0
    ) as client:
        result = await client.embeddings.create(model="text-embedding-3-small", input="hello")
    assert len(result.data) == 1 and len(result.data[0].embedding) == 8
    assert upstream.requests[-1].json["input"] == "hello"


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
def test_any_method_on_any_path_is_relayed(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, method: str
) -> None:
    path, query = "/v1/xyz/item-1", "limit=2&after=a%20b"
    body = None if method in ("GET", "HEAD", "OPTIONS") else b'{"any": ["body", 1]}'
    direct = http.request(method, f"{upstream.origin}{path}?{query}", content=body)
    proxied = http.request(method, f"{server.url}{path}?{query}", content=body)

    assert proxied.status_code == direct.status_code == 404
    assert proxied.content == direct.content
    if method != "HEAD":
        assert proxied.json()["error"]["message"] == f"Invalid URL ({method} {path})"
    sent, received = upstream.requests
    assert (received.method, received.path) == (method, path)
    assert (received.query, received.body) == (sent.query, sent.body) == (sent.query, body or b"")


def test_compressed_bodies_are_relayed_as_they_are(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream
) -> None:
    direct = http.get(upstream.base_url + "/models")
    headers = {"accept-encoding": "gzip", "x-fake-behavior": "gzip"}
    with http.stream("GET", server.url + "/v1/models", headers=headers) as response:
        raw = b"".join(response.iter_raw())
    assert response.headers["content-encoding"] == "gzip"
    assert gzip.decompress(raw) == direct.content
    assert upstream.requests[-1].headers["accept-encoding"] == "gzip"

    packed = gzip.compress(b'{"model": "text-embedding-3-small", "input": "x"}')
    http.post(
        server.url + "/v1/files",
        content=packed,
        headers={"content-encoding": "gzip", "content-type": "application/json"},
    )
    # The fake inflates what it receives: had the proxy inflated it first, or sent it on
    # without its Content-Encoding, this body would not be the JSON.
    received = upstream.requests[-1]
    assert received.headers["content-encoding"] == "gzip"
    assert received.body == gzip.decompress(packed)


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", CHAT)])
def test_redirects_are_relayed_not_followed(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, method: str, path: str
) -> None:
    body = {"model": "small-8k", "messages": HELLO} if method == "POST" else None
    response = http.request(
        method, server.url + path, json=body, headers={"x-fake-behavior": "redirect"}
    )
    assert response.status_code == 302
    assert response.headers["location"] == f"{upstream.origin}/elsewhere"
    assert [r.path for r in upstream.requests] == [path]


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", CHAT)])
def test_hop_by_hop_request_headers_are_dropped(
    http: httpx.Client, server: ServerThread, upstream: FakeUpstream, method: str, path: str
) -> None:
    body = {"model": "small-8k", "messages": HELLO} if method == "POST" else None
    headers = {**HOP_REQUEST, **END_TO_END}
    response = http.request(method, server.url + path, json=body, headers=headers)
    assert response.status_code == 200
    received = upstream.requests[-1].headers
    for name in HOP_REQUEST:
        if name == "connection":
            assert "x-hop-secret" not in received.get(name, "").lower()
        else:
            assert name not in received, name
    for name, value in END_TO_END.items():
        assert received[name] == value


async def _hop_by_hop_upstream(request: Request) -> Response:
    """An upstream that sends hop-by-hop headers along with its answer."""
    await request.body()
    headers = {
        "connection": "X-Hop-Reply",
        "x-hop-reply": "only for the next hop",
        "keep-alive": "timeout=5, max=100",
        "proxy-authenticate": 'Basic realm="upstream"',
        "trailer": "X-Checksum",
        "x-end-to-end": "kept",
    }
    body = b'{"object": "list", "data": []}'
    return Response(body, headers=headers, media_type="application/json")


@pytest.fixture(scope="module")
def hop_upstream() -> Iterator[ServerThread]:
    routes = [Route("/v1/{path:path}", _hop_by_hop_upstream, methods=["GET", "POST"])]
    with ServerThread(Starlette(routes=routes)) as thread:
        yield thread


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", CHAT)])
def test_hop_by_hop_response_headers_are_dropped(
    http: httpx.Client,
    proxy_config: ConfigFactory,
    hop_upstream: ServerThread,
    method: str,
    path: str,
) -> None:
    config = proxy_config(upstreams={"fake": {"base_url": hop_upstream.url + "/v1"}})
    body = {"model": "small-8k", "messages": HELLO} if method == "POST" else None
    direct = http.request(method, hop_upstream.url + path, json=body)
    assert direct.headers["x-hop-reply"]  # the upstream does send them
    with proxy_server(config) as server:
        response = http.request(method, server.url + path, json=body)
    assert response.status_code == 200
    assert response.content == direct.content
    assert response.headers["x-end-to-end"] == "kept"
    for name in ("x-hop-reply", "keep-alive", "proxy-authenticate", "trailer"):
        assert name not in response.headers, name
    assert "x-hop-reply" not in response.headers.get("connection", "").lower()
