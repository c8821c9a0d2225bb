"""Model Service probes over the public model APIs. What the real local model server
(`metis models`: an OpenAI embedder and a Cohere-shaped reranker) can answer is probed
against it; the table fakes only what it cannot show: TEI's routes, other models' ids
and dimensions, a plain web site, a busy or malformed answer."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from metis_indexer.models import clients
from metis_operator import probes
from metis_operator.state import Model
from tests.support.model_server import ModelServer, start_model_server

Route = Callable[[httpx.Request], httpx.Response]
URL = "http://model.ns.svc:80"


def server(routes: dict[str, Any]) -> httpx.MockTransport:
    """A fake server: `routes` maps "GET /path" to a JSON body, a status, or a Response."""

    def handle(request: httpx.Request) -> httpx.Response:
        answer = routes.get(f"{request.method} {request.url.path}", 404)
        if isinstance(answer, httpx.Response):
            return answer
        if isinstance(answer, int):
            return httpx.Response(answer, json={"error": "no"})
        return httpx.Response(200, json=answer)

    return httpx.MockTransport(handle)


def probe(kind: str, routes: dict[str, Any] | httpx.MockTransport) -> tuple[Model, str]:
    transport = routes if isinstance(routes, httpx.MockTransport) else server(routes)

    async def run() -> tuple[Model, str]:
        async with httpx.AsyncClient(transport=transport) as client:
            return await getattr(probes, kind)(client, URL)

    return asyncio.run(run())


OPENAI_EMBEDDER = {
    "GET /v1/models": {"data": [{"id": "BAAI/bge-m3", "object": "model"}]},
    "POST /v1/embeddings": {"data": [{"index": 0, "embedding": [0.1] * 1024}]},
}
TEI_RERANKER = {
    "GET /info": {"model_id": "BAAI/bge-reranker-v2-m3", "model_type": {"reranker": {}}},
    "POST /rerank": [{"index": 0, "score": 0.9}],
    "POST /v1/embeddings": 424,
}
TEI_EMBEDDER = {
    "GET /info": {"model_id": "BAAI/bge-small-en-v1.5", "model_type": {"embedding": {}}},
    "POST /v1/embeddings": {"data": [{"index": 0, "embedding": [0.0] * 384}]},
    "POST /rerank": 424,
}
COHERE_RERANKER = {
    "GET /v1/models": {"data": [{"id": "jina-reranker-v2", "object": "model"}]},
    "POST /v1/rerank": {"results": [{"index": 0, "relevance_score": 0.5}]},
}
WEB_SITE = {"GET /": httpx.Response(200, text="<html>wiki</html>", headers={"server": "nginx"})}


@pytest.mark.parametrize(
    ("kind", "routes", "result", "detail"),
    [
        ("embedding", OPENAI_EMBEDDER, Model.AVAILABLE, "serves BAAI/bge-m3 (1024 dimensions)"),
        ("embedding", TEI_EMBEDDER, Model.AVAILABLE, "serves BAAI/bge-small-en-v1.5 (384"),
        (
            "embedding",
            TEI_RERANKER,
            Model.SERVES_ELSE,
            "serves reranker BAAI/bge-reranker-v2-m3, not an embedding model (POST /v1/embeddings "
            "answered HTTP 424)",
        ),
        ("embedding", WEB_SITE, Model.SERVES_ELSE, "answers HTTP (nginx) but serves no model API"),
        (
            "embedding",
            {**OPENAI_EMBEDDER, "POST /v1/embeddings": 503},
            Model.NOT_ANSWERING,
            "POST /v1/embeddings answered HTTP 503",
        ),
        (
            "embedding",
            {**OPENAI_EMBEDDER, "POST /v1/embeddings": {"object": "list"}},
            Model.SERVES_ELSE,
            "answers POST /v1/embeddings in an unknown shape",
        ),
        ("reranker", COHERE_RERANKER, Model.AVAILABLE, "serves jina-reranker-v2"),
        ("reranker", TEI_RERANKER, Model.AVAILABLE, "serves BAAI/bge-reranker-v2-m3"),
        (
            "reranker",
            TEI_EMBEDDER,
            Model.SERVES_ELSE,
            "serves embedding model BAAI/bge-small-en-v1.5, not a reranker (POST /rerank answered "
            "HTTP 424)",
        ),
        (
            "reranker",
            OPENAI_EMBEDDER,
            Model.SERVES_ELSE,
            "serves model BAAI/bge-m3, not a reranker",
        ),
        ("reranker", WEB_SITE, Model.SERVES_ELSE, "serves no model API"),
        ("reranker", {"GET /": 502}, Model.NOT_ANSWERING, "HTTP 502"),
    ],
    ids=[
        "openai-embedder",
        "tei-embedder",
        "reranker-as-embedder",
        "web-as-embedder",
        "embedder-busy",
        "embedder-odd-shape",
        "cohere-reranker",
        "tei-reranker",
        "embedder-as-reranker",
        "openai-embedder-as-reranker",
        "web-as-reranker",
        "gateway-error",
    ],
)
def test_a_probe_says_what_a_service_serves(
    kind: str, routes: dict[str, Any], result: Model, detail: str
) -> None:
    got, said = probe(kind, routes)
    assert got is result
    assert detail in said


def test_the_probe_sends_one_short_input_to_the_named_model() -> None:
    seen: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "e5-large"}]})
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0]}]})

    assert probe("embedding", httpx.MockTransport(handle))[0] is Model.AVAILABLE
    assert seen == [{"input": ["metis probe"], "model": "e5-large", "encoding_format": "float"}]


def test_a_refused_connection_is_said_so() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def run() -> tuple[Model, str]:
        async with httpx.AsyncClient() as client:
            return await probes.embedding(client, f"http://127.0.0.1:{port}")

    assert asyncio.run(run()) == (Model.NOT_ANSWERING, "connection refused")


def test_describe() -> None:
    assert clients.describe(httpx.ReadTimeout("slow")) == "timed out"
    assert clients.describe(httpx.ConnectError("Name or service not known")) == (
        "cannot connect: Name or service not known"
    )


@pytest.fixture(scope="module")
def local_models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("kind", "detail"),
    [
        ("embedding", "serves sentence-transformers/all-MiniLM-L6-v2 (384 dimensions)"),
        ("reranker", "serves sentence-transformers/all-MiniLM-L6-v2"),
    ],
)
def test_the_real_local_server_probes_as_what_it_serves(
    local_models: ModelServer, kind: str, detail: str
) -> None:
    async def run() -> tuple[Model, str]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await getattr(probes, kind)(client, local_models.base_url)

    got, said = asyncio.run(run())
    assert got is Model.AVAILABLE, said
    assert said.startswith(detail), said
