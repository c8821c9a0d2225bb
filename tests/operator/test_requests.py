"""The user's requests to the indexer carry the base's API token when it has one."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import pytest

from metis_operator import indexer_client, kube
from metis_operator.cache import Cache
from metis_operator.children import Owner
from metis_operator.context import Context
from metis_operator.metrics import Metrics
from metis_operator.prober import Probers
from metis_operator.settings import load

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
            settings = load({"METIS_URL_TEMPLATE": "http://{name}.{namespace}:{port}"})
            ctx = Context(
                settings,
                cluster,  # type: ignore[arg-type]
                http,
                Metrics.create(),
                Cache(),
                Probers(http, interval=60, grace=20),
            )
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
