"""A new generation of a base is said in its status before its children are applied:
while a hundred bases change at once, each change shows in the time of one write, not
of three (bench/results/operator-kwok.md)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx

from metis_operator import handlers
from tests.operator.contexts import context

SPEC = {"embedding": {"deployment": "bge-m3"}, "sources": [{"drive": "docs"}]}
MODEL = {
    "/v1/models": {"data": [{"id": "BAAI/bge-m3", "object": "model"}]},
    "/v1/embeddings": {"data": [{"index": 0, "embedding": [0.1] * 8}]},
}


class Writes:
    """The API server as far as one base's turn writes: every write in order. A
    stand-in: the order of a turn's writes is the point, and a real API server's
    watches do not order writes to two kinds against each other."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        """The base itself (it still exists); no other object (a Secret is created)."""
        return body(1, "") if "/knowledgebases/" in path else None

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((f"create {manifest['kind']}", manifest))
        return manifest

    async def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((f"apply {manifest['kind']}", manifest))
        return manifest

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("status" if path.endswith("/status") else f"patch {path}", patch))
        return patch

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("event", body))
        return body


def answer(request: httpx.Request) -> httpx.Response:
    found = MODEL.get(request.url.path)
    return httpx.Response(200, json=found) if found else httpx.Response(404)


def body(generation: int, prefix: str) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    spec["embedding"]["query_prefix"] = prefix
    meta = {"name": "handbook", "namespace": "team", "uid": "u-1", "generation": generation}
    return {"metadata": meta, "spec": spec}


def test_a_new_generation_is_written_before_its_children_and_once() -> None:
    cluster = Writes()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            ctx = context(http, cluster)
            ctx.cache.seen("services", {"metadata": {"name": "bge-m3", "namespace": "team"}})
            ctx.cache.seen(
                "persistentvolumeclaims", {"metadata": {"name": "docs", "namespace": "team"}}
            )
            runner = handlers.Runner(ctx)
            base = handlers.Base(("team", "handbook"), body(1, "a: "))
            await runner.reconcile(base, "change")
            cluster.writes.clear()
            base.body = body(2, "b: ")
            await runner.reconcile(base, "change")

    asyncio.run(scenario())
    kinds = [kind for kind, _ in cluster.writes]
    statuses = [w for kind, w in cluster.writes if kind == "status"]
    assert statuses and statuses[0]["status"]["observedGeneration"] == 2, kinds
    assert kinds.index("status") < kinds.index("apply ConfigMap"), kinds
    assert len(statuses) == 1, "the turn's status after applying is what it said before"
