"""The user's requests to the indexer carry the base's API token when it has one."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import pytest

from metis_operator import indexer_client, kube
from metis_operator.children import Owner
from tests.operator.answers import STARTED
from tests.operator.contexts import context

OWNER = Owner("handbook", "team", "u-1")


class Secrets:
    """The API server, as far as Secrets go."""

    def __init__(self, secret: dict[str, Any] | None, status: int = 200) -> None:
        self.secret, self.status = secret, status
        self.paths: list[str] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        self.paths.append(path)
        if self.status != 200:
            raise kube.ApiError(self.status, "forbidden")
        return self.secret


def ask(cluster: Secrets) -> httpx.Request:
    seen: list[httpx.Request] = []

    def indexer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json={"accepted": True})

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(indexer)) as http:
            ctx = context(http, cluster)
            await indexer_client.reindex(ctx, OWNER, full=True)

    asyncio.run(scenario())
    (request,) = seen
    return request


def test_the_token_of_the_bases_secret_is_sent() -> None:
    cluster = Secrets({"data": {"token": base64.b64encode(b"t0ken").decode()}})
    request = ask(cluster)
    assert request.headers["authorization"] == "Bearer t0ken"
    assert str(request.url) == "http://metis-handbook.team:7700/v1/reindex"
    assert cluster.paths == ["/api/v1/namespaces/team/secrets/metis-handbook"]


@pytest.mark.parametrize(
    ("secret", "status"), [(None, 200), (None, 403)], ids=["no-secret", "not-allowed-to-read-it"]
)
def test_no_header_without_a_token(secret: dict[str, Any] | None, status: int) -> None:
    assert "authorization" not in ask(Secrets(secret, status)).headers


def poll(answers: list[dict[str, Any]], *, replaced: bool) -> tuple[Any, str | None, int]:
    """`indexer_client.status` against a Service whose answers come in this order (the
    last repeated): what it read, why not, and how many requests it made. Mocked: which
    endpoint kube-proxy picks in the moment it still routes to a stopping pod cannot be
    made to happen on purpose on a real node."""
    asked: list[httpx.Request] = []

    def service(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json=answers[min(len(asked), len(answers)) - 1])

    async def scenario() -> tuple[Any, str | None]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(service)) as http:
            ctx = context(http, Secrets(None))
            return await indexer_client.status(ctx, OWNER, replaced=replaced)

    indexer_client.STOPPING_PAUSE, pause = 0.0, indexer_client.STOPPING_PAUSE
    try:
        answer, error = asyncio.run(scenario())
    finally:
        indexer_client.STOPPING_PAUSE = pause
    return answer, error, len(asked)


OLD = {**STARTED, "phase": "ready", "generation": 2, "documents": 12, "stopping": True}
NEW = {**STARTED, "phase": "ready", "generation": 3, "documents": 13}


def test_a_replaced_bases_status_is_its_replacements_not_the_stopping_pods() -> None:
    answer, error, asked = poll([OLD, OLD, NEW], replaced=True)
    assert (answer.generation, answer.documents, error, asked) == (3, 13, None, 3)


def test_only_the_stopping_pod_answering_is_said_not_read_as_the_base() -> None:
    answer, error, asked = poll([OLD], replaced=True)
    assert answer is None and asked == indexer_client.STOPPING_TRIES
    assert error == (
        "only its stopping pod answered through its Service (5 tries): "
        "the Service does not reach its replacement yet"
    )


def test_a_stopping_pod_with_no_replacement_ready_is_the_base() -> None:
    answer, _, asked = poll([OLD, NEW], replaced=False)
    assert (answer.generation, answer.stopping, asked) == (2, True, 1)
