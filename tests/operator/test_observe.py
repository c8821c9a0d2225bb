"""Readings of the API server's JSON: the newest pod, a rollout, a failed replica set,
workloads scaled to zero, a model Service's port."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from metis_operator import observe
from metis_operator.api import identity
from metis_operator.state import PodView


def pod(
    name: str,
    created: str,
    *,
    node: str | None = None,
    phase: str = "Pending",
    conditions: list[dict[str, Any]] | None = None,
    deleting: bool = False,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:10:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if containers:
        status["containerStatuses"] = containers
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


READY = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]


@pytest.mark.parametrize(
    ("pods", "view"),
    [
        ([], None),
        (
            [pod("a", "1", node="n", phase="Running", conditions=READY)],
            PodView("a", node="n", running=True, ready=True),
        ),
        (
            [
                pod(
                    "a",
                    "1",
                    conditions=[
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/1 nodes",
                        }
                    ],
                )
            ],
            PodView("a", unschedulable="0/1 nodes"),
        ),
        (
            [pod("old", "1", node="n", phase="Running", deleting=True), pod("new", "2", node="m")],
            PodView("new", node="m"),
        ),
        (
            [pod("old", "1", node="n", phase="Running", deleting=True)],
            PodView("old", node="n", running=True, terminating=True),
        ),
        (
            [
                pod(
                    "a",
                    "1",
                    node="n",
                    containers=[
                        {
                            "state": {
                                "waiting": {"reason": "ImagePullBackOff", "message": "not found"}
                            }
                        }
                    ],
                )
            ],
            PodView("a", node="n", waiting="ImagePullBackOff: not found"),
        ),
        (
            [pod("a", "1", node="n", phase="Failed")],
            PodView("a", node="n", waiting="the pod failed"),
        ),
    ],
    ids=["none", "running", "unschedulable", "newest-live", "only-going", "image-pull", "failed"],
)
def test_pod_view(pods: list[dict[str, Any]], view: PodView | None) -> None:
    assert observe.pod_view(pods) == view


NOW = dt.datetime(2026, 12, 1, 2, 0, 30, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("ready", "seconds"),
    [
        ({"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T02:00:18Z"}, 12.0),
        ({"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T02:00:31Z"}, 0.0),
        ({"type": "Ready", "status": "True", "lastTransitionTime": "yesterday"}, None),
        ({"type": "Ready", "status": "True"}, None),
        ({"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-01T02:00:18Z"}, None),
    ],
    ids=["ready-12-s-ago", "clock-behind", "unreadable", "no-time", "not-ready"],
)
def test_how_long_ago_the_pod_turned_ready(ready: dict[str, Any], seconds: float | None) -> None:
    view = observe.pod_view([pod("a", "1", node="n", phase="Running", conditions=[ready])], NOW)
    assert view is not None and view.ready_seconds == seconds


def deployment(revision: str, generation: int, observed: int, updated: int) -> dict[str, Any]:
    return {
        "metadata": {
            "generation": generation,
            "annotations": {"deployment.kubernetes.io/revision": revision},
        },
        "spec": {"replicas": 1},
        "status": {"observedGeneration": observed, "updatedReplicas": updated},
    }


@pytest.mark.parametrize(
    ("dep", "pods", "expected"),
    [
        (None, [], False),
        (deployment("1", 1, 0, 0), [], False),  # the first rollout is not a replacement
        (deployment("2", 2, 2, 0), [], True),
        (deployment("2", 3, 2, 1), [], True),
        (deployment("2", 2, 2, 1), [], False),
        (deployment("1", 1, 1, 1), [pod("a", "1", deleting=True)], True),
    ],
    ids=[
        "no-deployment",
        "first",
        "old-pod-gone-new-not-made",
        "not-observed",
        "done",
        "pod-going",
    ],
)
def test_replacing(dep: dict[str, Any] | None, pods: list[dict[str, Any]], expected: bool) -> None:
    assert observe.replacing(dep, pods) is expected


def test_pod_failure() -> None:
    dep = {
        "status": {
            "conditions": [
                {"type": "ReplicaFailure", "status": "True", "message": "exceeded quota"}
            ]
        }
    }
    assert observe.pod_failure(dep) == "exceeded quota"
    assert observe.pod_failure({"status": {}}) is None and observe.pod_failure(None) is None


def test_scaled_to_zero_behind_a_selector() -> None:
    def workload(kind: str, name: str, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "kind": kind,
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": labels}}},
        }

    workloads = [
        workload("Deployment", "bge", 0, {"app": "bge", "tier": "model"}),
        workload("StatefulSet", "bge-sts", 0, {"app": "bge"}),
        workload("Deployment", "bge-live", 1, {"app": "bge"}),
        workload("Deployment", "other", 0, {"app": "other"}),
    ]
    assert observe.scaled_to_zero({"app": "bge"}, workloads) == [
        "Deployment bge",
        "StatefulSet bge-sts",
    ]
    assert observe.scaled_to_zero({}, workloads) == []


def test_claims_and_revisions() -> None:
    claim = {"metadata": {"annotations": {identity.REVISION: " r2 "}}, "status": {"phase": "Bound"}}
    assert observe.claim_bound(claim) and observe.revision(claim) == "r2"
    unlisted = {"metadata": {"annotations": {identity.REVISION: ""}}, "status": {"phase": "Bound"}}
    assert observe.from_data_source(unlisted) and not observe.revision(unlisted)
    assert not observe.from_data_source({"metadata": {}})
    assert not observe.claim_bound({"status": {"phase": "Pending"}})
    assert not observe.claim_bound(None)


@pytest.mark.parametrize(
    ("ports", "port"),
    [
        ([{"port": 8080}], 8080),
        ([{"name": "grpc", "port": 9000}, {"name": "http", "port": 80}], 80),
        ([], 80),
    ],
    ids=["first", "named-http", "none"],
)
def test_service_port(ports: list[dict[str, Any]], port: int) -> None:
    assert observe.service_port({"spec": {"ports": ports}}) == port
