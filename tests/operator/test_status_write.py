"""The one writer of a base's status: the difference written once, only when there is
one, and the Events posted after it, in the order the step asked for them."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from metis_operator import kube
from metis_operator.api import identity
from metis_operator.api.status_types import KnowledgeBaseStatus
from metis_operator.cache import Cache
from metis_operator.context import Context
from metis_operator.metrics import Metrics
from metis_operator.prober import Probers
from metis_operator.settings import load
from metis_operator.status.write import StatusUpdate, apply

BODY = {
    "apiVersion": identity.API_VERSION,
    "kind": "KnowledgeBase",
    "metadata": {"name": "handbook", "namespace": "team", "uid": "u-1"},
}


class Cluster:
    """The API server, as far as a status and Events go: every call, in order."""

    def __init__(self, refuse_events: bool = False) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.refuse_events = refuse_events

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", path, body))
        return body

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("post", path, body))
        if self.refuse_events:
            raise kube.ApiError(403, "forbidden")
        return body


class Base:
    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored = stored
        self.status: dict[str, Any] | None = None

    def previous(self) -> dict[str, Any]:
        return self.status if self.status is not None else self.stored


def run(cluster: Cluster, base: Base, update: StatusUpdate) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient() as http:
            ctx = Context(
                load({}),
                cluster,  # type: ignore[arg-type]
                http,
                Metrics.create(),
                Cache(),
                Probers(http, interval=60, grace=20),
            )
            await apply(ctx, base, update)

    asyncio.run(scenario())


def ready(reason: str) -> KnowledgeBaseStatus:
    return KnowledgeBaseStatus(state="Ready", reason=reason)


def test_the_difference_is_written_then_the_events_in_order() -> None:
    cluster, base = Cluster(), Base({"state": "Indexing", "reason": "reading"})
    update = StatusUpdate(BODY, ready("everything is indexed"))
    update.post("Normal", "Repaired", "Apply", "Deployment metis-handbook repaired")
    update.post("Normal", "Ready", "Reconcile", "everything is indexed")
    run(cluster, base, update)
    (patch, *posts) = cluster.calls
    assert patch == (
        "patch",
        identity.path("team", "handbook") + "/status",
        {"status": {"state": "Ready", "reason": "everything is indexed"}},
    )
    assert [(kind, body["reason"]) for kind, _, body in posts] == [
        ("post", "Repaired"),
        ("post", "Ready"),
    ]
    assert all(path == "/api/v1/namespaces/team/events" for _, path, _ in posts)
    assert base.status == {"state": "Ready", "reason": "everything is indexed"}


def test_an_unchanged_status_is_not_written_but_remembered() -> None:
    stored = {"state": "Ready", "reason": "everything is indexed"}
    cluster, base = Cluster(), Base(stored)
    run(cluster, base, StatusUpdate(BODY, ready("everything is indexed")))
    assert cluster.calls == [] and base.status == stored


def test_without_a_status_only_the_events_go_and_a_refused_one_is_not_raised() -> None:
    cluster, base = Cluster(refuse_events=True), Base({})
    update = StatusUpdate(BODY)
    update.post("Warning", "RequestRefused", "Request", "no evaluation set")
    update.post("Normal", "Reindex", "Reindex", "a pass started")
    run(cluster, base, update)
    assert [call[0] for call in cluster.calls] == ["post", "post"]
    assert base.status is None
