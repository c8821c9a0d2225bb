"""What the operator watches: the cache filled by one LIST a kind before any watch, the
kinds watched by label narrowed by the API server, and the drift check's LISTs against
the cache."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from kopf import Resource

from metis_operator import cache, runner, watching
from metis_operator.cache import CHILD_PLURAL
from metis_operator.context import Context
from tests.operator.contexts import context
from tests.operator.test_drift import child


@pytest.fixture(autouse=True)
def settle_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watching, "DRIFT_SETTLE_SECONDS", 0.01)


class Lists:
    """The API server, as far as LISTs go. A stand-in: a watch that missed an event, the
    one case this check is for, cannot be made to happen on a real API server."""

    def __init__(self, items: dict[str, list[dict[str, Any]]]) -> None:
        self.items = items
        self.asked: list[tuple[str, str, dict[str, str]]] = []

    async def call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.asked.append((method, path, kw["query"]))
        return {"items": self.items.get(path, [])}


def cached(
    cluster: Lists, objects: dict[str, list[dict[str, Any]]], env: dict[str, str]
) -> Context:
    """A context whose cache holds `objects` (by kind), over this API server."""
    ctx = context(cluster=cluster, env=env)
    for kind in CHILD_PLURAL:
        for o in objects.get(kind, []):
            ctx.cache.seen(CHILD_PLURAL[kind], o)
    return ctx


def test_one_list_a_kind_finds_the_bases_whose_children_changed_unseen() -> None:
    config = child("metis-a", "a", "1")
    cluster = Lists(
        {
            "/api/v1/configmaps": [config, child("metis-b", "b", "9")],
            "/apis/apps/v1/deployments": [child("metis-a", "a", "3")],
        }
    )
    objects = {
        "ConfigMap": [config, child("metis-b", "b", "8")],
        "Deployment": [child("metis-a", "a", "3")],
        "Service": [child("metis-c", "c", "2")],  # deleted while the watch was away
    }
    found = asyncio.run(watching.drifted(cached(cluster, objects, {})))
    assert found == {("team", "b"), ("team", "c")}
    assert [path for _, path, _ in cluster.asked] == [
        "/api/v1/persistentvolumeclaims",
        "/api/v1/services",
        "/apis/apps/v1/deployments",
        "/api/v1/configmaps",
        "/apis/networking.k8s.io/v1/networkpolicies",
        "/apis/policy/v1/poddisruptionbudgets",
    ]
    assert {q["labelSelector"] for _, _, q in cluster.asked} == {
        "app.kubernetes.io/managed-by=metis-operator"
    }


def test_a_child_the_watch_brings_while_the_lists_run_is_no_drift() -> None:
    """While 100 bases changed at once, a LIST a moment ahead of the watch made 57 bases
    read their children afresh; a child no event changed meanwhile still counts."""
    cluster = Lists(
        {
            "/api/v1/configmaps": [child("metis-a", "a", "5"), child("metis-b", "b", "9")],
        }
    )
    ctx = cached(
        cluster, {"ConfigMap": [child("metis-a", "a", "4"), child("metis-b", "b", "8")]}, {}
    )

    async def scenario() -> set[tuple[str, str]]:
        checking = asyncio.ensure_future(watching.drifted(ctx))
        while not cluster.asked:
            await asyncio.sleep(0)
        # The watch brings metis-a's new version (and then a newer one) meanwhile.
        ctx.cache.seen("configmaps", child("metis-a", "a", "5"))
        ctx.cache.seen("configmaps", child("metis-a", "a", "6"))
        return await checking

    assert asyncio.run(scenario()) == {("team", "b")}


def test_a_namespaced_operator_lists_each_namespace_it_serves() -> None:
    cluster = Lists({})
    asyncio.run(watching.drifted(cached(cluster, {}, {"METIS_NAMESPACES": "team,wiki"})))
    paths = [path for _, path, _ in cluster.asked]
    assert len(paths) == 12
    assert paths[:2] == [
        "/api/v1/namespaces/team/persistentvolumeclaims",
        "/api/v1/namespaces/wiki/persistentvolumeclaims",
    ]


def test_the_cache_is_filled_and_the_bases_started_by_one_list_a_kind_before_any_watch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new leader derives each base from a whole cache without waiting for kopf's
    watches; a LIST that fails is tried again, for nothing may run on a half-filled
    cache."""

    class Flaky(Lists):
        async def call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            answer = await super().call(method, path, **kw)
            if len(self.asked) == 1:
                raise OSError("connection refused")
            return answer

    monkeypatch.setattr(watching, "PRIME_RETRY_SECONDS", 0.0)
    pod = child("metis-a-x", "a", "4", **{"app.kubernetes.io/name": "metis-indexer"})
    base = {"metadata": {"name": "a", "namespace": "team", "resourceVersion": "5"}}
    cluster = Flaky(
        {
            "/api/v1/configmaps": [child("metis-a", "a", "1")],
            "/api/v1/pods": [pod],
            "/apis/metis.astraeus.io/v1/knowledgebases": [base],
        }
    )
    ctx = context(cluster=cluster, env={})

    async def scenario() -> set[tuple[str, str]]:
        loops = runner.Runner(ctx)
        await watching.prime(ctx, loops)
        started = set(loops.bases)
        assert loops.bases[("team", "a")].body["kind"] == "KnowledgeBase"
        loops.forget(("team", "a"))
        return started

    assert asyncio.run(scenario()) == {("team", "a")}, "its loop starts from the LIST"
    paths = [path for _, path, _ in cluster.asked]
    assert paths[0] == paths[1], "the failed LIST is tried again"
    assert len(paths) == len(cache.WATCHED) + 2
    assert paths[-1] == "/apis/metis.astraeus.io/v1/knowledgebases"
    selectors = {path: q.get("labelSelector") for _, path, q in cluster.asked}
    assert selectors["/api/v1/pods"] == "app.kubernetes.io/name=metis-indexer"
    assert selectors["/api/v1/services"] is None, "a model Service may be anyone's"
    config = ctx.cache.configmap("team", "metis-a")
    assert config is not None and config["kind"] == "ConfigMap"
    assert [p["metadata"]["name"] for p in ctx.cache.pods("team", "a")] == ["metis-a-x"]


def test_the_kinds_watched_by_label_are_narrowed_by_the_api_server() -> None:
    settings = kopf.OperatorSettings()
    watching.narrow_watches(settings)
    selectors = settings.watching.label_selectors

    def asked(group: str, plural: str, kind: str) -> list[str]:
        resource = Resource(group, "v1", plural, kind=kind, namespaced=True)
        return list(selectors.collect(resource))

    assert asked("", "pods", "Pod") == ["app.kubernetes.io/name=metis-indexer"]
    assert asked("", "configmaps", "ConfigMap") == ["app.kubernetes.io/managed-by=metis-operator"]
    assert asked("policy", "poddisruptionbudgets", "PodDisruptionBudget") == [
        "app.kubernetes.io/managed-by=metis-operator"
    ]
    # Drives, model Services and their workloads are read by name: never narrowed.
    assert asked("", "services", "Service") == asked("apps", "deployments", "Deployment") == []
