"""The drift check: the cache against one LIST per kind, and the bases it wakes."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from metis_operator import cache, children, drift, handlers
from metis_operator.cache import CHILD_PLURAL
from tests.operator.contexts import context

OURS = {"app.kubernetes.io/managed-by": "metis-operator"}


@pytest.fixture(autouse=True)
def settle_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "DRIFT_SETTLE_SECONDS", 0.01)


def child(name: str, base: str, version: str, ns: str = "team", **labels: str) -> dict[str, Any]:
    meta_labels = {**OURS, "app.kubernetes.io/instance": base, **labels}
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "resourceVersion": version,
            "labels": meta_labels,
        }
    }


def test_only_the_operators_children_of_a_base_count() -> None:
    drive = {"metadata": {"name": "docs", "namespace": "team", "resourceVersion": "3"}}
    other = child("x", "handbook", "4", **{"app.kubernetes.io/managed-by": "helm"})
    mine = child("metis-handbook", "handbook", "5")
    assert drift.seen("ConfigMap", [drive, other, mine]) == {
        ("ConfigMap", "team", "metis-handbook"): ("5", ("team", "handbook"))
    }


@pytest.mark.parametrize(
    ("listed", "cached", "bases"),
    [
        ([child("metis-a", "a", "1")], [child("metis-a", "a", "1")], set()),
        ([child("metis-a", "a", "2")], [child("metis-a", "a", "1")], {("team", "a")}),
        ([child("metis-a", "a", "1")], [], {("team", "a")}),
        ([], [child("metis-a", "a", "1")], {("team", "a")}),
        (
            [child("metis-a", "a", "1"), child("metis-b", "b", "7", ns="wiki")],
            [child("metis-a", "a", "1"), child("metis-b", "b", "6", ns="wiki")],
            {("wiki", "b")},
        ),
    ],
    ids=["same", "newer-version", "missed-creation", "missed-deletion", "one-of-two"],
)
def test_drifted_bases(
    listed: list[dict[str, Any]], cached: list[dict[str, Any]], bases: set[tuple[str, str]]
) -> None:
    assert drift.drifted(drift.seen("Service", listed), drift.seen("Service", cached)) == bases


def test_the_same_name_in_two_kinds_is_two_children() -> None:
    listed = drift.seen("Service", [child("metis-a", "a", "1")])
    listed |= drift.seen("ConfigMap", [child("metis-a", "a", "2")])
    cached = drift.seen("Service", [child("metis-a", "a", "1")])
    cached |= drift.seen("ConfigMap", [child("metis-a", "a", "2")])
    assert drift.drifted(listed, cached) == set()


class Lists:
    """The API server, as far as LISTs go. A stand-in: a watch that missed an event, the
    one case this check is for, cannot be made to happen on a real API server."""

    def __init__(self, items: dict[str, list[dict[str, Any]]]) -> None:
        self.items = items
        self.asked: list[tuple[str, str, dict[str, str]]] = []

    async def call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.asked.append((method, path, kw["query"]))
        return {"items": self.items.get(path, [])}


def runner(cluster: Lists, cached: dict[str, list[dict[str, Any]]], env: dict[str, str]) -> Any:
    ctx = context(cluster=cluster, env=env)
    for kind in CHILD_PLURAL:
        for o in cached.get(kind, []):
            ctx.cache.seen(CHILD_PLURAL[kind], o)
    return handlers.Runner(ctx)


def test_one_list_a_kind_finds_the_bases_whose_children_changed_unseen() -> None:
    config = child("metis-a", "a", "1")
    cluster = Lists(
        {
            "/api/v1/configmaps": [config, child("metis-b", "b", "9")],
            "/apis/apps/v1/deployments": [child("metis-a", "a", "3")],
        }
    )
    cached = {
        "ConfigMap": [config, child("metis-b", "b", "8")],
        "Deployment": [child("metis-a", "a", "3")],
        "Service": [child("metis-c", "c", "2")],  # deleted while the watch was away
    }
    found = asyncio.run(runner(cluster, cached, {}).drifted())
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
    found = runner(
        cluster, {"ConfigMap": [child("metis-a", "a", "4"), child("metis-b", "b", "8")]}, {}
    )

    async def scenario() -> set[tuple[str, str]]:
        checking = asyncio.ensure_future(found.drifted())
        while not cluster.asked:
            await asyncio.sleep(0)
        # The watch brings metis-a's new version (and then a newer one) meanwhile.
        found.ctx.cache.seen("configmaps", child("metis-a", "a", "5"))
        found.ctx.cache.seen("configmaps", child("metis-a", "a", "6"))
        return await checking

    assert asyncio.run(scenario()) == {("team", "b")}


def test_a_namespaced_operator_lists_each_namespace_it_serves() -> None:
    cluster = Lists({})
    asyncio.run(runner(cluster, {}, {"METIS_NAMESPACES": "team,wiki"}).drifted())
    paths = [path for _, path, _ in cluster.asked]
    assert len(paths) == 12
    assert paths[:2] == [
        "/api/v1/namespaces/team/persistentvolumeclaims",
        "/api/v1/namespaces/wiki/persistentvolumeclaims",
    ]


def test_a_drifted_base_reads_afresh_once_and_a_full_resync_comes_in_its_time() -> None:
    r = runner(Lists({}), {}, {"METIS_FULL_RESYNC_SECONDS": "3600"})
    base = handlers.Base(("team", "a"), {})
    assert not r.resync_due(base)
    base.drifted = True
    assert r.resync_due(base) and not r.resync_due(base)
    base.resynced -= 3600
    assert r.resync_due(base) and not r.resync_due(base)


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

    monkeypatch.setattr(handlers, "PRIME_RETRY_SECONDS", 0.0)
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
        runner = handlers.Runner(ctx)
        await handlers.prime(ctx, runner)
        started = set(runner.bases)
        assert runner.bases[("team", "a")].body["kind"] == "KnowledgeBase"
        runner.forget(("team", "a"))
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


def test_the_same_version_of_a_base_again_does_not_wake_it() -> None:
    """kopf's listing brings again every base the startup LIST started: at 1,000 bases,
    a second turn for each while the new leader derives them."""

    async def scenario() -> list[bool]:
        runner = handlers.Runner(context(cluster=Lists({}), env={}))
        woken = []
        for body in (base_body("1"), base_body("1"), base_body("2", metadata__generation=2)):
            runner.seen(body, deleted=False)
            base = runner.bases[("team", "a")]
            woken.append(base.wake.is_set())
            base.wake.clear()
        runner.forget(("team", "a"))
        return woken

    assert asyncio.run(scenario()) == [True, False, True]


def base_body(version: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": "a",
            "namespace": "team",
            "resourceVersion": version,
            "generation": 1,
            "annotations": {"team": "search"},
        },
        "spec": {"drives": ["docs"]},
        "status": {"state": "Ready"},
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = body
        for p in parents:
            node = node[p]
        node[last] = value
    return body


@pytest.mark.parametrize(
    ("changes", "wakes"),
    [
        ({"status": {"state": "Starting"}}, False),
        ({"metadata__managedFields": [{"manager": "metis-operator"}]}, False),
        (
            {
                "metadata__annotations": {
                    "team": "search",
                    f"{handlers.KOPF_PREFIX}/last-handled-configuration": "{}",
                }
            },
            False,
        ),
        ({"spec": {"drives": ["docs", "wiki"]}, "metadata__generation": 2}, True),
        ({"metadata__annotations": {"team": "search", "metis.astraeus.io/paused": "true"}}, True),
        ({"metadata__labels": {"tier": "gold"}}, True),
        ({"metadata__deletionTimestamp": "2026-12-06T00:00:00Z"}, True),
    ],
)
def test_what_in_a_base_tells_its_loop_news(changes: dict[str, Any], wakes: bool) -> None:
    assert handlers.tells_news(base_body("1"), base_body("2", **changes)) is wakes


def test_a_base_is_not_woken_by_its_own_status_write() -> None:
    """Each status write comes back as a watch event: no turn for it."""

    async def scenario() -> list[bool]:
        runner = handlers.Runner(context(cluster=Lists({}), env={}))
        woken = []
        bodies = [
            base_body("1"),
            base_body("2", status={"state": "Starting"}),
            base_body("3", spec={"drives": ["wiki"]}, metadata__generation=2),
        ]
        for body in bodies:
            runner.seen(body, deleted=False)
            base = runner.bases[("team", "a")]
            woken.append(base.wake.is_set())
            base.wake.clear()
        assert base.body["metadata"]["resourceVersion"] == "3"
        runner.forget(("team", "a"))
        return woken

    assert asyncio.run(scenario()) == [True, False, True]


def test_a_childs_event_wakes_the_bases_it_concerns_but_the_one_whose_apply_it_brings_back() -> (
    None
):
    """The turn that applied a child saw the apply's answer: its watch event is no news to
    that base (a turn that found nothing, two a change), though still to a base reading it
    by name."""

    async def scenario() -> list[set[tuple[str, str]]]:
        ctx = context(cluster=Lists({}), env={})
        runner = handlers.Runner(ctx)
        mine, reader = ("team", "a"), ("team", "b")
        runner.dependents.set(mine, cache.Deps("team"))
        runner.dependents.set(reader, cache.Deps("team", services=frozenset({"metis-a"})))
        woken: list[set[tuple[str, str]]] = []
        runner.wake = lambda keys: woken.append(set(keys))  # type: ignore[method-assign]
        memo = kopf.Memo(context=ctx, runner=runner)
        follow = handlers._follower("services")
        labels = {"app.kubernetes.io/name": children.APP}
        service = child("metis-a", "a", "7", **labels)
        ctx.cache.written("services", service, mine)
        await follow(event={"type": "MODIFIED"}, body=service, memo=memo)
        later = child("metis-a", "a", "8", **labels)
        await follow(event={"type": "MODIFIED"}, body=later, memo=memo)
        return woken

    assert asyncio.run(scenario()) == [{("team", "b")}, {("team", "a"), ("team", "b")}]
