"""Probes of model Services over their public model APIs: does the Service answer,
and does it serve what the base needs (an embedding model, a reranker)?

A probe asks the server what it serves (`metis_indexer.models.clients.discover`), then
calls the one endpoint the base will use, with a two-word input. The outcome is
Available (it answered that call as it should), NotAnswering (no connection, a
timeout, a server error: it may come back, the base Waits) or ServesSomethingElse
(it answered, but not in that role: the base Fails, and the detail says what the
Service serves instead).
"""

from __future__ import annotations

from typing import Any

import httpx

from metis_indexer.models import clients
from metis_operator.state import Model

PROBE_TEXT = "metis probe"
_KIND_WORDS = {
    "embedding": "embedding model",
    "rerank": "reranker",
    "reranker": "reranker",
    "classifier": "classifier",
}


def _what(info: clients.ModelInfo) -> str:
    words = list(dict.fromkeys(_KIND_WORDS[k] for k in info.kinds if k in _KIND_WORDS))
    return f"{' and '.join(words) or 'model'} {info.id}"


def _unavailable(status: int) -> bool:
    """An answer that says "not now" rather than "not this"."""
    return status in (408, 429) or (status >= 500 and status != 501)


async def _discover(client: httpx.AsyncClient, url: str) -> clients.ModelInfo | tuple[Model, str]:
    try:
        return await clients.discover(client, url)
    except clients.ModelUnavailable:
        pass
    try:
        answer = await client.get(f"{url}/")
    except httpx.HTTPError as e:
        return Model.NOT_ANSWERING, clients.describe(e)
    if _unavailable(answer.status_code):
        return Model.NOT_ANSWERING, f"HTTP {answer.status_code}"
    server = answer.headers.get("server")
    said = f" ({server})" if server else ""
    return Model.SERVES_ELSE, (
        f"answers HTTP{said} but serves no model API: neither GET /v1/models nor GET /info "
        "names a model"
    )


async def embedding(client: httpx.AsyncClient, url: str) -> tuple[Model, str]:
    """Whether `url` serves an embedding model, and what it serves."""
    info = await _discover(client, url)
    if isinstance(info, tuple):
        return info
    body = {"input": [PROBE_TEXT], "model": info.id, "encoding_format": "float"}
    try:
        answer = await client.post(f"{url}/v1/embeddings", json=body)
    except httpx.HTTPError as e:
        return Model.NOT_ANSWERING, clients.describe(e)
    if _unavailable(answer.status_code):
        return Model.NOT_ANSWERING, f"POST /v1/embeddings answered HTTP {answer.status_code}"
    if not answer.is_success:
        return Model.SERVES_ELSE, (
            f"serves {_what(info)}, not an embedding model (POST /v1/embeddings answered "
            f"HTTP {answer.status_code})"
        )
    try:
        dimensions = len(answer.json()["data"][0]["embedding"])
    except (ValueError, KeyError, IndexError, TypeError):
        return Model.SERVES_ELSE, (
            f"serves {_what(info)}, which answers POST /v1/embeddings in an unknown shape"
        )
    return Model.AVAILABLE, f"serves {info.id} ({dimensions} dimensions)"


async def _rerank_call(client: httpx.AsyncClient, url: str) -> tuple[str, httpx.Response]:
    """The Cohere/Jina route, else TEI's, as `RerankClient` tries them."""
    cohere: dict[str, Any] = {"query": PROBE_TEXT, "documents": [PROBE_TEXT], "top_n": 1}
    answer = await client.post(f"{url}/v1/rerank", json=cohere)
    if answer.status_code not in (404, 405):
        return "POST /v1/rerank", answer
    tei = {"query": PROBE_TEXT, "texts": [PROBE_TEXT]}
    return "POST /rerank", await client.post(f"{url}/rerank", json=tei)


async def reranker(client: httpx.AsyncClient, url: str) -> tuple[Model, str]:
    """Whether `url` serves a reranker, and what it serves."""
    info = await _discover(client, url)
    if isinstance(info, tuple):
        return info
    try:
        route, answer = await _rerank_call(client, url)
    except httpx.HTTPError as e:
        return Model.NOT_ANSWERING, clients.describe(e)
    if _unavailable(answer.status_code):
        return Model.NOT_ANSWERING, f"{route} answered HTTP {answer.status_code}"
    if not answer.is_success:
        return Model.SERVES_ELSE, (
            f"serves {_what(info)}, not a reranker ({route} answered HTTP {answer.status_code})"
        )
    try:
        body = answer.json()
        results = body["results"] if isinstance(body, dict) else body
        float(results[0]["relevance_score" if isinstance(body, dict) else "score"])
    except (ValueError, KeyError, IndexError, TypeError):
        return Model.SERVES_ELSE, f"serves {_what(info)}, which answers {route} in an unknown shape"
    return Model.AVAILABLE, f"serves {info.id}"
